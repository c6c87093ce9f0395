"""The follow law (controllers/follow.py): the knob follows the filtered probe through a monotone
piecewise-linear schedule, bounded and rate-limited; numbers checked by hand, then on a seeded
toy draft plant whose best mix rises with the acceptance it has reached."""

from __future__ import annotations

import math
import random

import pytest

from actuator.controllers import Follow, FollowConfig, ParameterError, check_schedule, schedule_at

MIX = ((0.2, 0.0), (0.4, 0.5), (0.6, 1.0))  # acceptance -> divergence_mix


def _law(points=MIX, **kw) -> Follow:
    return Follow(FollowConfig(points=points, **{"out_min": 0.0, "out_max": 1.0, **kw}))


def test_the_schedule_interpolates_between_its_points_and_holds_outside():
    # 0.31 lies between 0.2 and 0.4: 0 + (0.5 - 0) * (0.31 - 0.2) / 0.2 = 0.275
    assert schedule_at(MIX, 0.31) == (pytest.approx(0.275), 0, 1)
    assert schedule_at(MIX, 0.5) == (pytest.approx(0.75), 1, 2)
    assert schedule_at(MIX, 0.4) == (0.5, 1, 1)  # on a point
    assert schedule_at(MIX, 0.05) == (0.0, 0, 0)  # below the first: its value
    assert schedule_at(MIX, 0.9) == (1.0, 2, 2)  # above the last: its value
    falling = ((1.0, 4.0), (3.0, 1.0))
    assert schedule_at(falling, 2.5)[0] == pytest.approx(1.75)  # 4 - 3 * 1.5 / 2


def test_an_update_goes_to_the_schedule_value_when_no_limit_holds_it():
    out = _law().update(0.31, 0.2)
    assert out.value == pytest.approx(0.275) and out.target == pytest.approx(0.275)
    assert out.segment == (0, 1) and out.limited_by == () and out.changed
    assert _law().where(out.segment) == "between points 0 [0.2, 0] and 1 [0.4, 0.5]"
    same = _law().update(0.31, 0.275)
    assert not same.changed or same.value == pytest.approx(0.275)


def test_the_rate_limit_and_the_bounds_hold_the_target_back():
    out = _law(max_step=0.2).update(0.58, 0.1)  # target 0.95, at most 0.2 away from 0.1
    assert out.target == pytest.approx(0.95)
    assert out.value == pytest.approx(0.3) and out.limited_by == ("rate",)
    out = _law(out_max=0.8).update(0.7, 0.5)  # target 1.0 above the bound 0.8
    assert out.value == 0.8 and out.limited_by == ("bounds",)
    out = _law(out_min=0.3).update(0.1, 0.5)  # target 0.0 below the bound 0.3
    assert out.value == 0.3 and "bounds" in out.limited_by


def test_a_log_scale_knob_is_rate_limited_in_its_logarithm():
    # temperature 4 -> 1 as acceptance rises; at most x1.5 per decision
    law = Follow(FollowConfig(points=((0.2, 4.0), (0.6, 1.0)), out_min=0.5, out_max=8.0, scale="log",
                              max_step=math.log(1.5)))
    out = law.update(0.6, 4.0)
    assert out.target == 1.0 and out.value == pytest.approx(4.0 / 1.5) and out.limited_by == ("rate",)


def test_an_integer_knob_is_rounded():
    law = Follow(FollowConfig(points=((0.0, 1.0), (1.0, 8.0)), out_min=1, out_max=8, scale="integer"))
    out = law.update(0.5, 1.0)  # 4.5 rounds half up
    assert out.value == 5.0 and "integer" in out.limited_by


@pytest.mark.parametrize("points, words", [
    (((0.2, 0.0),), "at least 2 points"),
    (((0.4, 0.0), (0.2, 0.5)), "strictly increasing"),
    (((0.2, 0.0), (0.2, 0.5)), "strictly increasing"),
    (((0.2, 0.0), (0.4, 0.5), (0.6, 0.1)), "monotone"),
    (((0.2, math.nan), (0.4, 0.5)), "finite"),
    (((0.2, 0.0, 1.0), (0.4, 0.5)), "[probe value, knob value]"),
])
def test_a_bad_schedule_is_refused_naming_it(points, words):
    with pytest.raises(ParameterError, match="schedule") as info:
        check_schedule(points)
    assert words in str(info.value)
    with pytest.raises(ParameterError):
        Follow(FollowConfig(points=points))


def test_flat_stretches_are_monotone():
    assert check_schedule([[0, 1], [1, 1], [2, 3]]) == ((0.0, 1.0), (1.0, 1.0), (2.0, 3.0))


@pytest.mark.parametrize("kw, field", [({"out_min": 1.0, "out_max": 0.0}, "out_min"), ({"max_step": 0.0}, "max_step"),
                                       ({"scale": "log", "out_min": 0.0}, "out_min"), ({"scale": "cubic"}, "scale")])
def test_bad_limits_are_refused_naming_the_field(kw, field):
    with pytest.raises(ParameterError) as info:
        _law(**kw)
    assert info.value.field == field


# -- a simulated plant ----------------------------------------------------------------------------

def draft_plant(alpha: float, mix: float, rng: random.Random) -> tuple[float, float]:
    """A draft's acceptance under a KL -> TV mix, one decision interval: (true α, measured α).

    KL's gradients carry a draft that accepts little; TV is what acceptance is, but its gradients
    are tiny until the draft is close. So the mix that raises α fastest rises with α itself: here
    m*(α) = (α − 0.2) / 0.4 clipped to [0, 1], and progress falls off with the distance from it.
    The measurement is α plus seeded noise (a probe on a finite sample)."""
    best = min(1.0, max(0.0, (alpha - 0.2) / 0.4))
    alpha = alpha + 0.02 * (1.0 - alpha) * max(0.0, 1.0 - 1.5 * abs(mix - best))
    return alpha, alpha + rng.gauss(0.0, 0.01)


def _run(law: Follow | None, fixed: float = 0.0, seed: int = 0, steps: int = 150):
    rng = random.Random(seed)
    alpha, mix, ema, mixes = 0.15, fixed, None, []
    for _ in range(steps):
        alpha, measured = draft_plant(alpha, mix, rng)
        ema = measured if ema is None else 0.7 * ema + 0.3 * measured  # the policy's filter
        if law is not None:
            out = law.update(ema, mix)
            mix = out.value
        mixes.append(mix)
    return alpha, mixes


@pytest.mark.parametrize("seed", range(5))
def test_on_the_draft_plant_the_mix_follows_acceptance_and_beats_every_fixed_mix(seed):
    law = _law(points=((0.2, 0.0), (0.6, 1.0)), max_step=0.05)
    alpha, mixes = _run(law, seed=seed)
    fixed = {m: _run(None, fixed=m, seed=seed)[0] for m in (0.0, 0.25, 0.5, 0.75, 1.0)}
    assert alpha > max(fixed.values()) + 0.02, (alpha, fixed)
    assert all(0.0 <= m <= 1.0 for m in mixes)  # bounds
    assert all(abs(b - a) <= 0.05 + 1e-12 for a, b in zip([0.0, *mixes], mixes))  # rate limit
    assert mixes[-1] > 0.9  # the draft got close: the loss is (almost) TV by the end
    assert mixes[0] == 0.0  # and it was KL at the start
