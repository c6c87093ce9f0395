"""``kind: follow`` through the real engine (issue 41): divergence_mix follows the filtered draft
acceptance through a monotone schedule, bounded and rate-limited, each decision saying which
points of the schedule it follows; on a toy draft plant whose best mix rises with acceptance."""

from __future__ import annotations

from typing import Any

import pytest

from actuator.engine import Engine
from actuator.policy import load_policy
from actuator.run_state import RunContext
from actuator.schemas import ObservationCreate

MIX = {"divergence_mix": {"value": 0.0, "min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.2}}
FOLLOW = {"name": "mix", "kind": "follow", "probe": "draft.acceptance", "knob": "divergence_mix",
          "schedule": [[0.2, 0.0], [0.4, 0.5], [0.6, 1.0]]}


def _policy(**fields: Any) -> Any:
    return load_policy({"name": "lk", "controllers": [{**FOLLOW, **fields}]})


def _observe(engine: Engine, ctx: RunContext, i: int, alpha: float, mix: float) -> Any:
    return engine.observe(ctx, ObservationCreate(seq=i, step=10 * i, probes={"draft.acceptance": alpha},
                                                 knobs={"divergence_mix": mix}))


def test_one_decision_goes_to_the_schedule_value_and_says_between_which_points():
    engine, ctx = Engine(_policy(max_step=0.5)), RunContext.from_json(MIX)
    result = _observe(engine, ctx, 0, 0.31, 0.0)
    (d,) = result.decisions
    # 0 + 0.5 * (0.31 - 0.2) / 0.2 = 0.275
    assert (d.knob, d.step, d.old_value, d.new_value) == ("divergence_mix", 1, 0.0, pytest.approx(0.275))
    assert d.reason == ("follow mix: draft.acceptance 0.31 -> divergence_mix 0.275 (between points 0 [0.2, 0] "
                        "and 1 [0.4, 0.5]): divergence_mix 0 -> 0.275")
    assert d.controller == "mix" and d.components == {"target": pytest.approx(0.275)}
    assert d.inputs["segment"] == [0, 1] and d.inputs["schedule"] == [[0.2, 0.0], [0.4, 0.5], [0.6, 1.0]]
    # the same reading again at a later step: the knob is there, nothing to decide
    assert _observe(engine, ctx, 1, 0.31, d.new_value).decisions == []


def test_the_rate_limit_holds_a_big_move_back_and_says_so():
    engine, ctx = Engine(_policy(max_step=0.1)), RunContext.from_json(MIX)
    (d,) = _observe(engine, ctx, 0, 0.7, 0.0).decisions
    assert d.new_value == pytest.approx(0.1)
    assert "-> divergence_mix 1 (at or above the last point [0.6, 1])" in d.reason
    assert d.reason.endswith("divergence_mix 0 -> 0.1, limited by rate")
    # without the controller's max_step the knob's own (0.2) limits it
    engine, ctx = Engine(_policy()), RunContext.from_json(MIX)
    assert _observe(engine, ctx, 0, 0.7, 0.0).decisions[0].new_value == pytest.approx(0.2)


def test_the_controllers_bounds_hold_the_knob_inside_them():
    engine, ctx = Engine(_policy(min=0.1, max=0.9, schedule=[[0.2, 0.1], [0.6, 0.9]], max_step=1.0)), \
        RunContext.from_json(MIX)
    assert _observe(engine, ctx, 0, 0.05, 0.0).decisions[0].new_value == 0.1  # brought into [0.1, 0.9]
    assert _observe(engine, ctx, 1, 0.9, 0.1).decisions[0].new_value == 0.9


def test_an_operator_override_and_a_higher_priority_controller_keep_the_knob():
    engine, ctx = Engine(_policy(max_step=1.0)), RunContext.from_json(MIX)
    ctx.knobs["divergence_mix"].override = 0.3
    assert _observe(engine, ctx, 0, 0.5, 0.3).decisions == []
    ctx.knobs["divergence_mix"].override = None
    assert _observe(engine, ctx, 1, 0.5, 0.3).decisions[0].new_value == pytest.approx(0.75)
    # a stale step is never acted on
    assert _observe(engine, ctx, 1, 0.6, 0.75).decisions == []


def test_a_schedule_outside_the_runs_knob_is_refused_at_registration_and_unusable_at_ingest():
    engine = Engine(_policy())
    narrow = {"divergence_mix": {**MIX["divergence_mix"], "max": 0.5}}
    errors = engine.knob_errors(narrow)
    assert [e["loc"] for e in errors] == ["controllers.0.schedule"], errors
    assert "outside the bounds [0, 0.5]" in errors[0]["msg"]
    assert engine.knob_errors(MIX) == []
    assert engine.knob_errors({"kl_weight": MIX["divergence_mix"]})[0]["loc"] == "controllers.0.knob"
    ctx = RunContext.from_json(narrow)
    result = _observe(engine, ctx, 0, 0.5, 0.0)
    assert result.decisions == [] and [e.kind for e in result.events] == ["controller_unusable"]


# -- closed loop on a toy draft plant ------------------------------------------------------------

def _closed_loop(policy: Any, steps: int = 120) -> tuple[float, list[Any]]:
    """Acceptance rises fastest when the mix is near (α − 0.2) / 0.4: KL's gradients first, TV's
    once the draft is close (the LK losses' argument); the probe reads α on a finite sample."""
    import random

    rng = random.Random(0)
    engine, ctx = Engine(policy), RunContext.from_json(MIX)
    alpha, mix, decisions = 0.15, 0.0, []
    for i in range(steps):
        best = min(1.0, max(0.0, (alpha - 0.2) / 0.4))
        alpha += 0.02 * (1.0 - alpha) * max(0.0, 1.0 - 1.5 * abs(mix - best))
        for d in _observe(engine, ctx, i, alpha + rng.gauss(0.0, 0.01), mix).decisions:
            decisions.append(d)
            mix = d.new_value
    return alpha, decisions


def test_in_a_closed_loop_the_mix_rises_with_acceptance_within_its_limits():
    policy = _policy(max_step=0.05, filter={"kind": "ema", "alpha": 0.3})
    alpha, decisions = _closed_loop(policy)
    assert len(decisions) >= 10
    assert all(abs(d.new_value - d.old_value) <= 0.05 + 1e-12 for d in decisions)
    assert all(0.0 <= d.new_value <= 1.0 for d in decisions)
    assert decisions[-1].new_value > 0.9 and alpha > 0.9
    # the filtered probe, not the raw reading, is what the schedule reads
    assert all(d.inputs["filtered"] != d.inputs["raw"] for d in decisions[1:])
    # with no controller the mix stays at KL and the draft stalls lower
    still, _ = _closed_loop(load_policy({"name": "none"}))
    assert still < alpha - 0.3
