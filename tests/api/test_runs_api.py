"""The service end to end over real HTTP (uvicorn on loopback), on SQLite and on Postgres."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import update

from actuator.models import DecisionRow, ObservationRow, PolicyRow, RunRow
from actuator.store import Store, hash_token

POLICY = {
    "name": "drift-lr",
    "controllers": [{
        "name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
        "kp": 1.0, "ki": 0.2,
    }],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]


def register(url: str, **extra) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"name": "t", "policy": POLICY, "knobs": KNOBS, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def post(url: str, run: dict, observations: list[dict], token: str | None = None, **kw) -> httpx.Response:
    tok = token if token is not None else run["token"]
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    return httpx.post(f"{url}/v1/runs/{run['id']}/observations", json={"observations": observations, **kw},
                      headers=headers)


def counts(db: str) -> tuple[int, int, int, int]:
    s = Store(db)
    try:
        return tuple(s.count(t) for t in (PolicyRow, RunRow, ObservationRow, DecisionRow))  # type: ignore[return-value]
    finally:
        s.close()


def test_closed_loop_over_http(service, database_url):
    run = register(service.url)
    assert run["state"] == "running" and run["token"].startswith("act_")
    assert run["policy_version"] == 1

    # The first observation starts the controller bumplessly: no change.
    r = post(service.url, run, [{"seq": 0, "step": 5, "probes": {"kl_drift": 0.1}, "knobs": {"learning_rate": 1e-3}}])
    assert r.status_code == 200, r.text
    assert r.json()["decisions"] == [] and r.json()["accepted"] == 1
    # Drift rises far above the setpoint: the PID lowers the learning rate (direct acting).
    r = post(service.url, run, [{"seq": 1, "step": 10, "probes": {"kl_drift": 0.2}, "knobs": {"learning_rate": 1e-3}}])
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == 1 and body["duplicates"] == 0
    assert len(body["decisions"]) == 1
    d = body["decisions"][0]
    assert d["knob"] == "learning_rate" and d["number"] == 1 and d["step"] == 11
    assert d["new_value"] < d["old_value"] == pytest.approx(1e-3)
    # the rate limit of the knob holds: at most x e^-0.5 per decision
    assert d["new_value"] >= 1e-3 * 0.6065 - 1e-12
    assert body["knobs"]["learning_rate"] == pytest.approx(d["new_value"])
    assert "kl_drift" in d["reason"] and d["inputs"]["setpoint"] == 0.1

    # the same observation again: idempotent on (run, seq); the decision is re-sent until acked
    r = post(service.url, run, [{"seq": 1, "step": 10, "probes": {"kl_drift": 0.2}}])
    assert r.json()["accepted"] == 0 and r.json()["duplicates"] == 1
    assert [x["number"] for x in r.json()["decisions"]] == [1]
    r = post(service.url, run, [{"seq": 1, "step": 10, "probes": {"kl_drift": 0.2}}], last_decision=1)
    assert r.json()["decisions"] == []

    state = httpx.get(f"{service.url}/v1/runs/{run['id']}").json()
    assert state["decisions"] == 1 and state["last_step"] == 10 and state["last_seq"] == 1
    assert state["latest_probes"] == {"kl_drift": 0.2}
    assert state["knobs"]["learning_rate"]["value"] == pytest.approx(d["new_value"])
    assert "drift" in state["controllers"] and state["controllers"]["drift"]["pid"]["updates"] >= 1

    page = httpx.get(f"{service.url}/v1/runs/{run['id']}/decisions").json()
    assert page["total"] == 1 and page["items"][0]["id"] == d["id"]

    runs = httpx.get(f"{service.url}/v1/runs", params={"state": "running"}).json()
    assert [x["id"] for x in runs] == [run["id"]]

    # what is stored: one observation, one decision, the token only as its hash
    store = Store(database_url)
    try:
        obs = store.list_observations(run["id"])
        assert [(o.seq, o.step, o.probes) for o in obs] == [(0, 5, {"kl_drift": 0.1}), (1, 10, {"kl_drift": 0.2})]
        row = store.get_run(run["id"])
        assert row.token_hash == hash_token(run["token"]) and run["token"] not in json.dumps(row.run_metadata)
    finally:
        store.close()


def test_same_inline_policy_reuses_version_and_edit_makes_new_one(service):
    a, b = register(service.url), register(service.url)
    assert a["policy_version"] == b["policy_version"] == 1
    edited = {**POLICY, "description": "edited"}
    r = httpx.post(f"{service.url}/v1/runs", json={"policy": edited, "knobs": KNOBS})
    assert r.status_code == 201 and r.json()["policy_version"] == 2
    by_name = httpx.post(f"{service.url}/v1/runs", json={"policy": "drift-lr@1", "knobs": KNOBS})
    assert by_name.status_code == 201 and by_name.json()["policy_version"] == 1


BAD_OBSERVATIONS = [
    ("NaN probe", '{"observations": [{"seq": 1, "step": 1, "probes": {"kl_drift": NaN}}]}', "probes.kl_drift"),
    ("inf metric", '{"observations": [{"seq": 1, "step": 1, "metrics": {"loss": Infinity}}]}', "metrics.loss"),
    ("negative step", '{"observations": [{"seq": 1, "step": -1}]}', "step"),
    ("negative seq", '{"observations": [{"seq": -3, "step": 1}]}', "seq"),
    ("empty batch", '{"observations": []}', "observations"),
    ("not json", "{observations: ", "body"),
    ("wrong type", '{"observations": [{"seq": "x", "step": 1}]}', "seq"),
    ("unknown field", '{"observations": [{"seq": 1, "step": 1, "bogus": 1}]}', "bogus"),
    ("bad name", '{"observations": [{"seq": 1, "step": 1, "probes": {"drop table;": 1}}]}', "probes"),
    ("repeated seq", '{"observations": [{"seq": 1, "step": 1}, {"seq": 1, "step": 2}]}', "sequence"),
]


@pytest.mark.parametrize("label,body,field", BAD_OBSERVATIONS, ids=[b[0] for b in BAD_OBSERVATIONS])
def test_bad_observations_are_refused_and_store_nothing(service, database_url, label, body, field):
    run = register(service.url)
    before = counts(database_url)
    r = httpx.post(f"{service.url}/v1/runs/{run['id']}/observations", content=body,
                   headers={"Authorization": f"Bearer {run['token']}", "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert field in r.text
    assert counts(database_url) == before


def test_auth_and_unknown_run(service, database_url):
    run, other = register(service.url), register(service.url)
    before = counts(database_url)
    ok_obs = [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.5}}]
    r = post(service.url, run, ok_obs, token="")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert post(service.url, run, ok_obs, token=other["token"]).status_code == 403
    assert post(service.url, run, ok_obs, token="act_not-a-token").status_code == 403
    r = post(service.url, {"id": "no-such-run", "token": run["token"]}, ok_obs)
    assert r.status_code == 404 and "no-such-run" in r.text
    assert httpx.get(f"{service.url}/v1/runs/no-such-run").status_code == 404
    assert counts(database_url) == before


def test_a_remembered_token_is_checked_again_on_the_locked_run(service, database_url):
    """The service remembers a verified agent token (no run lookup per post), but the ingest
    checks it again on the run row it locks: a token changed behind its back is refused."""
    run = register(service.url)
    assert post(service.url, run, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}}]).status_code == 200
    store = Store(database_url)
    try:
        with store.session() as s:  # a rotation, another replica, an operator: not this process
            s.execute(update(RunRow).where(RunRow.id == run["id"]).values(token_hash=hash_token("act_rotated")))
    finally:
        store.close()
    before = counts(database_url)
    r = post(service.url, run, [{"seq": 1, "step": 2, "probes": {"kl_drift": 0.1}}])
    assert r.status_code == 403, r.text
    assert counts(database_url) == before
    r = post(service.url, run, [{"seq": 1, "step": 2, "probes": {"kl_drift": 0.1}}], token="act_rotated")
    assert r.status_code == 200 and r.json()["accepted"] == 1


def test_bad_registration_names_the_field_and_stores_nothing(service, database_url):
    before = counts(database_url)
    cases = [
        ({"policy": POLICY, "knobs": [{**KNOBS[0], "min": 1.0, "max": 0.1}]}, "min"),
        ({"policy": POLICY, "knobs": [{**KNOBS[0], "value": 5.0}]}, "outside its bounds"),
        ({"policy": POLICY, "knobs": [{**KNOBS[0], "name": "kl_beta"}]}, "controllers.0.knob"),
        ({"policy": {**POLICY, "controllers": [{**POLICY["controllers"][0], "kp": -1}]}, "knobs": KNOBS},
         "controllers.0.kp"),
        ({"policy": {**POLICY, "controllers": [{**POLICY["controllers"][0], "probe": "vibes"}]}, "knobs": KNOBS},
         "unknown probe"),
        ({"policy": "no-such-policy", "knobs": KNOBS}, "no-such-policy"),
    ]
    for body, needle in cases:
        r = httpx.post(f"{service.url}/v1/runs", json=body)
        assert r.status_code == 422, (body, r.text)
        assert needle in r.text, (needle, r.text)
    assert counts(database_url) == before


def test_health_docs_and_metrics(service):
    assert httpx.get(f"{service.url}/healthz").json()["status"] == "ok"
    spec = httpx.get(f"{service.url}/openapi.json").json()
    assert "/v1/runs/{run_id}/observations" in spec["paths"]
    assert httpx.get(f"{service.url}/docs").status_code == 200
    run = register(service.url)
    post(service.url, run, [{"seq": 0, "step": 3, "probes": {"kl_drift": 0.3}, "knobs": {"learning_rate": 1e-3}}])
    text = httpx.get(f"{service.url}/metrics").text
    assert f'actuator_probe_value{{probe="kl_drift",run="{run["id"]}"}} 0.3' in text
    assert "actuator_observations_ingested_total 1.0" in text
