"""``kind: follow`` over real HTTP (uvicorn, SQLite): a follow controller has no setpoint, so the
setpoint action refuses it with a 4xx naming the controller and stores nothing (it was stored and
then silently ignored)."""

from __future__ import annotations

import httpx

KNOB = {"name": "divergence_mix", "value": 0.0, "min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.5}
POLICY = {"name": "lk-hybrid", "controllers": [{
    "name": "mix", "kind": "follow", "probe": "draft.acceptance", "knob": "divergence_mix",
    "schedule": [[0.2, 0.0], [0.4, 0.5], [0.6, 1.0]]}]}


def test_a_follow_controller_has_no_setpoint_to_change(sqlite_service):
    url = sqlite_service.url
    r = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": [KNOB]})
    assert r.status_code == 201, r.text
    run = r.json()
    r = httpx.put(f"{url}/v1/runs/{run['id']}/controllers/mix/setpoint", json={"setpoint": 0.5})
    assert 400 <= r.status_code < 500 and "no setpoint" in r.text and "mix" in r.text, r.text
    events = httpx.get(f"{url}/v1/runs/{run['id']}/events").json()
    assert not [e for e in events if e["kind"] == "setpoint"], events
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
    assert (state["controllers"].get("mix") or {}).get("setpoint_override") is None, state
