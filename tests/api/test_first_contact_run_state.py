"""Issue 36: a run's state says which probes the probe-time budget starves, and which knob values
are in effect once the agent has acknowledged decisions newer than its last observation. Over
real HTTP (uvicorn on loopback), on SQLite and on Postgres."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent / "hardening"))
from harden import post_obs, register  # noqa: E402

POLICY = {"name": "first-contact", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                    "setpoint": 0.1, "kp": 1.0, "ki": 0.2}]}


def _run(url: str, run_id: str) -> dict:
    r = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def _listed(url: str, run_id: str) -> dict:
    return next(r for r in httpx.get(f"{url}/v1/runs", timeout=10).json() if r["id"] == run_id)


def test_starved_probes_come_from_the_latest_probe_report(service):
    url = service.url
    quiet = register(url, policy=POLICY, name="quiet")
    run = register(url, policy=POLICY, name="starving")
    # A probe report (it carries probe_share) in which policy_kl was skipped twice for budget.
    report = {"probe_share": 0.31, "probe_seconds.kl_drift": 0.2, "probe_starved.policy_kl": 2.0}
    r = post_obs(url, run, [{"seq": 0, "step": 10, "probes": {"kl_drift": 0.1}, "metrics": report}])
    assert r.status_code == 200, r.text
    r = post_obs(url, quiet, [{"seq": 0, "step": 10, "probes": {"kl_drift": 0.1}, "metrics": {"probe_share": 0.05}}])
    assert r.status_code == 200, r.text
    assert _run(url, run["id"])["starved"] == ["policy_kl"]
    assert _listed(url, run["id"])["starved"] == ["policy_kl"]
    assert _run(url, quiet["id"])["starved"] == [] and _listed(url, quiet["id"])["starved"] == []

    # Training metrics between probe reports change nothing: the latest probe report still says so.
    r = post_obs(url, run, [{"seq": 1, "step": 11, "metrics": {"train.loss": 1.5}}])
    assert r.status_code == 200, r.text
    assert _run(url, run["id"])["starved"] == ["policy_kl"]

    # The next probe report has policy_kl running again and kl_drift starved: that is what shows,
    # though the run's merged latest metrics still hold policy_kl's old count.
    report = {"probe_share": 0.12, "probe_seconds.policy_kl": 9.0, "probe_starved.kl_drift": 1.0}
    r = post_obs(url, run, [{"seq": 2, "step": 20, "probes": {"policy_kl": 0.3}, "metrics": report}])
    assert r.status_code == 200, r.text
    state = _run(url, run["id"])
    assert state["latest_metrics"]["probe_starved.policy_kl"] == 2.0
    assert state["starved"] == ["kl_drift"]

    # A report with nothing starved clears it.
    r = post_obs(url, run, [{"seq": 3, "step": 30, "probes": {"kl_drift": 0.1}, "metrics": {"probe_share": 0.09}}])
    assert r.status_code == 200, r.text
    assert _run(url, run["id"])["starved"] == [] and _listed(url, run["id"])["starved"] == []


def test_knobs_in_effect_follow_the_agent_acknowledgements(service):
    url = service.url
    run = register(url, policy=POLICY)
    r = post_obs(url, run, [{"seq": 0, "step": 10, "probes": {"kl_drift": 0.1}, "knobs": {"learning_rate": 1e-3}}])
    assert r.status_code == 200, r.text
    r = post_obs(url, run, [{"seq": 1, "step": 20, "probes": {"kl_drift": 0.5}, "knobs": {"learning_rate": 1e-3}}])
    assert r.status_code == 200, r.text
    (decision,) = r.json()["decisions"]
    assert decision["step"] == 21 and decision["new_value"] < 1e-3

    # The agent applies it after step 21 and says so on a repeat of its last observation (what its
    # sender does when no new observation is due): no observation carries the new value yet.
    applied = float(f"{decision['new_value']:.6g}")
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                   json={"observations": [{"seq": 1, "step": 20, "probes": {"kl_drift": 0.5},
                                           "knobs": {"learning_rate": 1e-3}}],
                         "last_decision": decision["number"],
                         "applied": [{"number": decision["number"], "status": "applied", "step": 21,
                                      "value": applied}]}, timeout=10)
    assert r.status_code == 200 and r.json()["duplicates"] == 1, r.text
    assert _run(url, run["id"])["knobs_in_effect"] == {"learning_rate": applied}

    # An observation at a later step reports what is in effect itself: it wins over the acknowledgement.
    r = post_obs(url, run, [{"seq": 2, "step": 30, "probes": {"kl_drift": 0.5}, "knobs": {"learning_rate": 2e-4}}],
                 last_decision=decision["number"])
    assert r.status_code == 200, r.text
    assert _run(url, run["id"])["knobs_in_effect"] == {"learning_rate": 2e-4}
