"""Filters and setpoint schedules."""

from __future__ import annotations

import json

import pytest
from actuator.controllers import (
    EMA,
    EMAState,
    Median,
    MedianState,
    ParameterError,
    Passthrough,
    PassthroughState,
    make_filter,
    setpoint_at,
)


def run(filt, xs, state=None):
    out = []
    for x in xs:
        y, state = filt.update(x, state)
        out.append(y)
    return out, state


def test_ema_starts_at_the_first_value_and_weights_the_newest_by_alpha() -> None:
    ys, st = run(EMA(0.25), [4.0, 8.0, 8.0])
    assert ys == [4.0, 5.0, 5.75]
    assert st == EMAState(value=5.75, count=3)


def test_ema_alpha_one_is_passthrough() -> None:
    xs = [1.0, -3.0, 7.5]
    assert run(EMA(1.0), xs)[0] == xs == run(Passthrough(), xs)[0]


def test_median_rejects_an_isolated_outlier() -> None:
    ys, st = run(Median(3), [1.0, 100.0, 1.2, 1.1, 0.9])
    assert ys == [1.0, 50.5, 1.2, 1.2, 1.1]
    assert st == MedianState(values=[1.2, 1.1, 0.9])


@pytest.mark.parametrize("filt", [Passthrough(), EMA(0.3), Median(4)])
def test_state_json_round_trip_continues_identically(filt) -> None:
    xs = [0.3, 1.7, -0.2, 5.0, 2.2, 2.1, 1.9, 3.3]
    _, st = run(filt, xs[:4])
    restored = filt.state_from_dict(json.loads(json.dumps(st.to_dict(), allow_nan=False)))
    assert restored == st
    assert run(filt, xs[4:], st)[0] == run(filt, xs[4:], restored)[0]


def test_make_filter_builds_each_kind_and_ignores_the_other_kinds_parameters() -> None:
    # the engine passes alpha and window for every kind
    assert isinstance(make_filter("none", alpha=0.5, window=3), Passthrough)
    ema = make_filter("ema", alpha=0.2, window=3)
    assert isinstance(ema, EMA) and ema.alpha == 0.2
    med = make_filter("median", alpha=0.5, window=5)
    assert isinstance(med, Median) and med.window == 5
    assert isinstance(make_filter("none").update(1.0)[1], PassthroughState)


@pytest.mark.parametrize(
    "call,field",
    [
        (lambda: make_filter("kalman"), "kind"),  # type: ignore[arg-type]
        (lambda: make_filter("ema", alpha=0.5, windw=3), "windw"),
        (lambda: make_filter("ema"), "alpha"),
        (lambda: EMA(0.0), "alpha"),
        (lambda: EMA(1.5), "alpha"),
        (lambda: Median(0), "window"),
        (lambda: Median(2.5), "window"),  # type: ignore[arg-type]
        (lambda: EMA(0.5).update(float("nan")), "x"),
        (lambda: Median(3).update(float("inf")), "x"),
    ],
)
def test_filter_errors_name_the_parameter(call, field: str) -> None:
    with pytest.raises(ParameterError) as exc:
        call()
    assert exc.value.field == field


def test_setpoint_constant_and_piecewise_linear() -> None:
    assert setpoint_at(6.0, 123) == 6.0
    pts = [[0, 1.0], [100, 2.0], [200, 2.0], [300, 0.5]]  # as it arrives from JSON
    assert setpoint_at(pts, -5) == 1.0
    assert setpoint_at(pts, 50) == pytest.approx(1.5)
    assert setpoint_at(pts, 150) == 2.0
    assert setpoint_at(pts, 250) == pytest.approx(1.25)
    assert setpoint_at(pts, 10_000) == 0.5
    assert setpoint_at([(10, 3.0)], 0) == setpoint_at([(10, 3.0)], 99) == 3.0


@pytest.mark.parametrize(
    "spec,field",
    [([], "setpoint"), ([(0, 1.0), (0, 2.0)], "setpoint[1].step"), ([(5, 1.0), (2, 2.0)], "setpoint[1].step"),
     ([(0, float("nan"))], "setpoint[0].value"), ([(0, 1.0, 2.0)], "setpoint[0]"), (float("inf"), "setpoint")],
)
def test_setpoint_schedule_errors_name_the_point(spec, field: str) -> None:
    with pytest.raises(ParameterError) as exc:
        setpoint_at(spec, 0)
    assert exc.value.field == field
