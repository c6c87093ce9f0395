"""Every event the service emits is one of the typed events (actuator.schemas.Event): a real run
driven through the real app (decisions, acknowledgements, a guardrail that adjusts and clears, one
that rolls back, one that halts, a starved probe report, operator actions, a policy move, a gap,
gains auto tuned and falling back),
its live stream and its audit trail read back and validated against the union, kind by kind."""

from __future__ import annotations

import json
import math
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import httpx

from actuator.schemas import EVENT, Event, EventKind, RunRegistered, StateChanged

from actuator.testing import Service

POLICY = {
    "name": "typed-events",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
                     "kp": 1.0, "ki": 0.5}],
    "guardrails": [
        {"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.5, "action": "adjust",
         "knob": "learning_rate", "factor": 0.5},
        {"name": "spike", "probe": "train.loss", "bound": "upper", "threshold": 5.0, "action": "rollback",
         "knob": "learning_rate"},
        {"name": "fatal", "probe": "custom.nan_rate", "bound": "upper", "threshold": 0.5, "action": "halt"},
    ],
}
MOVED = {**POLICY, "guardrails": POLICY["guardrails"][:1]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]
# Emitted by the engine only for a stored policy whose law cannot run on the run's knobs, which
# registration and policy moves refuse: no request can make one (tests/actuator covers the engine's).
UNREACHABLE = {"controller_unusable"}


def stream(url: str, run_id: str, last_event_id: str | None = None) -> list[dict[str, Any]]:
    """The kept events of a run's stream (it ends after a second): event name, id and JSON text."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events, event = [], {}
    with httpx.stream("GET", f"{url}/v1/runs/{run_id}/stream", params={"max_seconds": 1.0}, headers=headers,
                      timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line == "":
                if "data" in event:
                    events.append(event)
                event = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                event[name] = value.removeprefix(" ")
    return events


def drive(url: str) -> dict[str, Any]:
    """A run through every kind of event a request can cause; returns the registered run."""
    run = httpx.post(f"{url}/v1/runs", json={"name": "typed", "policy": POLICY, "knobs": KNOBS}).json()
    auth = {"Authorization": f"Bearer {run['token']}"}
    base = f"{url}/v1/runs/{run['id']}"
    seq, last = 0, 0

    def observe(step: int, probes: dict[str, float], metrics: dict[str, float] | None = None,
                applied: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        nonlocal seq, last
        r = httpx.post(f"{base}/observations", headers=auth, json={
            "observations": [{"seq": seq, "step": step, "probes": probes, "metrics": metrics or {},
                              "knobs": {"learning_rate": 1e-3}}],
            "last_decision": last, "applied": applied or []})
        assert r.status_code == 200, r.text
        seq += 1
        body = r.json()
        if body["decisions"]:
            last = body["decisions"][-1]["number"]
        return body

    observe(5, {"kl_drift": 0.2})
    first = observe(10, {"kl_drift": 0.4})  # the controller decides
    assert first["decisions"], first
    d = first["decisions"][0]
    observe(20, {"kl_drift": 0.8}, applied=[{"number": d["number"], "status": "applied", "step": 11,
                                             "value": d["new_value"]}])  # breach: adjust
    later = observe(30, {"kl_drift": 0.2},  # cleared
                    metrics={"probe_share": 0.1, "probe_starved.hotpotqa": 2.0})  # a starved probe report
    skipped = [{"number": n["number"], "status": "skipped", "step": 31, "reason": "identifying"}
               for n in later["decisions"][:1]]
    observe(40, {"kl_drift": 0.2}, metrics={"loss": 9.0}, applied=skipped)  # rollback
    for path, body in (("/knobs/learning_rate/override", {"value": 5e-4, "note": "hold"}),
                       ("/controllers/drift/setpoint", {"setpoint": 0.2}),
                       ("/controllers/drift/setpoint", {"setpoint": [[0, 0.1], [100, 0.3]]})):
        r = httpx.request("PUT" if "setpoint" in path else "POST", f"{base}{path}", json=body)
        assert r.status_code == 200, r.text
    assert httpx.delete(f"{base}/knobs/learning_rate/override").status_code == 200
    assert httpx.post(f"{base}/pause").status_code == 200
    assert httpx.post(f"{base}/resume").status_code == 200
    moved = httpx.post(f"{url}/v1/policies", json=MOVED)
    assert moved.status_code == 201, moved.text
    r = httpx.post(f"{base}/policy", json={"policy": f"{MOVED['name']}@{moved.json()['version']}", "reason": "r"})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{base}/policy", json={"policy": f"{POLICY['name']}@1", "reason": "back"})
    assert r.status_code == 200, r.text
    observe(50, {"kl_drift": 0.2, "custom.nan_rate": 1.0})  # halt by guardrail
    return run


AUTO = {"name": "typed-auto", "controllers": [{"name": "hold", "probe": "custom.plant", "knob": "learning_rate",
                                               "setpoint": 1.6, "gains": "auto", "kp": 0.5, "ki": 0.1}]}


def drive_auto(url: str) -> list[str]:
    """Two gains-auto runs: one with a warm-up step test a first-order plant answers (tuned), one
    that declared none (fallback); each outcome comes back as a notice too. Returns their ids."""
    ids = []
    for window in ([{"controller": "hold", "knob": "learning_rate", "start": 0, "end": 12, "size": 0.5}], []):
        run = httpx.post(f"{url}/v1/runs", json={"name": "auto", "policy": AUTO, "knobs": KNOBS,
                                                 **({"identification": window} if window else {})}).json()
        assert run["identification"] == window
        auth = {"Authorization": f"Bearer {run['token']}"}
        x, notices = 0.0, []
        for k in range(14):
            u = 0.5 if 3 <= k < 12 else 0.0
            x = u + (x - u) * math.exp(-0.5)
            r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
                {"seq": k, "step": k, "probes": {"custom.plant": 1.0 + 0.8 * x},
                 "knobs": {"learning_rate": 1e-3 * math.exp(0.5 if 2 <= k < 11 else 0.0)}}]})
            assert r.status_code == 200, r.text
            notices += r.json()["notices"]
        assert [n["kind"] for n in notices] == ["auto_gains" if window else "auto_gains_fallback"], notices
        ids.append(run["id"])
    return ids


def test_every_event_the_service_emits_is_a_typed_event(module_service: Service) -> None:
    url = module_service.url
    run = drive(url)
    live = stream(url, run["id"])
    # A second run, halted and finished by request: the state events of the runs router.
    other = httpx.post(f"{url}/v1/runs", json={"name": "other", "policy": POLICY, "knobs": KNOBS}).json()
    assert httpx.post(f"{url}/v1/runs/{other['id']}/halt").status_code == 200
    assert httpx.post(f"{url}/v1/runs/{other['id']}/finish").status_code == 200
    live += stream(url, other["id"])
    live += stream(url, run["id"], last_event_id="1-1")[:1]  # an id of a lost numbering: a gap
    autos = drive_auto(url)
    for auto in autos:
        live += stream(url, auto)
    # An agent that has seen decisions the store does not have (a store restored from a backup).
    restored = httpx.post(f"{url}/v1/runs", json={"name": "restored", "policy": POLICY, "knobs": KNOBS}).json()
    r = httpx.post(f"{url}/v1/runs/{restored['id']}/observations", headers={"Authorization": f"Bearer {restored['token']}"},
                   json={"observations": [{"seq": 0, "step": 0, "probes": {"kl_drift": 0.1}}], "last_decision": 40})
    assert r.status_code == 200 and r.json()["resumed_after"] == 0, r.text
    live += stream(url, restored["id"])
    autos.append(restored["id"])

    seen: set[str] = set()
    for ev in live:
        typed = EVENT.validate_json(ev["data"])
        assert ev["event"] == typed.kind
        # and the text is the typed event's own encoding (nothing beside the model on the wire)
        assert ev["data"] == json.dumps(typed.model_dump(mode="json", by_alias=True))
        seen.add(typed.kind)
    assert [json.loads(e["data"])["to"] for e in live if e["event"] == "state"] == ["halted", "finished"]

    stored = []
    for run_id in (run["id"], other["id"], *autos):
        r = httpx.get(f"{url}/v1/runs/{run_id}/events", params={"limit": 1000})
        assert r.status_code == 200
        stored += r.json()
        report = httpx.get(f"{url}/v1/runs/{run_id}/report").json()
        assert report["events"] == [{k: e[k] for k in ("kind", "step", "payload")} for e in r.json()][-len(
            report["events"]):]
    for e in stored:
        typed = EVENT.validate_python({"kind": e["kind"], "step": e["step"], **e["payload"]})
        assert json.loads(json.dumps(typed.row())) == {k: e[k] for k in ("kind", "step", "payload")}  # as stored
        seen.add(typed.kind)
    kinds = {e["kind"] for e in stored}
    assert {"run_registered", "state", "policy_moved", "guardrail_breach", "guardrail_cleared", "override",
            "override_released", "setpoint", "control_paused", "control_resumed"} <= kinds
    assert {e["payload"]["action"] for e in stored if e["kind"] == "guardrail_breach"} == {"adjust", "rollback",
                                                                                           "halt"}
    assert seen == set(get_args(EventKind)) - UNREACHABLE


def test_the_union_names_each_kind_once() -> None:
    kinds = [m.model_fields["kind"].default for m in _members(Event)]
    assert sorted(set(kinds)) == sorted(get_args(EventKind))
    assert len(kinds) == len(get_args(EventKind))


def _members(tp: Any) -> list[Any]:
    """The model classes of a (nested, annotated) union."""
    if get_origin(tp) is Annotated:
        return _members(get_args(tp)[0])
    if get_origin(tp) in (Union, UnionType):
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [tp]


def test_record_events_keep_their_rows_shape() -> None:
    """Audit rows written before events were typed: the payload without kind and step."""
    assert StateChanged(step=3, from_="running", to="halted").row() == {
        "kind": "state", "step": 3, "payload": {"from": "running", "to": "halted"}}
    assert StateChanged(to="halted", reason="halted by request").model_dump(by_alias=True) == {
        "kind": "state", "to": "halted", "reason": "halted by request"}
    knob = {"name": "lr", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": None}
    assert RunRegistered(policy="p", version=2, knobs={"lr": knob}).row() == {
        "kind": "run_registered", "step": None, "payload": {"policy": "p", "version": 2, "knobs": {"lr": knob}}}
