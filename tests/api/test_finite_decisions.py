"""No observation is lost to a number: whatever finite probe values arrive, every decision, its
components and the run's state stay finite, so Postgres stores what SQLite stores (issue 17,
break 1). Over real HTTP, on SQLite and on Postgres."""

from __future__ import annotations

import json
import math

import httpx

KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]


def _policy(name: str, probe: str = "perplexity", **controller) -> dict:
    spec = {"name": "ppl", "probe": probe, "knob": "learning_rate", "setpoint": "+10%", "kp": 8.0, "ki": 0.8,
            **controller}
    return {"name": name, "controllers": [spec],
            "guardrails": [{"name": "ppl-cap", "probe": probe, "bound": "upper", "threshold": "+20%"}]}


def _register(url: str, policy: dict) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"name": "finite", "policy": policy, "knobs": KNOBS})
    assert r.status_code == 201, r.text
    return r.json()


def _feed(url: str, run: dict, values: list[float], step: int = 10, probe: str = "perplexity") -> list[dict]:
    """Post one observation per value; every one must be stored. Returns the decisions."""
    decisions = []
    for seq, v in enumerate(values):
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                       json={"observations": [{"seq": seq, "step": seq * step, "probes": {probe: v}}],
                             "last_decision": len(decisions)})
        assert r.status_code == 200, (v, r.text)
        decisions += r.json()["decisions"]
    return decisions


def _numbers(value: object) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return []


def _assert_stored_finite(url: str, run: dict) -> None:
    state = httpx.get(f"{url}/v1/runs/{run['id']}")
    assert state.status_code == 200, state.text
    assert all(math.isfinite(x) for x in _numbers(state.json())), state.text
    page = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 1000}).json()
    assert all(math.isfinite(x) for x in _numbers(page["items"])), page


def test_an_overflowing_log_scale_output_is_clamped_and_stored(service):
    # The run: answered 200 for 200, 190, 170, then 422 on Postgres from 150 on, because
    # the decision's unclamped value was exp() of ~700+ (Infinity in its JSON).
    run = _register(service.url, _policy("finite-rel"))
    decisions = _feed(service.url, run, [200, 190, 170, 150, 130, 110, 90, 70])
    assert decisions, "the falling perplexity must move the learning rate"
    for d in decisions:
        assert all(math.isfinite(x) for x in _numbers(d)), json.dumps(d)
    clamped = [d for d in decisions if "overflow" in d["inputs"]["limited_by"]]
    assert clamped, [d["inputs"] for d in decisions]
    assert "clamped to the largest finite value" in clamped[0]["reason"]
    assert clamped[0]["new_value"] <= 1e-2
    _assert_stored_finite(service.url, run)


def test_probe_values_at_the_edge_of_the_float_range_are_stored(service):
    # A first value of 1e308 made an infinite relative setpoint; swings across the whole float
    # range overflow the error, the EMA's difference and the derivative.
    run = _register(service.url, _policy("finite-edge", kd=5.0, filter={"kind": "ema", "alpha": 0.5}))
    _feed(service.url, run, [1e308, 1.7e308, 1.0, 1.7e308, 1.0, 5.0])
    _assert_stored_finite(service.url, run)
    run = _register(service.url, _policy("finite-median", "custom.score", setpoint=-1e308, kp=1e9, ki=1e9,
                                         filter={"kind": "median", "window": 2}))
    _feed(service.url, run, [1.7e308, 1.7e308, -1.7e308, 1.0, 1.7e308], probe="custom.score")
    _assert_stored_finite(service.url, run)


def test_absurd_gains_are_refused_at_validation(service):
    doc = _policy("finite-gain", kp=1e308)
    r = httpx.post(f"{service.url}/v1/policies/validate", json=doc)
    assert r.status_code == 200 and r.json()["valid"] is False
    assert [e["loc"] for e in r.json()["errors"]] == ["controllers.0.kp"]
    r = httpx.post(f"{service.url}/v1/runs", json={"name": "g", "policy": doc, "knobs": KNOBS})
    assert r.status_code == 422 and "controllers.0.kp" in r.text
