"""PID-Lagrangian: the constraint law on a multiplier w >= 0."""

from __future__ import annotations

import json
import math

import pytest

from actuator.controllers import PID, ParameterError, PIDLagrangian, PIDState, lagrangian_config


def law(**kw):
    cfg = dict(budget=1.0, kp=2.0, ki=0.5)
    cfg.update(kw)
    return PIDLagrangian(lagrangian_config(**cfg))


def run(ctrl, measurements, w=0.0, state=None, dt=1.0):
    outs = []
    for y in measurements:
        out = ctrl.update(y, dt, w, state)
        w, state = out.value, out.state
        outs.append(out)
    return outs


def test_a_constraint_that_holds_costs_nothing():
    # A probe rising towards its budget but never past it: the weight stays exactly 0 (the
    # velocity-form PID would charge weight for the rise itself).
    outs = run(law(), [0.0, 0.2, 0.5, 0.8, 0.95, 0.99])
    assert [o.value for o in outs] == [0.0] * 6
    assert all(o.state.integral == 0.0 for o in outs)  # slack is not banked


def test_violation_raises_the_weight_and_slack_releases_it_to_zero():
    ctrl = law(budget=1.0, kp=2.0, ki=0.5)
    outs = run(ctrl, [0.5, 1.5, 1.5, 1.5])
    # first update: bumpless at 0; then P = 2 * 0.5 = 1, I grows by 0.5 * 0.5 per step
    assert outs[0].value == 0.0
    assert outs[1].value == pytest.approx(1.0 + 0.25)
    assert outs[2].value == pytest.approx(1.0 + 0.5)
    assert outs[3].value == pytest.approx(1.0 + 0.75)
    w, st = outs[-1].value, outs[-1].state
    back = run(ctrl, [0.9, 0.5, 0.5, 0.5, 0.5], w=w, state=st)
    assert back[-1].value == 0.0
    assert back[-1].state.integral == 0.0  # projected at 0, not negative
    # and a new violation is answered at once, not after unwinding banked slack
    again = ctrl.update(1.2, 1.0, 0.0, back[-1].state)
    assert again.value == pytest.approx(2.0 * 0.2 + 0.5 * 0.2)


def test_lower_bound_constraint():
    ctrl = law(budget=-2.0, kp=1.0, ki=0.0, bound="lower")  # e.g. gold log-prob >= -2
    outs = run(ctrl, [-1.5, -2.5])
    assert outs[1].value == pytest.approx(0.5)
    assert outs[1].error == pytest.approx(0.5)  # setpoint - y, as the PID reports it


def test_anti_windup_at_the_top_and_rate_limit():
    ctrl = law(kp=0.0, ki=1.0, out_max=2.0)
    outs = run(ctrl, [1.0] + [5.0] * 10)
    assert outs[-1].value == 2.0
    assert outs[-1].state.integral <= 2.0  # never integrates past the bound
    assert "bounds" in outs[-1].limited_by
    # one step below budget starts releasing at once (no large integral to unwind)
    rel = ctrl.update(0.0, 1.0, 2.0, outs[-1].state)
    assert rel.value < 2.0
    limited = law(kp=10.0, ki=0.0, max_step=0.3)
    outs = run(limited, [0.0, 3.0])
    assert outs[1].value == pytest.approx(0.3)
    assert outs[1].limited_by == ("rate",)


def test_derivative_acts_on_a_rising_violation_only():
    ctrl = law(kp=0.0, ki=0.0, kd=2.0)
    outs = run(ctrl, [1.0, 1.5])
    assert outs[1].d == pytest.approx(1.0)
    falling = ctrl.update(1.2, 1.0, outs[1].value, outs[1].state)
    assert falling.d == 0.0


def test_bumpless_from_an_operator_value_and_state_round_trip():
    ctrl = law()
    st = ctrl.bumpless(3.0, 1.2)
    out = ctrl.update(1.2, 1.0, 3.0, st)
    assert out.value == pytest.approx(3.0)  # takes over from the value in effect
    restored = PIDState.from_dict(json.loads(json.dumps(out.state.to_dict())))
    assert ctrl.update(1.3, 1.0, out.value, restored) == ctrl.update(1.3, 1.0, out.value, out.state)


def test_a_takeover_adds_p_and_i_to_the_weight_in_effect():
    ctrl = law()
    fresh = ctrl.update(1.2, 1.0, 0.5)
    taken = ctrl.update(1.2, 1.0, 0.5, ctrl.takeover(0.5))
    assert fresh.value == pytest.approx(0.5)  # a fresh start above the floor holds the weight
    assert taken.value > 0.5 and taken.value == pytest.approx(min(0.5 + taken.p + (taken.i - 0.5), 0.5 + 10.0))


def test_same_interface_as_the_pid():
    for name in ("update", "bumpless", "takeover"):
        assert callable(getattr(PIDLagrangian, name)) and callable(getattr(PID, name))
    out = law().update(2.0, 1.0, 0.0)
    assert math.isfinite(out.unclamped) and out.state.updates == 1


@pytest.mark.parametrize(("kw", "field"), [
    ({"out_min": -1.0}, "out_min"),
    ({"bound": "sideways"}, "bound"),
])
def test_invalid_configs_name_the_field(kw, field):
    with pytest.raises(ParameterError, match=field):
        law(**kw)


def test_log_scale_is_refused():
    from actuator.controllers import PIDConfig

    with pytest.raises(ParameterError, match="scale"):
        PIDLagrangian(PIDConfig(setpoint=1.0, kp=1.0, out_min=0.1, out_max=1.0, scale="log", direction="reverse"))
