"""actuator/tune.py without the service: the replay goes through the engine and keeps the knob's
bounds and rate limit, an unreachable setpoint is flagged, and what cannot be tuned is refused."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from actuator.controllers.identify import KnobDidNotMove, identify
from actuator.policy import load_policy
from actuator.simulate import simulate_model
from actuator.tune import UnknownController, series, tune_controller

KNOB = {"name": "learning_rate", "value": 1e-3, "min": 1e-4, "max": 4e-3, "scale": "log", "max_step": 0.2}


def observations(factor: float = 2.0, seed: int = 0) -> list[SimpleNamespace]:
    """kl_drift = 0.3 + 0.1 * ln(lr / 1e-3) through a 10-step lag, a probe every 2 steps."""
    rng = random.Random(seed)
    y, out = 0.3, []
    for step in range(121):
        lr = 1e-3 * (factor if step > 20 else 1.0)
        if step:
            y += (0.3 + 0.1 * math.log(lr / 1e-3) - y) * (1 - math.exp(-1 / 10))
        if step % 2 == 0:
            out.append(SimpleNamespace(seq=step // 2, step=step, probes={"kl_drift": y + rng.gauss(0, 0.002)},
                                       metrics={}, knobs={"learning_rate": lr}))
    return out


def policy(setpoint: float, kind: str = "setpoint") -> object:
    return load_policy({"name": "p", "controllers": [{"name": "c", "kind": kind, "probe": "kl_drift",
                                                      "knob": "learning_rate", "setpoint": setpoint, "kp": 1.0,
                                                      "ki": 0.1}]})


def test_replay_on_the_model_keeps_bounds_and_rate_limit():
    obs = observations()
    steps, us, ys = series(obs, "kl_drift", "learning_rate", 1e-3, "log")
    model = identify(steps, us, ys)
    result = tune_controller(policy(0.35), {"learning_rate": KNOB}, "c", obs)
    assert result["predicted"]["proposed"]["settling_steps"] is not None and not result["warnings"]
    doc = load_policy(result["policy"])
    sim = simulate_model(doc, {"learning_rate": KNOB}, model, probe="kl_drift", knob="learning_rate", steps=200,
                         every=2)
    knobs = [t["knob"] for t in sim["trace"]]
    assert all(KNOB["min"] <= k <= KNOB["max"] for k in knobs)
    assert all(abs(math.log(b / a)) <= KNOB["max_step"] + 1e-12 for a, b in zip(knobs, knobs[1:]))
    assert sim["decisions"] and all(d["step"] % 2 == 1 for d in sim["decisions"])  # from the step after a probe
    assert abs(sim["trace"][-1]["probe"] - 0.35) < 0.01


def test_an_unreachable_setpoint_is_flagged():
    # 0.3 + 0.1 * ln(4) = 0.44 at the upper bound: 0.6 is out of reach
    result = tune_controller(policy(0.6), {"learning_rate": KNOB}, "c", observations())
    assert any("out of reach" in w for w in result["warnings"]), result["warnings"]
    assert any("does not settle" in w for w in result["warnings"])
    assert result["predicted"]["proposed"]["final_knob"] == pytest.approx(KNOB["max"])


def test_refusals():
    with pytest.raises(UnknownController, match="no controller 'x'"):
        tune_controller(policy(0.35), {"learning_rate": KNOB}, "x", observations())
    with pytest.raises(UnknownController, match="constraint controller"):
        tune_controller(policy(0.35, kind="constraint"), {"learning_rate": {**KNOB, "scale": "linear", "min": 0.0}},
                        "c", observations())
    with pytest.raises(UnknownController, match="does not declare"):
        tune_controller(policy(0.35), {"kl_beta": {**KNOB, "name": "kl_beta"}}, "c", observations())
    # a 3% move on a log knob is below the 5% it takes
    with pytest.raises(KnobDidNotMove, match="larger than 0.05"):
        tune_controller(policy(0.35), {"learning_rate": KNOB}, "c", observations(factor=1.03))
