"""``horizon`` (issue 40) through the real service (uvicorn, SQLite): a run whose setpoint
controller has a horizon makes, on the same observations, exactly the decisions the controllers'
PID with that horizon makes, and they differ from the same controller's without one."""

from __future__ import annotations

import math

import httpx

from actuator.controllers import PID, PIDConfig

KNOB = {"name": "learning_rate", "value": 1e-4, "min": 1e-6, "max": 1e-3, "scale": "log", "max_step": 0.5}
KL = [0.02, 0.05, 0.08, 0.11, 0.13, 0.14, 0.14, 0.13, 0.12, 0.11, 0.10, 0.095]
EVERY = 10


def controller(horizon: float) -> dict:
    c = {"name": "kl", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 20.0, "ki": 5.0}
    return {**c, "horizon": horizon} if horizon else c


def through_service(url: str, horizon: float) -> list[tuple[int, float]]:
    policy = {"name": f"kl-horizon-{horizon:g}", "controllers": [controller(horizon)]}
    r = httpx.post(f"{url}/v1/runs", json={"policy": policy, "knobs": [KNOB]})
    assert r.status_code == 201, r.text
    run = r.json()
    auth = {"Authorization": f"Bearer {run['token']}"}
    lr, out = KNOB["value"], {}
    for k, y in enumerate(KL):
        answer = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
            {"seq": k, "step": EVERY * (k + 1), "probes": {"kl_drift": y}, "knobs": {"learning_rate": lr}}]})
        assert answer.status_code == 200, answer.text
        for d in answer.json()["decisions"]:  # the pending ones: this answer's and any not yet applied
            out[d["number"]] = (d["step"], d["new_value"])
        lr = out[max(out)][1] if out else lr
    stored = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 100}).json()["items"]
    assert sorted((d["number"], (d["step"], d["new_value"])) for d in stored) == sorted(out.items())
    return [out[n] for n in sorted(out)]


def by_the_law(horizon: float) -> list[tuple[int, float]]:
    pid = PID(PIDConfig(setpoint=0.1, kp=20.0, ki=5.0, out_min=KNOB["min"], out_max=KNOB["max"], scale="log",
                        max_step=KNOB["max_step"], horizon=horizon))
    lr, state, out, last = KNOB["value"], None, [], None
    for k, y in enumerate(KL):
        step = EVERY * (k + 1)
        o = pid.update(y, float(step - last) if last is not None else 1.0, lr, state)
        state, last = o.state, step
        if o.changed:
            lr = o.value
            out.append((step + 1, lr))
    return out


def test_a_run_with_a_horizon_decides_as_the_pid_with_that_horizon(module_service) -> None:
    url = module_service.url
    predicted = through_service(url, 2.0)
    expected = by_the_law(2.0)
    assert len(predicted) == len(expected) >= 5
    for (s, v), (es, ev) in zip(predicted, expected):
        assert s == es and math.isclose(v, ev, rel_tol=1e-9), (predicted, expected)
    plain = through_service(url, 0.0)
    assert plain != predicted
    assert [s for s, _ in by_the_law(0.0)] == [s for s, _ in plain]
    # acting on where KL is heading: the cut comes while KL is still below the setpoint, and the
    # learning rate is lower than without the horizon at every decision until KL passes the setpoint
    assert predicted[0][1] < KNOB["value"] and plain[0][1] >= predicted[0][1]
