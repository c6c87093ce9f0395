"""A policy is checked against the knobs it will drive (issue 17, break 2): a combination whose
law cannot run is refused at registration, at a policy move and by ``validate`` with ``knobs``,
naming the field, and stores nothing; a stored one that slipped through never makes an
observation a 500. Over real HTTP, on SQLite and on Postgres."""

from __future__ import annotations

import httpx
import pytest

from actuator.models import EventRow, PolicyRow, RunRow
from actuator.store import Store

LR = {"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}
LAMBDA = {"name": "distill_lambda", "value": 0.5, "min": 0.0, "max": 1.0, "scale": "linear"}
DROPOUT = {"name": "custom.mix", "value": 0.5, "min": 0.2, "max": 0.8, "scale": "linear"}
SIGNED = {"name": "custom.w", "value": 0.0, "min": -1.0, "max": 1.0, "scale": "linear"}


def _policy(name: str, knob: str, **controller) -> dict:
    return {"name": name, "controllers": [{"name": "c", "probe": "kl_drift", "knob": knob, "setpoint": 0.1,
                                           "kp": 1.0, "ki": 0.2, **controller}]}


# (policy, the run's knob, the field the error must name)
BAD = [
    pytest.param(_policy("disjoint", "learning_rate", min=0.1, max=0.2), LR, "controllers.0.min", id="disjoint-bounds"),
    pytest.param(_policy("log-at-zero", "distill_lambda", scale="log"), LAMBDA, "controllers.0.scale", id="log-min-0"),
    pytest.param(_policy("no-integer", "custom.mix", scale="integer"), DROPOUT, "controllers.0.scale", id="no-integer"),
    pytest.param(_policy("neg-multiplier", "custom.w", kind="constraint"), SIGNED, "controllers.0.min",
                 id="constraint-below-0"),
]


def _counts(db: str) -> tuple[int, int]:
    s = Store(db)
    try:
        return s.count(PolicyRow), s.count(RunRow)
    finally:
        s.close()


@pytest.mark.parametrize("policy, knob, field", BAD)
def test_unusable_policies_are_refused_before_anything_is_stored(service, database_url, policy, knob, field):
    url = service.url
    # validate: the document alone is valid; against the knobs it is not
    r = httpx.post(f"{url}/v1/policies/validate", json=policy)
    assert r.status_code == 200 and r.json() == {"valid": True, "errors": []}
    r = httpx.post(f"{url}/v1/policies/validate", json={**policy, "knobs": [knob]})
    assert r.status_code == 200, r.text
    assert r.json()["valid"] is False and [e["loc"] for e in r.json()["errors"]] == [field], r.text
    # registration: 422 naming the field, nothing stored
    r = httpx.post(f"{url}/v1/runs", json={"name": "bad", "policy": policy, "knobs": [knob]})
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["detail"]["errors"]] == [f"body.policy.{field}"]
    assert _counts(database_url) == (0, 0)
    # move-policy: a live run under a usable policy cannot be moved onto it
    good = _policy(f"good-{policy['name']}", knob["name"], min=None, max=None, scale=None)
    run = httpx.post(f"{url}/v1/runs", json={"name": "ok", "policy": good, "knobs": [knob]}).json()
    stored = httpx.post(f"{url}/v1/policies", json=policy)
    assert stored.status_code == 201, stored.text
    r = httpx.post(f"{url}/v1/runs/{run['id']}/policy", json={"policy": policy["name"]})
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["detail"]["errors"]] == [f"body.policy.{field}"]
    assert httpx.get(f"{url}/v1/runs/{run['id']}").json()["policy_name"] == good["name"]
    # simulate: the run's observations through the unusable policy is a 422 too, never a 500
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                   json={"observations": [{"seq": s, "step": s, "probes": {"kl_drift": 0.1 * s}} for s in range(4)]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{url}/v1/policies/simulate", json={"policy": policy["name"], "run_id": run["id"]})
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["detail"]["errors"]] == [f"body.policy.{field}"]
    r = httpx.post(f"{url}/v1/policies/simulate", json={"policy": good["name"], "run_id": run["id"]})
    assert r.status_code == 200, r.text


def test_validate_refuses_malformed_knobs_naming_the_field(service):
    r = httpx.post(f"{service.url}/v1/policies/validate",
                   json={**_policy("v", "learning_rate"), "knobs": [{**LR, "min": 1.0}]})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["errors"][0]["loc"].startswith("body.knobs.0")
    r = httpx.post(f"{service.url}/v1/policies/validate", json={**_policy("v", "learning_rate"), "knobs": []})
    assert r.json()["valid"] is False and r.json()["errors"][0]["loc"] == "controllers.0.knob"


def test_a_stored_unusable_policy_is_reported_never_a_500(service, database_url):
    """A run stored before validation knew the knobs (written straight into the store here): its
    observations are stored and answered 200; the controller is reported unusable once."""
    url = service.url
    run = httpx.post(f"{url}/v1/runs", json={"name": "old", "policy": _policy("fine", "learning_rate"),
                                             "knobs": [LR]}).json()
    s = Store(database_url)
    try:
        with s.session() as session:
            row = session.get(RunRow, run["id"])
            row.knobs = {"learning_rate": {**LR, "min": 1e-6, "max": 1e-5, "value": 1e-5}}
            bad = PolicyRow(name="bad", version=1, document=_policy("bad", "learning_rate", min=0.1, max=0.2))
            session.add(bad)
            session.flush()
            row.policy_id, row.policy_name, row.policy_version = bad.id, bad.name, bad.version
    finally:
        s.close()
    for seq in range(3):
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                       json={"observations": [{"seq": seq, "step": seq, "probes": {"kl_drift": 0.3}}]})
        assert r.status_code == 200, r.text
        assert r.json()["decisions"] == [] and r.json()["accepted"] == 1
    s = Store(database_url)
    try:
        kinds = [e.kind for e in s.list_events(run["id"])]
        assert kinds.count("controller_unusable") == 1, kinds
        assert s.count(EventRow) >= 2
    finally:
        s.close()
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert "out_min" in state["controllers"]["c"]["error"]
