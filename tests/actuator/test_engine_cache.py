"""The engine's per-policy caches (controller order, filters, validated PID laws) change nothing:
one long-lived engine decides bit for bit as a fresh engine per observation, also when a run's
knob bounds, scale or step limit, a setpoint override, a schedule or a relative baseline change
the law between observations, and when runs with different bounds share the engine."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from actuator.engine import Engine, RunContext
from actuator.run_state import KnobState
from actuator.policy import PolicyDocument
from actuator.schemas import ObservationCreate

POLICY = PolicyDocument.model_validate({
    "name": "cache",
    "controllers": [
        # lower priority first in the document: the engine must still run "sched" first
        {"name": "rel", "probe": "perplexity", "knob": "learning_rate", "setpoint": "+10%", "kp": 0.5, "ki": 0.2,
         "filter": {"kind": "median", "window": 3}, "priority": 0},
        {"name": "sched", "probe": "kl_drift", "knob": "learning_rate", "setpoint": [[0, 0.1], [40, 0.3]],
         "kp": 2.0, "ki": 0.5, "kd": 0.1, "filter": {"kind": "ema", "alpha": 0.6}, "priority": 5, "max": 5e-3},
        {"name": "beta", "probe": "custom.kl", "knob": "kl_beta", "setpoint": 0.2, "kp": 1.0, "ki": 0.3,
         "direction": "reverse", "deadband": 0.01},
    ],
    "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.45, "action": "adjust",
                    "knob": "learning_rate", "factor": 0.5, "consecutive": 2}],
})
KNOBS = {"learning_rate": {"value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.3},
         "kl_beta": {"value": 0.1, "min": 0.0, "max": 1.0, "scale": "linear"}}


def _obs(i: int) -> ObservationCreate:
    return ObservationCreate(seq=i, step=2 * i, probes={"kl_drift": 0.2 + 0.3 * math.sin(i / 3),
                                                        "perplexity": 10 + math.cos(i / 4), "custom.kl": 0.2 + 0.1 * math.sin(i)},
                             metrics={"loss": 1.0}, knobs={})


def _operator(ctx: RunContext, i: int) -> None:
    """What operators and the store change in a run between two observations."""
    lr, beta = ctx.knobs["learning_rate"], ctx.knobs["kl_beta"]
    if i == 10:
        lr.max = 2e-4  # bounds tightened below the value in effect
    if i == 15:
        lr.max = 3e-3
        beta.min, beta.max = 0, 1  # int bounds (JSON "1" is not 1.0)
    if i == 16:
        beta.min, beta.max = 0.0, 1.0
    if i == 20:
        ctx.controllers["sched"].setpoint_override = 0.25
    if i == 25:
        ctx.controllers["beta"].setpoint_override = 0.0
    if i == 26:
        ctx.controllers["beta"].setpoint_override = -0.0  # same value, other float
    if i == 30:
        ctx.controllers["sched"].setpoint_override = None
        lr.max_step = 0.1
    if i == 35:
        beta.min, beta.scale = 0.05, "log"
    if i == 40:
        ctx.controllers["rel"].baseline = 12.0  # a new reference for the relative setpoint


def _replay(fresh_each_time: bool, n: int = 60) -> str:
    shared = Engine(POLICY)
    ctx = RunContext.from_json(KNOBS)
    out: list[Any] = []
    for i in range(1, n):
        _operator(ctx, i)
        engine = Engine(POLICY) if fresh_each_time else shared
        r = engine.observe(ctx, _obs(i))
        out.append((r.decisions, r.actions, r.events, r.controller_outputs))
    # repr: floats to the last bit, ints told from floats, 0.0 from -0.0
    return repr((out, ctx))


def test_a_long_lived_engine_decides_as_a_fresh_one_per_observation() -> None:
    cached = _replay(fresh_each_time=False)
    assert cached == _replay(fresh_each_time=True)
    assert "setpoint_override=-0.0" in cached and "guardrail_breach" in cached  # the scenario reached them


def test_a_changed_law_is_used_at_once() -> None:
    engine = Engine(POLICY)
    ctx = RunContext.from_json(KNOBS)
    for i in range(1, 10):
        engine.observe(ctx, _obs(i))
    ctx.knobs["learning_rate"].max = 2e-4
    ctx.controllers["beta"].setpoint_override = 0.5
    r = engine.observe(ctx, _obs(10))
    assert ctx.knobs["learning_rate"].value <= 2e-4
    assert all(d.inputs["bounds"][1] == 2e-4 for d in r.decisions if d.knob == "learning_rate")
    assert ctx.controllers["beta"].setpoint == 0.5


def test_runs_with_different_bounds_share_an_engine() -> None:
    other = copy.deepcopy(KNOBS)
    other["learning_rate"].update(min=1e-5, max=5e-4, max_step=0.2)
    shared = Engine(POLICY)
    a, b = RunContext.from_json(KNOBS), RunContext.from_json(other)
    alone_a, alone_b = Engine(POLICY), Engine(POLICY)
    ra, rb = RunContext.from_json(KNOBS), RunContext.from_json(other)
    for i in range(1, 40):
        assert repr(shared.observe(a, _obs(i))) == repr(alone_a.observe(ra, _obs(i)))
        assert repr(shared.observe(b, _obs(i))) == repr(alone_b.observe(rb, _obs(i)))
    assert repr(a) == repr(ra) and repr(b) == repr(rb)


@pytest.mark.parametrize("lo", [0.0, -0.0, 0, 1e-3, 1, 1.0])
def test_the_cached_law_is_the_config_the_run_makes(lo: Any) -> None:
    engine = Engine(POLICY)
    spec = POLICY.controllers[2]  # beta, linear
    for bound in (0.0, -0.0, 0, 1e-3, 1, 1.0, lo):  # every other key first
        knob = KnobState("kl_beta", value=0.5, min=bound, max=2.0, scale="linear")
        engine._pid(spec, knob, 1, None, None)
    knob = KnobState("kl_beta", value=0.5, min=lo, max=2.0, scale="linear")
    cfg = engine._pid(spec, knob, 1, None, None).config
    assert repr(cfg) == repr(engine.pid_config(spec, knob, 1))
    assert type(cfg.out_min) is type(lo) and math.copysign(1, cfg.out_min) == math.copysign(1, lo)


def test_an_invalid_law_is_refused_every_time() -> None:
    engine = Engine(POLICY)
    spec = POLICY.controllers[2]
    knob = KnobState("kl_beta", value=0.5, min=2.0, max=1.0, scale="linear")
    for _ in range(2):
        with pytest.raises(ValueError, match="out_min"):
            engine._pid(spec, knob, 1, None, None)
