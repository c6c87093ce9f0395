"""Finite inputs never make a non-finite output, component or state (issue 17, break 1)."""

from __future__ import annotations

import math
import sys

import pytest

from actuator.controllers import EMA, PID, Median, PIDConfig, PIDLagrangian, PIDState, lagrangian_config

BIG = sys.float_info.max


def _finite(out) -> bool:  # type: ignore[no-untyped-def]
    numbers = [out.value, out.error, out.p, out.i, out.d, out.unclamped,
               *(v for v in out.state.to_dict().values() if v is not None)]
    return all(math.isfinite(x) for x in numbers)


@pytest.mark.parametrize("scale, lo, hi, cur", [("log", 1e-6, 1e-2, 1e-3), ("linear", -BIG, BIG, 0.0),
                                                ("integer", 1.0, 64.0, 8.0)])
@pytest.mark.parametrize("kp, ki, kd", [(1e308, 1e308, 1e308), (8.0, 0.8, 0.0), (1e9, 0.0, 1e9)])
def test_every_number_stays_finite(scale, lo, hi, cur, kp, ki, kd):
    pid = PID(PIDConfig(setpoint=-1e308, kp=kp, ki=ki, kd=kd, out_min=lo, out_max=hi, scale=scale))
    state: PIDState | None = None
    for y, dt in [(BIG, 1.0), (-BIG, 1e-300), (BIG, 1e300), (1.0, 1.0), (BIG, 5.0)]:
        out = pid.update(y, dt, cur, state)
        assert _finite(out), out
        assert lo <= out.value <= hi
        state, cur = out.state, out.value
    bumped = pid.bumpless(cur, -BIG, state)
    assert all(math.isfinite(v) for v in bumped.to_dict().values() if v is not None)


def test_a_log_output_past_exp_range_is_clamped_and_says_so():
    pid = PID(PIDConfig(setpoint=220.0, kp=8.0, ki=0.8, out_min=1e-6, out_max=1e-2, scale="log"))
    first = pid.update(200.0, 1.0, 1e-3)
    assert first.value == 1e-3 and "overflow" not in first.limited_by  # bumpless start
    out = pid.update(100.0, 10.0, 1e-3, first.state)  # ln(knob) far past 709
    assert out.unclamped == BIG and out.value == 1e-2
    assert out.limited_by == ("bounds", "overflow")


def test_a_first_update_with_huge_terms_is_still_bumpless():
    pid = PID(PIDConfig(setpoint=0.0, kp=1e308, out_min=1e-6, out_max=1e-2, scale="log"))
    out = pid.update(1e300, 1.0, 1e-3)
    assert out.value == 1e-3 and not out.changed and math.isfinite(out.i)


def test_filters_stay_finite_near_the_float_range():
    ema, median = EMA(0.3), Median(2)
    e = m = None
    for x in (BIG, -BIG, BIG, -BIG):
        fe, e = ema.update(x, e)
        fm, m = median.update(x, m)
        assert math.isfinite(fe) and math.isfinite(fm)
    assert median.update(BIG, median.update(BIG)[1])[0] == BIG


@pytest.mark.parametrize("bound", ["upper", "lower"])
def test_the_constraint_law_stays_finite(bound):
    law = PIDLagrangian(lagrangian_config(budget=-1e308, kp=1e9, ki=1e9, kd=1e9, bound=bound, out_max=10.0))
    state: PIDState | None = None
    cur = 0.0
    for y, dt in [(BIG, 1.0), (-BIG, 1e-300), (BIG, 1e300), (1.0, 1.0), (BIG, 5.0)]:
        out = law.update(y, dt, cur, state)
        assert _finite(out), out
        assert 0.0 <= out.value <= 10.0
        state, cur = out.state, out.value
    assert "overflow" in law.update(BIG, 1.0, cur, state).limited_by
    assert all(math.isfinite(v) for v in law.bumpless(cur, -BIG, state).to_dict().values() if v is not None)
