"""gains auto with a horizon, through the real service: a controller with ``horizon: 2`` whose
warm-up step test identifies an integrating plant acts, from the test's end on, on the projection
of the *fitted model* (``y + horizon * dt * (drift + rate * (knob - u_ref))``, controllers/pid.py),
not on the plain slope of the last two readings. The stored decisions are replayed with the PID
law alone, given the tuned gains and the stored fit."""

from __future__ import annotations

import math

import httpx
import pytest

from actuator.controllers.pid import PID, PIDConfig
from actuator.policy import load_policy

# The setpoint lies beyond where the step test takes the plant (1.45 by its end): a probe that
# passed it would end the test early (tests/api/test_auto_gains_api.py).
LR, RATE, END, SETPOINT = 1e-3, 0.1, 12, 1.6
POLICY = {"name": "auto-projection", "controllers": [{
    "name": "hold", "probe": "custom.plant", "knob": "learning_rate", "setpoint": SETPOINT, "gains": "auto",
    "kp": 0.5, "ki": 0.1, "horizon": 2}]}
KNOBS = [{"name": "learning_rate", "value": LR, "min": 1e-5, "max": 1e-1, "scale": "log", "max_step": 3.0}]
WINDOW = {"controller": "hold", "knob": "learning_rate", "start": 0, "end": END, "size": 0.5}


def run_closed_loop(url: str, steps: int) -> tuple[str, list[tuple[int, float, float]]]:
    """An integrating plant, ``y[k+1] = y[k] + RATE * ln(knob[k] / LR)``, under the step test of
    WINDOW and then under the service's decisions (each applied from the next observation on).
    The run's id and what was observed: (step, y, knob in effect)."""
    assert httpx.post(f"{url}/v1/policies", json=POLICY).status_code == 201
    run = httpx.post(f"{url}/v1/runs", json={"policy": POLICY["name"], "knobs": KNOBS,
                                             "identification": [WINDOW]}).json()
    auth = {"Authorization": f"Bearer {run['token']}"}
    y, u, seen = 1.0, LR, []
    for k in range(steps):
        if k < END:
            u = LR * math.exp(0.5 if 3 <= k < END else 0.0)
        seen.append((k, y, u))
        answer = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json={"observations": [
            {"seq": k, "step": k, "probes": {"custom.plant": y}, "knobs": {"learning_rate": u}}]})
        assert answer.status_code == 200, answer.text
        for d in answer.json()["decisions"]:
            u = d["new_value"]
        y += RATE * math.log(u / LR)
    return run["id"], seen


def replay(gains: dict, model: dict | None, seen: list[tuple[int, float, float]]) -> list[tuple[int, float]]:
    """The decisions the PID law makes from the test's end on with the tuned ``gains``, projecting
    with ``model`` (None: the plain slope projection)."""
    spec = load_policy(POLICY).controllers[0]
    fit = {} if model is None else {"model_rate": model["rate"], "model_drift": model["drift"],
                                    "model_u_ref": model["u_ref"]}
    law = PID(PIDConfig(setpoint=SETPOINT, kp=gains["kp"], ki=gains["ki"], kd=gains["kd"], out_min=1e-5, out_max=1e-1,
                        scale="log", direction=gains["direction"], max_step=3.0, deadband=spec.deadband,
                        cooldown=float(spec.cooldown), setpoint_weight=gains["setpoint_weight"], horizon=2,
                        setpoint_ramp=spec.setpoint_ramp, **fit))
    state, made = None, []
    for step, y, u in seen:
        if step < END:
            continue
        out = law.update(y, 1.0, u, state)
        state = out.state
        if out.changed:
            made.append((step + 1, out.value))
    return made


def test_an_integrating_fit_drives_the_projection(module_service) -> None:
    url = module_service.url
    run, seen = run_closed_loop(url, 30)
    events = httpx.get(f"{url}/v1/runs/{run}/events", params={"limit": 500}).json()
    (tuned,) = [e["payload"] for e in events if e["kind"] == "auto_gains"]
    assert tuned["fit"]["model"] == "integrating" and tuned["window"] == [0, END]
    auto = httpx.get(f"{url}/v1/runs/{run}").json()["controllers"]["hold"]["auto"]
    model, gains = auto["model"], auto["gains"]
    assert model["rate"] == pytest.approx(RATE, rel=1e-6) and model["u_ref"] == pytest.approx(math.log(LR))
    assert gains == tuned["gains"]

    stored = httpx.get(f"{url}/v1/runs/{run}/decisions", params={"limit": 500}).json()["items"]
    made = [(d["step"], d["new_value"]) for d in sorted(stored, key=lambda d: d["number"])]
    assert len(made) > 5 and all(step > END for step, _ in made)
    expected = replay(gains, model, seen)
    assert [s for s, _ in made] == [s for s, _ in expected]
    assert [v for _, v in made] == pytest.approx([v for _, v in expected], rel=1e-12)
    plain = replay(gains, None, seen)  # the slope of the last two readings instead: other decisions
    assert [(s, pytest.approx(v, rel=1e-9)) for s, v in plain] != made
