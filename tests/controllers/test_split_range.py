"""Split-range control (controllers/split_range.py): one output, the learning rate over [0, 1] of
it and the KL-anchor weight over [-1, 0], on a simulated DPO-like plant whose KL integrates the
learning rate behind Adam-like momentum and is pulled back only by the anchor."""

from __future__ import annotations

import math
import random

import pytest
from actuator.controllers import PID, Leg, PIDConfig, SplitRange, SplitRangeConfig, SplitRangeError

PEAK, FLOOR, W_MAX, TARGET = 1e-5, 1e-7, 2.0, 0.1
LR = Leg("learning_rate", 0.0, 1.0, FLOOR, PEAK, acts="direct", scale="log")
ANCHOR = Leg("kl_weight", -1.0, 0.0, W_MAX, 0.0, acts="reverse")
LAW = PIDConfig(setpoint=TARGET, kp=10.0, ki=2.0, direction="direct", max_step=0.25)


def _split(law: PIDConfig = LAW, legs: tuple[Leg, Leg] = (LR, ANCHOR)) -> SplitRange:
    return SplitRange(SplitRangeConfig(law, legs))


def _dpo_like(seed: int, decide, steps: int = 40) -> list[tuple[float, dict[str, float]]]:
    """KL rate ∝ lr / peak (0.025 per interval at the peak) minus 0.3·w·KL, through momentum 0.6;
    probe noise 0.002. ``decide(measurement, knobs) -> knobs``. Returns (true KL, knobs in effect)."""
    rng = random.Random(seed)
    knobs, kl, v, out = {"learning_rate": PEAK, "kl_weight": 0.0}, 0.0, 0.0, []
    for _ in range(steps):
        v = 0.6 * v + 0.4 * (0.025 * knobs["learning_rate"] / PEAK - 0.3 * knobs["kl_weight"] * kl)
        kl = max(0.0, kl + v)
        out.append((kl, dict(knobs)))
        knobs = decide(kl + rng.gauss(0.0, 0.002), knobs)
    return out


def _split_arm():
    sr, st = _split(), [None]
    decisions = []

    def decide(y: float, knobs: dict[str, float]) -> dict[str, float]:
        o = sr.update(y, 1.0, knobs, st[0], probe="kl_drift")
        st[0] = o.state
        decisions.append(o)
        return o.values
    return decide, decisions


@pytest.mark.parametrize("seed", range(5))
def test_split_range_hands_over_without_a_bump_and_never_exceeds_the_peak(seed: int) -> None:
    decide, decisions = _split_arm()
    trace = _dpo_like(seed, decide)
    lrs = [k["learning_rate"] for _, k in trace]
    ws = [k["kl_weight"] for _, k in trace]
    assert max(lrs) <= PEAK  # never above the user's configured peak
    assert min(lrs) >= FLOOR and 0.0 <= min(ws) and max(ws) <= W_MAX
    # the hand-over happened: the learning rate reached its floor and the anchor took over
    assert any(w > 0 for w in ws)
    # one knob away from rest at a time
    assert all(w == 0.0 or lr == FLOOR for lr, w in zip(lrs, ws))
    # bumpless: every move of each knob is within what the rate limit on u (0.25) allows it,
    # the hand-over decisions included (the learning rate's log span is ln 100 over u's unit)
    span = math.log(PEAK / FLOOR)
    for a, b in zip(trace, trace[1:]):
        assert abs(math.log(b[1]["learning_rate"] / a[1]["learning_rate"])) <= 0.25 * span + 1e-9
        assert abs(b[1]["kl_weight"] - a[1]["kl_weight"]) <= 0.25 * W_MAX + 1e-9
    crossings = [o for o, prev in zip(decisions[1:], decisions) if (o.u < 0) != (prev.u < 0)]
    assert crossings, "the output crossed from the learning rate's range into the anchor's"
    # and the KL is brought back inside ±10% of the target and held there
    assert all(abs(kl - TARGET) <= 0.1 * TARGET for kl, _ in trace[-10:])


def test_the_learning_rate_alone_cannot_take_an_overshoot_back() -> None:
    """The same law on the learning rate only (log scale, the same span and rate limit): the KL
    it overshoots to stays there; what the split range's anchor leg is for."""
    span = math.log(PEAK / FLOOR)
    pid = PID(PIDConfig(setpoint=TARGET, kp=10.0 * span, ki=2.0 * span, out_min=FLOOR, out_max=PEAK, scale="log",
                        direction="direct", max_step=0.25 * span))
    st = [None]

    def decide(y: float, knobs: dict[str, float]) -> dict[str, float]:
        o = pid.update(y, 1.0, knobs["learning_rate"], st[0])
        st[0] = o.state
        return {"learning_rate": o.value, "kl_weight": 0.0}

    for seed in range(5):
        trace = _dpo_like(seed, decide)
        assert max(kl for kl, _ in trace) > 1.1 * TARGET
        assert trace[-1][0] > 1.1 * TARGET
        decide_split, _ = _split_arm()
        assert abs(_dpo_like(seed, decide_split)[-1][0] - TARGET) <= 0.1 * TARGET


def test_the_output_the_knobs_correspond_to_and_a_bumpless_start() -> None:
    sr = _split()
    assert sr.output_of({"learning_rate": PEAK, "kl_weight": 0.0}) == 1.0
    assert sr.output_of({"learning_rate": FLOOR, "kl_weight": 0.0}) == 0.0
    assert sr.output_of({"learning_rate": FLOOR, "kl_weight": 1.0}) == pytest.approx(-0.5)
    assert sr.output_of({"learning_rate": 1e-6, "kl_weight": 0.0}) == pytest.approx(0.5)
    # both away from rest (an operator's doing): the first leg in the config wins
    assert sr.output_of({"learning_rate": 1e-6, "kl_weight": 1.0}) == pytest.approx(0.5)
    # the first update changes nothing, whatever the error
    o = sr.update(0.5, 1.0, {"learning_rate": 1e-6, "kl_weight": 0.0})
    assert o.values == {"learning_rate": 1e-6, "kl_weight": 0.0} and o.acted == ()
    # a hand-back at the operator's values: the next update with the same measurement keeps them
    st = sr.bumpless({"learning_rate": FLOOR, "kl_weight": 0.4}, 0.12, o.state)
    again = sr.update(0.12, 1.0, {"learning_rate": FLOOR, "kl_weight": 0.4}, st)
    assert again.values == {"learning_rate": FLOOR, "kl_weight": 0.4} and again.acted == ()


def test_a_learning_rate_above_the_peak_is_brought_back() -> None:
    sr = _split()
    o = sr.update(0.05, 1.0, {"learning_rate": 3e-5, "kl_weight": 0.0})
    assert o.values["learning_rate"] == PEAK and o.acted == ("learning_rate",)


def test_the_explanation_names_the_knob_that_acted_and_why() -> None:
    sr = _split()
    knobs, st = {"learning_rate": FLOOR, "kl_weight": 0.0}, None
    for y in (0.11, 0.12):
        o = sr.update(y, 1.0, knobs, st, probe="kl_drift")
        knobs, st = o.values, o.state
    assert o.acted == ("kl_weight",)
    assert "kl_drift 0.12 rising, above setpoint 0.1" in o.reason
    assert "kl_weight raised 0 -> " in o.reason and "to lower kl_drift" in o.reason
    assert "learning_rate held at 1e-07 (its range [0, 1] of the output not in use)" in o.reason


def test_legs_that_act_against_their_ranges_are_refused() -> None:
    wrong = Leg("learning_rate", 0.0, 1.0, PEAK, FLOOR, acts="direct", scale="log")  # falls as u rises
    with pytest.raises(SplitRangeError) as e:
        _split(legs=(wrong, ANCHOR))
    assert e.value.field == "legs[0]"
    assert "raising the output lowers learning_rate" in str(e.value) and "'direct'" in str(e.value)
    # an anchor declared as raising the KL is as wrong
    with pytest.raises(SplitRangeError, match="legs\\[1\\]: kl_weight"):
        _split(legs=(LR, Leg("kl_weight", -1.0, 0.0, W_MAX, 0.0, acts="direct")))
    # and a reverse law with these legs: both wrong, the first is named
    with pytest.raises(SplitRangeError, match="legs\\[0\\]"):
        _split(law=PIDConfig(setpoint=TARGET, kp=1.0, direction="reverse"))


@pytest.mark.parametrize("legs,field", [
    ((LR, Leg("kl_weight", -1.0, 0.5, W_MAX, 0.0, acts="reverse")), "legs"),  # overlap
    ((LR, Leg("learning_rate", -1.0, 0.0, W_MAX, 0.0, acts="reverse")), "legs[1].knob"),
    ((LR, Leg("kl_weight", 0.0, 0.0, W_MAX, 0.0, acts="reverse")), "legs[1].lo"),
    ((LR, Leg("kl_weight", -1.0, 0.0, 0.0, 0.0, acts="reverse")), "legs[1].at_hi"),
    ((Leg("learning_rate", 0.0, 1.0, 0.0, PEAK, acts="direct", scale="log"), ANCHOR), "legs[0].at_lo"),
])
def test_invalid_legs_name_the_field(legs, field: str) -> None:
    with pytest.raises(SplitRangeError) as e:
        _split(legs=legs)
    assert e.value.field == field
