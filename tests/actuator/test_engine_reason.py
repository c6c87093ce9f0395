"""The decision reason says what really moved the knob, in a line an operator can check."""

from __future__ import annotations

import math
import re

from actuator.engine import Engine, RunContext
from actuator.policy import PolicyDocument
from actuator.schemas import ObservationCreate

POLICY = {
    "name": "reason",
    "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 1.0,
                     "kp": 1.0, "ki": 0.1, "direction": "direct"}],
}


def _run(drifts: list[float]) -> list:
    engine = Engine(PolicyDocument.model_validate(POLICY))
    ctx = RunContext(knobs={"learning_rate": {"value": 3e-5, "min": 3e-7, "max": 3e-5, "scale": "log",
                                              "max_step": 1.0}})
    decisions = []
    for k, drift in enumerate(drifts):
        obs = ObservationCreate(seq=k, step=2 * k, probes={"kl_drift": drift},
                                knobs={"learning_rate": ctx.knobs["learning_rate"]["value"]})
        decisions.extend(engine.observe(ctx, obs).decisions)
    return decisions


def test_a_cut_below_setpoint_names_the_rising_trend_and_the_terms_that_moved() -> None:
    # drift rising towards the setpoint: the velocity-form P brakes before it is reached
    decisions = _run([0.0, 0.5, 0.8])
    assert decisions, "a rising drift must brake the learning rate"
    first = decisions[0]
    assert first.new_value < first.old_value
    assert "kl_drift 0.5 below setpoint 1 and rising" in first.reason
    terms = dict(re.findall(r"\b([PID]) ([+-][0-9.e+-]+)", first.reason))
    # P moved by kp * change of error = -0.5, I by ki * error * dt = +0.1 * 0.5 * 2 = +0.1
    assert float(terms["P"]) == -0.5 and math.isclose(float(terms["I"]), 0.1)
    assert math.isclose(math.log(first.new_value / first.old_value), -0.4, abs_tol=1e-9)


def test_a_cut_above_setpoint_reads_above() -> None:
    decisions = _run([0.0, 1.5, 2.0])
    assert all(" above setpoint 1" in d.reason and d.new_value < d.old_value for d in decisions)
    assert "and rising" in decisions[-1].reason
