"""Extremum seeking: converges to the maximiser of known concave functions, under a drifting
trend and noise, with a bounded step; state round-trips through JSON; bad config names its field."""

from __future__ import annotations

import json
import math
import random

import pytest

from actuator.controllers import ExtremumConfig, ExtremumSeeking, ExtremumState, ParameterError


def _run(law: ExtremumSeeking, f, start: float, n: int, trend=lambda k: 0.0, noise: float = 0.0,
         seed: int = 0, via_json: bool = False):
    rng = random.Random(seed)
    value, state = start, None
    outs = []
    for k in range(n):
        y = f(value) + trend(k) + rng.gauss(0.0, noise)
        out = law.update(y, 1.0, value, state)
        state = out.state
        if via_json:
            state = ExtremumState.from_dict(json.loads(json.dumps(state.to_dict())))
        value = out.value
        outs.append(out)
    return outs


def test_converges_to_the_maximiser_of_a_concave_function() -> None:
    # f(u) = -(u - 0.7)^2 on [0, 1], started at 0.2: the centre ends within 0.03 of 0.7. (Loop
    # gain = gain·|f''| = 0.4; at 2 the lag of the three-sample estimate makes it orbit the peak.)
    law = ExtremumSeeking(ExtremumConfig(dither=0.1, gain=0.2, out_min=0.0, out_max=1.0, max_step=0.05))
    outs = _run(law, lambda u: -((u - 0.7) ** 2), 0.2, 80)
    assert abs(outs[-1].centre - 0.7) < 0.03
    assert outs[5].centre < outs[-1].centre  # it climbed
    # every applied value is the centre ± the dither, inside the bounds
    assert all(abs(abs(o.value - o.centre) - 0.1) < 1e-12 and 0.0 <= o.value <= 1.0 for o in outs)
    # the step never exceeds max_step, and it was the limit while far from the peak
    assert all(abs(o.step) <= 0.05 + 1e-12 for o in outs)
    assert any("rate" in o.limited_by for o in outs[:20])


def test_gradient_estimate_is_exact_on_a_line_under_a_linear_trend() -> None:
    # J = 0.3 u + 0.01 k (a probe that rises by itself): the second difference removes the trend
    # and the demodulated sample is the slope exactly
    law = ExtremumSeeking(ExtremumConfig(dither=0.1, gain=0.0, out_min=0.0, out_max=1.0, smoothing=1.0))
    outs = _run(law, lambda u: 0.3 * u, 0.5, 10, trend=lambda k: 0.01 * k)
    assert [o.demodulated is None for o in outs[:4]] == [True, True, True, False]
    for o in outs[3:]:
        assert o.demodulated == pytest.approx(0.3, abs=1e-9)


def test_converges_under_a_rising_trend_and_noise() -> None:
    # acceptance-like: a concave peak at 0.35 on a probe that rises 0.005 per decision, with noise
    law = ExtremumSeeking(ExtremumConfig(dither=0.12, gain=2.0, out_min=0.0, out_max=1.0, max_step=0.04,
                                         smoothing=0.3))
    f = lambda u: 0.3 - 0.2 * (u - 0.35) ** 2  # noqa: E731
    finals = [_run(law, f, 0.8, 200, trend=lambda k: 0.005 * k, noise=0.0005, seed=s)[-1].centre for s in range(5)]
    assert all(abs(c - 0.35) < 0.08 for c in finals), finals


def test_maximiser_at_a_bound_is_approached_within_a_dither() -> None:
    law = ExtremumSeeking(ExtremumConfig(dither=0.1, gain=1.0, out_min=0.0, out_max=1.0, max_step=0.1))
    outs = _run(law, lambda u: u, 0.5, 30)
    assert outs[-1].centre == pytest.approx(0.9) and "bounds" in outs[-1].limited_by
    assert max(o.value for o in outs) == pytest.approx(1.0)


def test_log_scale_finds_a_multiplicative_optimum() -> None:
    # peak at u = 1e-3 in log space, knob in [1e-5, 1e-1]
    law = ExtremumSeeking(ExtremumConfig(dither=0.3, gain=0.5, out_min=1e-5, out_max=1e-1, max_step=0.5,
                                         scale="log"))
    outs = _run(law, lambda u: -((math.log(u) - math.log(1e-3)) ** 2), 1e-2, 120)
    assert outs[-1].centre == pytest.approx(1e-3, rel=0.15)


def test_cost_moves_the_optimum() -> None:
    # J = u - 2·c with cost c = u^2: optimum u = 1/4 (without the cost: the bound)
    law = ExtremumSeeking(ExtremumConfig(dither=0.05, gain=0.1, out_min=0.0, out_max=1.0, max_step=0.05,
                                         cost_weight=2.0))
    value, state = 0.8, None
    for _ in range(150):
        out = law.update(value, 1.0, value, state, cost=value**2)
        value, state = out.value, out.state
    assert abs(out.centre - 0.25) < 0.03
    with pytest.raises(ParameterError, match="cost"):
        law.update(0.5, 1.0, 0.5, state)


def test_state_round_trips_and_replays_identically() -> None:
    law = ExtremumSeeking(ExtremumConfig(dither=0.1, gain=1.0, out_min=0.0, out_max=1.0, max_step=0.05))
    f = lambda u: -((u - 0.6) ** 2)  # noqa: E731
    direct = _run(law, f, 0.2, 25, noise=0.01, seed=3)
    replayed = _run(law, f, 0.2, 25, noise=0.01, seed=3, via_json=True)
    assert [o.value for o in direct] == [o.value for o in replayed]
    st = direct[-1].state
    assert ExtremumState.from_dict(json.loads(json.dumps(st.to_dict()))) == st
    cfg = law.config
    assert ExtremumConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    fresh = law.restart(st)
    assert fresh.centre is None and fresh.updates == st.updates
    out = law.update(-0.1, 1.0, 0.3, fresh)  # restarts around the value in effect
    assert out.centre == pytest.approx(0.3) and out.value == pytest.approx(0.4)


@pytest.mark.parametrize(("fields", "name"), [
    ({"dither": 0.0}, "dither"), ({"dither": 0.6}, "dither"), ({"gain": -1.0}, "gain"),
    ({"out_min": 1.0, "out_max": 0.0}, "out_min"), ({"max_step": 0.0}, "max_step"),
    ({"smoothing": 0.0}, "smoothing"), ({"smoothing": 1.5}, "smoothing"), ({"cost_weight": -1.0}, "cost_weight"),
    ({"scale": "integer"}, "scale"), ({"scale": "log", "out_min": 0.0}, "out_min"),
    ({"out_max": math.inf}, "out_max"), ({"dither": math.nan}, "dither"),
])
def test_bad_config_names_its_field(fields, name) -> None:
    base = {"dither": 0.1, "gain": 1.0, "out_min": 0.0, "out_max": 1.0}
    with pytest.raises(ParameterError) as info:
        ExtremumSeeking(ExtremumConfig(**{**base, **fields}))
    assert info.value.field == name


def test_bad_inputs_name_their_argument() -> None:
    law = ExtremumSeeking(ExtremumConfig(dither=0.1, gain=1.0, out_min=0.0, out_max=1.0))
    for kwargs, name in (({"measurement": math.nan}, "measurement"), ({"dt": 0.0}, "dt"),
                         ({"current": math.inf}, "current")):
        args = {"measurement": 0.5, "dt": 1.0, "current": 0.5, **kwargs}
        with pytest.raises(ParameterError) as info:
            law.update(**args)
        assert info.value.field == name
