"""Operator control, policies (versions, archive, validate, simulate), reports and live events."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from actuator.models import DecisionRow, ObservationRow, PolicyRow, RunRow
from actuator.store import Store

from actuator.testing import make_service

POLICY = {
    "name": "ctl",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
                     "kp": 1.0, "ki": 0.5}],
    "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.5, "action": "alert",
                    "consecutive": 2}],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]


class Agent:
    def __init__(self, url: str, policy=POLICY) -> None:
        self.url = url
        r = httpx.post(f"{url}/v1/runs", json={"name": "ctl-run", "policy": policy, "knobs": KNOBS})
        assert r.status_code == 201, r.text
        self.run = r.json()
        self.seq = 0
        self.lr = 1e-3
        self.last = 0

    def observe(self, step: int, drift: float) -> dict:
        r = httpx.post(f"{self.url}/v1/runs/{self.run['id']}/observations",
                       headers={"Authorization": f"Bearer {self.run['token']}"},
                       json={"observations": [{"seq": self.seq, "step": step, "probes": {"kl_drift": drift},
                                               "knobs": {"learning_rate": self.lr}}],
                             "last_decision": self.last})
        assert r.status_code == 200, r.text
        self.seq += 1
        body = r.json()
        for d in body["decisions"]:
            self.lr = d["new_value"]  # the agent applies what it is told
            self.last = d["number"]
        return body

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/runs/{self.run['id']}{path}", **kw)


def counts(db: str):
    s = Store(db)
    try:
        return tuple(s.count(t) for t in (PolicyRow, RunRow, ObservationRow, DecisionRow))
    finally:
        s.close()


def test_override_pause_resume_setpoint_are_bumpless_and_audited(service):
    a = Agent(service.url)
    a.observe(1, 0.1)
    assert a.observe(2, 0.3)["decisions"], "drift above setpoint lowers the lr"

    # manual override: a decision to the pinned value; controllers track it while pinned
    r = a.post("/knobs/learning_rate/override", json={"value": 5e-4, "note": "operator"})
    assert r.status_code == 200, r.text
    [d] = r.json()["decisions"]
    assert d["new_value"] == 5e-4 and "manual override" in d["reason"]
    a.lr, a.last = 5e-4, d["number"]
    assert a.observe(3, 0.9)["decisions"] == []  # pinned: no controller decision
    # released: the next observation with the same measurement does not jump (bumpless)
    assert httpx.delete(f"{service.url}/v1/runs/{a.run['id']}/knobs/learning_rate/override").status_code == 200
    assert a.observe(4, 0.9)["decisions"] == []
    moved = a.observe(5, 0.95)["decisions"]
    assert moved and moved[0]["old_value"] == pytest.approx(5e-4) and moved[0]["new_value"] < 5e-4

    # pause: control holds; resume: bumpless again
    assert a.post("/pause").json()["run"]["state"] == "paused"
    assert a.observe(6, 2.0)["decisions"] == []
    assert a.post("/resume").json()["run"]["state"] == "running"
    assert a.observe(7, 2.0)["decisions"] == []
    assert a.post("/resume").status_code == 422  # not paused

    # setpoint change for this run
    r = httpx.put(f"{service.url}/v1/runs/{a.run['id']}/controllers/drift/setpoint", json={"setpoint": 3.0})
    assert r.status_code == 200
    up = a.observe(8, 2.0)["decisions"]
    assert up and up[0]["new_value"] > up[0]["old_value"] and up[0]["inputs"]["setpoint"] == 3.0
    assert httpx.put(f"{service.url}/v1/runs/{a.run['id']}/controllers/nope/setpoint",
                     json={"setpoint": 1}).status_code == 422

    kinds = [e["kind"] for e in httpx.get(f"{service.url}/v1/runs/{a.run['id']}/events").json()]
    for k in ("run_registered", "override", "override_released", "control_paused", "control_resumed",
              "setpoint", "guardrail_breach"):
        assert k in kinds, (k, kinds)


def test_bad_override_changes_nothing(service, database_url):
    a = Agent(service.url)
    before = counts(database_url)
    for knob, body in [("learning_rate", {"value": 1.0}), ("warp", {"value": 1e-3}),
                       ("learning_rate", {"value": "x"}), ("learning_rate", {})]:
        r = a.post(f"/knobs/{knob}/override", json=body)
        assert r.status_code == 422, r.text
    assert counts(database_url) == before
    assert httpx.get(f"{service.url}/v1/runs/{a.run['id']}").json()["knobs"]["learning_rate"]["value"] == 1e-3


def test_policy_versions_archive_move_and_validate(sqlite_service):
    url = sqlite_service.url
    assert httpx.post(f"{url}/v1/policies", json=POLICY).json()["version"] == 1
    v2 = {**POLICY, "controllers": [{**POLICY["controllers"][0], "kp": 2.0}]}
    assert httpx.put(f"{url}/v1/policies/ctl", json=v2).json()["version"] == 2
    assert httpx.put(f"{url}/v1/policies/other", json=v2).status_code == 422  # name mismatch
    assert httpx.get(f"{url}/v1/policies/ctl").json()["version"] == 2
    assert httpx.get(f"{url}/v1/policies/ctl/versions/1").json()["document"]["controllers"][0]["kp"] == 1.0

    r = httpx.post(f"{url}/v1/runs", json={"policy": "ctl@1", "knobs": KNOBS}).json()
    moved = httpx.post(f"{url}/v1/runs/{r['id']}/policy", json={"policy": "ctl@2", "reason": "stiffer"})
    assert moved.status_code == 200 and moved.json()["policy_version"] == 2
    ev = [e for e in httpx.get(f"{url}/v1/runs/{r['id']}/events").json() if e["kind"] == "policy_moved"]
    assert ev and ev[0]["payload"] == {"from": "ctl@1", "to": "ctl@2", "reason": "stiffer"}

    bad = {"name": "b", "controllers": [{"name": "c", "probe": "kl_drift", "knob": "learning_rate",
                                         "setpoint": 0.1, "kp": -1, "min": 1.0, "max": 0.1}],
           "guardrails": [{"name": "g", "probe": "vibes", "bound": "upper", "threshold": "5 percent"}]}
    res = httpx.post(f"{url}/v1/policies/validate", json=bad).json()
    locs = {e["loc"] for e in res["errors"]}
    assert res["valid"] is False
    assert {"controllers.0.kp", "guardrails.0.probe", "guardrails.0.threshold"} <= locs
    assert any("greater than max" in e["msg"] for e in res["errors"])
    assert httpx.post(f"{url}/v1/policies", json=bad).status_code == 422

    assert httpx.delete(f"{url}/v1/policies/ctl").json()["archived_versions"] == 2
    assert [p for p in httpx.get(f"{url}/v1/policies").json() if p["name"] == "ctl"] == []
    r = httpx.post(f"{url}/v1/runs", json={"policy": "ctl", "knobs": KNOBS})
    assert r.status_code == 422 and "not found" in r.text


def test_simulate_replays_without_storing(service, database_url):
    a = Agent(service.url)
    for step, drift in enumerate([0.1, 0.2, 0.3, 0.4, 0.3, 0.2], start=1):
        a.observe(step * 10, drift)
    real = httpx.get(f"{service.url}/v1/runs/{a.run['id']}/decisions").json()["total"]
    before = counts(database_url)
    stiff = {**POLICY, "name": "stiff", "controllers": [{**POLICY["controllers"][0], "kp": 4.0, "ki": 0.0}]}
    sim = httpx.post(f"{service.url}/v1/policies/simulate", json={"policy": stiff, "run_id": a.run["id"]})
    assert sim.status_code == 200, sim.text
    body = sim.json()
    assert body["observations"] == 6 and body["decisions"]
    assert all(d["knob"] == "learning_rate" for d in body["decisions"])
    assert counts(database_url) == before  # nothing stored, not even the inline policy
    assert real >= 1
    none = {**POLICY, "name": "none", "controllers": []}
    assert httpx.post(f"{service.url}/v1/policies/simulate",
                      json={"policy": none, "run_id": a.run["id"]}).json()["decisions"] == []


def test_report_json_png_html(sqlite_service):
    a = Agent(sqlite_service.url)
    for step, drift in enumerate([0.1, 0.6, 0.7, 0.4], start=1):
        a.observe(step, drift)
    base = f"{sqlite_service.url}/v1/runs/{a.run['id']}/report"
    rep = httpx.get(base).json()
    assert [p[1] for p in rep["probes"]["kl_drift"]] == [0.1, 0.6, 0.7, 0.4]
    assert rep["setpoints"]["kl_drift"] == 0.1 and rep["thresholds"]["kl_drift"] == 0.5
    assert rep["decisions"] and any(e["kind"] == "guardrail_breach" for e in rep["events"])
    png = httpx.get(base, params={"format": "png"}, timeout=60)  # drawn in a worker process
    assert png.headers["content-type"] == "image/png" and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    page = httpx.get(base, params={"format": "html"}, timeout=60)
    assert page.headers["content-type"].startswith("text/html") and "data:image/png;base64," in page.text
    assert "manual" not in page.text and "kl_drift" in page.text


def test_sse_stream_delivers_observations_decisions_and_breaches(sqlite_service):
    a = Agent(sqlite_service.url)
    got: list[tuple[str, dict]] = []
    ready = threading.Event()

    def listen() -> None:
        with httpx.stream("GET", f"{sqlite_service.url}/v1/runs/{a.run['id']}/stream",
                          params={"max_seconds": 8}, timeout=15) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            event = None
            for line in resp.iter_lines():
                ready.set()
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    got.append((event, json.loads(line[6:])))
                    if event == "guardrail_breach":
                        return

    t = threading.Thread(target=listen)
    t.start()
    assert ready.wait(5)
    for step, drift in enumerate([0.1, 0.6, 0.7], start=1):
        a.observe(step, drift)
    t.join(15)
    kinds = [k for k, _ in got]
    assert "observation" in kinds and "decision" in kinds and "guardrail_breach" in kinds
    breach = next(p for k, p in got if k == "guardrail_breach")
    assert breach["guardrail"] == "cap" and breach["value"] == 0.7


def test_admin_token_guards_policies_and_operator_actions(tmp_path):
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", admin_token="s3cret-admin", log_dir=str(tmp_path)).start()
    try:
        url = svc.url
        assert httpx.post(f"{url}/v1/policies", json=POLICY).status_code == 401
        assert httpx.post(f"{url}/v1/policies", json=POLICY, headers={"Authorization": "Bearer nope"}).status_code == 403
        admin = {"Authorization": "Bearer s3cret-admin"}
        assert httpx.post(f"{url}/v1/policies", json=POLICY, headers=admin).status_code == 201
        assert httpx.post(f"{url}/v1/runs", json={"policy": "ctl", "knobs": KNOBS}).status_code == 401
        run = httpx.post(f"{url}/v1/runs", json={"policy": "ctl", "knobs": KNOBS}, headers=admin).json()
        agent = {"Authorization": f"Bearer {run['token']}"}
        # the run token cannot act as an operator
        r = httpx.post(f"{url}/v1/runs/{run['id']}/knobs/learning_rate/override", json={"value": 1e-4}, headers=agent)
        assert r.status_code == 403
        assert httpx.post(f"{url}/v1/runs/{run['id']}/pause").status_code == 401
        assert httpx.post(f"{url}/v1/runs/{run['id']}/pause", headers=admin).status_code == 200
        # the admin token is not an agent token
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=admin,
                       json={"observations": [{"seq": 0, "step": 1}]})
        assert r.status_code == 403
    finally:
        svc.stop()
    assert "s3cret-admin" not in svc.logs() and run["token"] not in svc.logs()
