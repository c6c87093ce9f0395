"""PID behaviour: closed-loop convergence, limits, anti-windup, holds, bumpless transfer, state."""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from actuator.controllers import PID, FixedSchedule, ParameterError, PIDConfig, PIDState

# benchmarks/ is a plain folder at the repository root, not an installed package.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from benchmarks.control.plants import (  # noqa: E402
    DriftingGainPlant,
    FirstOrderLagPlant,
    FixedArm,
    PIDArm,
    run_arm,
    settling_steps,
    steady_state_error,
)


def drive(pid: PID, measurements: list[float], current: float, dt: float = 1.0, state: PIDState | None = None):
    """Feed measurements open loop, applying each output; return the outputs."""
    outs = []
    for y in measurements:
        out = pid.update(y, dt, current, state)
        outs.append(out)
        state, current = out.state, out.value
    return outs


# -- closed loop ---------------------------------------------------------------------------------


def test_converges_on_first_order_lag() -> None:
    plant = FirstOrderLagPlant(gain=2.0, tau=3.0, setpoint=1.0, initial_knob=0.0)
    arm = PIDArm("pid", PIDConfig(setpoint=1.0, kp=0.3, ki=0.2))
    trace = run_arm(plant, arm, 60, seed=0)
    settled = settling_steps(trace, band=0.02)
    assert settled is not None and settled <= 25, settled
    assert abs(trace.true[-1] - 1.0) < 1e-3
    assert trace.knob[-1] == pytest.approx(0.5, rel=1e-2)  # K * u = 1


@pytest.mark.parametrize("seed", range(5))
def test_converges_with_noise_and_dead_time(seed: int) -> None:
    plant = FirstOrderLagPlant(gain=1.0, tau=5.0, delay=2, noise_sd=0.05, setpoint=2.0, initial_knob=0.0)
    arm = PIDArm(
        "pid", PIDConfig(setpoint=2.0, kp=0.2, ki=0.08, out_min=0.0, out_max=10.0),
        filter_kind="ema", filter_params={"alpha": 0.5},
    )
    trace = run_arm(plant, arm, 150, seed)
    settled = settling_steps(trace, band=0.10)
    assert settled is not None and settled <= 40, settled
    assert abs(steady_state_error(trace, tail=0.3)) < 0.05 * 2.0


def test_converges_in_log_scale_on_a_multiplicative_knob() -> None:
    # measurement = ln(lr / 1e-4): the PID must find lr = 1e-4 * e**1.5 ~ 4.48e-4 from 1e-5
    plant = FirstOrderLagPlant(gain=1.0, tau=2.0, input="log", u_ref=1e-4, y0=math.log(0.1),
                               setpoint=1.5, initial_knob=1e-5)
    arm = PIDArm("pid", PIDConfig(setpoint=1.5, kp=0.3, ki=0.3, out_min=1e-7, out_max=1e-2,
                                  scale="log", max_step=0.5))
    trace = run_arm(plant, arm, 80, seed=0)
    assert trace.knob[-1] == pytest.approx(1e-4 * math.exp(1.5), rel=1e-3)
    steps = [abs(math.log(b / a)) for a, b in zip(trace.knob, trace.knob[1:])]
    assert max(steps) <= 0.5 + 1e-12


def test_integral_action_tracks_a_drifting_gain() -> None:
    plant = DriftingGainPlant(gain=1.0, tau=3.0, trend=0.004, walk_sd=0.01, noise_sd=0.02,
                              setpoint=1.0, initial_knob=1.0, y0=1.0)
    pid = run_arm(plant, PIDArm("pid", PIDConfig(setpoint=1.0, kp=0.3, ki=0.3, out_min=0.0)), 300, seed=3)
    fixed = run_arm(plant, FixedArm("fixed", FixedSchedule.constant(1.0)), 300, seed=3)
    assert abs(steady_state_error(pid)) < 0.03
    assert abs(steady_state_error(fixed)) > 1.0  # the gain grew ~3x: the fixed knob is far off
    assert settling_steps(pid, band=0.10) is not None and settling_steps(fixed, band=0.10) is None


# -- limits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale,lo,hi,start", [("linear", -2.0, 3.0, 0.5), ("log", 1e-6, 1e-3, 1e-4),
                                               ("integer", 4, 64, 16)])
def test_output_never_leaves_bounds(scale: str, lo: float, hi: float, start: float) -> None:
    rng = random.Random(7)
    pid = PID(PIDConfig(setpoint=0.0, kp=3.0, ki=2.0, kd=1.0, out_min=lo, out_max=hi, scale=scale))  # type: ignore[arg-type]
    outs = drive(pid, [rng.gauss(0.0, 5.0) for _ in range(500)], start)
    values = [o.value for o in outs]
    assert all(lo <= v <= hi for v in values)
    assert min(values) == lo and max(values) == hi  # the test really hit both bounds
    assert any("bounds" in o.limited_by for o in outs)
    if scale == "integer":
        assert all(v == int(v) for v in values)


def test_integer_scale_rounds_the_final_value_and_keeps_the_fraction() -> None:
    pid = PID(PIDConfig(setpoint=0.0, kp=1.0, ki=0.35, out_min=4, out_max=64, scale="integer",
                        direction="reverse"))
    first = pid.update(0.0, 1.0, 32)
    assert first.value == 32 and not first.changed
    # measurement 1 above setpoint, reverse: P = +1, I += 0.35 -> unclamped 33.35 -> rank 33
    out = pid.update(1.0, 1.0, 32, first.state)
    assert out.unclamped == pytest.approx(33.35)
    assert out.value == 33.0 and out.changed and "integer" in out.limited_by
    # the integral keeps the fraction: two more decisions at the same error add 0.7 -> 34.05 -> 34
    out = pid.update(1.0, 1.0, out.value, out.state)
    out = pid.update(1.0, 1.0, out.value, out.state)
    assert out.unclamped == pytest.approx(34.05) and out.value == 34.0


def test_integer_rounding_respects_the_rate_limit() -> None:
    pid = PID(PIDConfig(setpoint=0.0, kp=10.0, out_min=1, out_max=100, scale="integer", max_step=2.5))
    out = pid.update(0.0, 1.0, 50)
    out = pid.update(3.0, 1.0, 50, out.state)  # wants 50 - 30
    assert out.value == 48.0  # 47.5 would round to 48; never beyond the 2.5 window
    assert set(out.limited_by) >= {"rate"}


def test_log_scale_is_multiplicative() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=0.4, ki=0.1, out_min=1e-9, out_max=1.0, scale="log")
    ratios = []
    for current in (1e-6, 1e-4, 1e-2):
        pid = PID(cfg)
        out = pid.update(1.0, 1.0, current)
        out = pid.update(1.5, 1.0, current, out.state)  # measurement above setpoint: direct -> lower
        ratios.append(out.value / current)
        assert out.p == pytest.approx(-0.2) and out.i == pytest.approx(math.log(current) - 0.05)
    assert ratios[0] < 1.0
    assert ratios[0] == pytest.approx(math.exp(-0.25), rel=1e-12)
    assert ratios[1] == pytest.approx(ratios[0], rel=1e-12) and ratios[2] == pytest.approx(ratios[0], rel=1e-12)


def test_reverse_direction_raises_the_knob_when_the_measurement_is_high() -> None:
    cfg = PIDConfig(setpoint=6.0, kp=0.1, ki=0.05, out_min=1e-3, out_max=10.0, scale="log")
    for direction, expect_up in (("reverse", True), ("direct", False)):
        pid = PID(replace(cfg, direction=direction))
        out = pid.update(6.0, 1.0, 0.1)
        out = pid.update(9.0, 1.0, 0.1, out.state)
        assert out.error == -3.0  # raw setpoint - measurement, whatever the direction
        assert (out.value > 0.1) is expect_up


# -- anti-windup ---------------------------------------------------------------------------------


class NaivePID:
    """Textbook PID with output clamping only: the integral keeps growing while saturated."""

    def __init__(self, kp: float, ki: float, lo: float, hi: float) -> None:
        self.kp, self.ki, self.lo, self.hi = kp, ki, lo, hi
        self.integral = 0.0

    def update(self, sp: float, y: float, dt: float) -> float:
        e = sp - y
        self.integral += self.ki * e * dt
        return min(max(self.kp * e + self.integral, self.lo), self.hi)


def steps_to_leave_saturation(controller, hi: float) -> int:
    """Saturate 200 steps on an unreachable setpoint, then make it reachable; count the steps."""
    y, u, a = 0.0, 0.0, 1.0 - math.exp(-1.0 / 2.0)
    for k in range(400):
        sp = 20.0 if k < 200 else 5.0
        u = controller(sp, y, u)
        if k >= 200 and u < hi:
            return k - 200
        y += (u - y) * a  # first-order lag, gain 1: y can never exceed 10
    return 10**6


def test_windup_recovery_beats_a_pid_without_anti_windup() -> None:
    cfg = PIDConfig(setpoint=20.0, kp=0.5, ki=0.2, out_min=0.0, out_max=10.0)
    state: PIDState | None = None

    def ours(sp: float, y: float, u: float) -> float:
        nonlocal state
        out = PID(replace(cfg, setpoint=sp)).update(y, 1.0, u, state)
        state = out.state
        return out.value

    naive = NaivePID(0.5, 0.2, 0.0, 10.0)
    ours_steps = steps_to_leave_saturation(ours, 10.0)
    naive_steps = steps_to_leave_saturation(lambda sp, y, u: naive.update(sp, y, 1.0), 10.0)
    assert ours_steps <= 2
    assert naive_steps >= 100  # ~ (200 * 0.2 * 10) / (0.2 * 5) steps to unwind
    # and ours really was saturated, with the integral held at what the bound allows
    assert state is not None and state.integral <= 10.0 + 1e-9


def test_integral_does_not_wind_up_against_the_rate_limit() -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=0.0, ki=1.0, max_step=0.1))
    out = pid.update(0.0, 1.0, 0.0)
    integrals = []
    for _ in range(20):
        out = pid.update(0.0, 1.0, out.value, out.state)
        integrals.append(out.state.integral)
        assert "rate" in out.limited_by and out.value < out.unclamped
    # the knob slews 0.1 per step and the integral (the whole output here) moves with it
    # instead of running ahead: after 20 steps it is at the knob, not at 20
    assert out.value == pytest.approx(2.0)
    assert integrals[-1] == pytest.approx(out.value)


def test_integral_limit_clamps_the_integral_term() -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=0.0, ki=1.0, integral_limit=2.5))
    outs = drive(pid, [0.0] * 10, 0.0)
    assert max(o.state.integral for o in outs) == 2.5
    assert outs[-1].value == 2.5


# -- rate limit, deadband, cooldown --------------------------------------------------------------


def test_rate_limit_per_decision_in_scale_units() -> None:
    pid = PID(PIDConfig(setpoint=0.0, kp=5.0, ki=1.0, out_min=1e-6, out_max=1.0, scale="log", max_step=0.5))
    rng = random.Random(1)
    outs = drive(pid, [rng.uniform(-3, 3) for _ in range(200)], 1e-3)
    prev = 1e-3
    for o in outs:
        assert abs(math.log(o.value) - math.log(prev)) <= 0.5 + 1e-12
        if "rate" in o.limited_by:
            assert abs(math.log(o.value) - math.log(prev)) == pytest.approx(0.5)
        prev = o.value
    assert sum("rate" in o.limited_by for o in outs) > 20


def test_deadband_holds_and_freezes_the_integral() -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=1.0, ki=0.5, deadband=0.1))
    out = pid.update(0.5, 1.0, 3.0)
    out = pid.update(0.5, 1.0, out.value, out.state)
    assert out.changed
    knob, integral = out.value, out.state.integral
    for y in (0.95, 1.08, 0.9, 1.1):
        out = pid.update(y, 1.0, knob, out.state)
        assert out.value == knob and not out.changed and out.limited_by == ("deadband",)
        assert out.state.integral == integral
    out = pid.update(1.3, 1.0, knob, out.state)
    assert out.changed and out.value < knob


def test_cooldown_holds_between_changes() -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=1.0, ki=0.5, cooldown=3.0))
    out = pid.update(0.0, 1.0, 0.0)
    changed_at = []
    knob = out.value
    for k in range(12):
        out = pid.update(0.0, 1.0, knob, out.state)
        if out.changed:
            changed_at.append(k)
        else:
            assert out.limited_by == ("cooldown",) and out.value == knob
        knob = out.value
    assert changed_at == [0, 3, 6, 9]


def test_cooldown_counts_dt_not_updates() -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=1.0, ki=0.5, cooldown=0.3))
    out = pid.update(0.0, 0.1, 0.0)
    out = pid.update(0.0, 0.1, out.value, out.state)
    assert out.changed
    changes = []
    for _ in range(6):
        out = pid.update(0.0, 0.1, out.value, out.state)
        changes.append(out.changed)
    # 0.1 + 0.1 + 0.1 is 0.30000000000000004 or 0.29999999999999998: must not cost a decision
    assert changes == [False, False, True, False, False, True]


# -- bumpless transfer ---------------------------------------------------------------------------


def test_first_update_outputs_the_current_value() -> None:
    pid = PID(PIDConfig(setpoint=6.0, kp=0.3, ki=0.2, kd=0.5, out_min=0.01, out_max=2.0, scale="log"))
    out = pid.update(0.5, 1.0, 0.15)
    assert out.value == 0.15 and not out.changed and out.limited_by == ()
    assert out.p + out.i + out.d == pytest.approx(math.log(0.15), abs=1e-12)


@pytest.mark.parametrize("scale,lo,hi,override", [("linear", -10.0, 10.0, 7.25), ("log", 1e-6, 1e-2, 3.3e-5)])
def test_bumpless_transfer_after_manual_override(scale: str, lo: float, hi: float, override: float) -> None:
    cfg = PIDConfig(setpoint=1.0, kp=0.8, ki=0.3, kd=0.4, out_min=lo, out_max=hi, scale=scale)  # type: ignore[arg-type]
    pid = PID(cfg)
    rng = random.Random(5)
    start = 1.0 if scale == "linear" else 1e-4
    outs = drive(pid, [rng.gauss(1.0, 0.5) for _ in range(15)], start)
    y = 2.7  # far from setpoint: P, I and D would all move the knob
    st = pid.bumpless(override, y, outs[-1].state)
    out = pid.update(y, 1.0, override, st)
    to_scale = math.log if scale == "log" else (lambda v: v)
    assert abs(to_scale(out.value) - to_scale(override)) <= 1e-9
    assert not out.changed and out.d == 0.0
    # and control resumes from there: the next step is an ordinary integral step, not a jump
    nxt = pid.update(y, 1.0, out.value, out.state)
    assert to_scale(nxt.value) - to_scale(override) == pytest.approx(-0.3 * 1.7, abs=1e-9)


@pytest.mark.parametrize("scale,current", [("linear", 2.0), ("log", 1e-4)])
def test_a_takeover_acts_on_its_first_reading_where_a_fresh_start_holds(scale: str, current: float) -> None:
    """After a step test that ended with the probe past its setpoint, P and I act at once from the
    value in effect; a fresh (bumpless) start would output the value unchanged."""
    cfg = PIDConfig(setpoint=1.0, kp=0.8, ki=0.3, out_min=1e-6, out_max=10.0, scale=scale)  # type: ignore[arg-type]
    pid = PID(cfg)
    to_scale = math.log if scale == "log" else (lambda v: v)
    y = 1.5  # past the setpoint: the error -0.5 asks for a lower knob (direct acting)
    assert pid.update(y, 1.0, current).value == current
    out = pid.update(y, 1.0, current, pid.takeover(current))
    assert out.changed and out.d == 0.0
    assert to_scale(out.value) - to_scale(current) == pytest.approx(0.8 * -0.5 + 0.3 * -0.5, abs=1e-9)
    limited = PID(replace(cfg, max_step=0.1)).update(y, 1.0, current, pid.takeover(current))
    assert to_scale(limited.value) - to_scale(current) == pytest.approx(-0.1, abs=1e-9)  # within the rate limit


# -- state ---------------------------------------------------------------------------------------


def test_state_json_round_trip_gives_identical_outputs() -> None:
    cfg = PIDConfig(setpoint=0.9, kp=1.0, ki=0.3, kd=0.2, out_min=1e-6, out_max=1e-3, scale="log",
                    max_step=0.3, deadband=0.01, cooldown=2.0)
    pid = PID(cfg)
    rng = random.Random(11)
    ys = [rng.gauss(0.9, 0.3) for _ in range(40)]
    first = drive(pid, ys[:20], 2e-4)
    st = first[-1].state
    restored = PIDState.from_dict(json.loads(json.dumps(st.to_dict(), allow_nan=False)))
    assert restored == st
    a = drive(pid, ys[20:], first[-1].value, state=st)
    b = drive(pid, ys[20:], first[-1].value, state=restored)
    assert [(o.value, o.p, o.i, o.d, o.limited_by, o.state) for o in a] == \
           [(o.value, o.p, o.i, o.d, o.limited_by, o.state) for o in b]


def test_fresh_state_serialises_as_strict_json() -> None:
    d = PIDState().to_dict()
    assert d["since_change"] is None
    assert PIDState.from_dict(json.loads(json.dumps(d, allow_nan=False))).since_change == math.inf


def test_config_round_trips_through_json() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=1.0, scale="integer", out_min=1, integral_limit=5.0)
    assert PIDConfig.from_dict(json.loads(json.dumps(cfg.to_dict(), allow_nan=False))) == cfg


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,kwargs",
    [
        ("out_min", {"out_min": 2.0, "out_max": 1.0}),
        ("out_min", {"scale": "log", "out_min": 0.0, "out_max": 1.0}),
        ("out_min", {"scale": "log"}),
        ("out_min", {"scale": "integer", "out_min": 2.2, "out_max": 2.8}),
        ("max_step", {"max_step": -0.1}),
        ("max_step", {"max_step": float("nan")}),
        ("deadband", {"deadband": -1.0}),
        ("cooldown", {"cooldown": -1.0}),
        ("integral_limit", {"integral_limit": -1.0}),
        ("kp", {"kp": float("nan")}),
        ("ki", {"ki": float("inf")}),
        ("kd", {"kd": -0.5}),
        ("setpoint", {"setpoint": float("inf")}),
        ("scale", {"scale": "cubic"}),
        ("direction", {"direction": "up"}),
        ("out_max", {"out_max": float("nan")}),
    ],
)
def test_validation_names_the_field(field: str, kwargs: dict) -> None:
    base = {"setpoint": 1.0, "kp": 1.0}
    with pytest.raises(ValueError, match=field) as exc:
        PID(PIDConfig(**{**base, **kwargs}))
    assert isinstance(exc.value, ParameterError) and exc.value.field == field


@pytest.mark.parametrize(
    "field,args",
    [("measurement", (float("nan"), 1.0, 1e-4)), ("dt", (1.0, 0.0, 1e-4)), ("dt", (1.0, -1.0, 1e-4)),
     ("current", (1.0, 1.0, 0.0)), ("current", (1.0, 1.0, float("inf")))],
)
def test_update_rejects_bad_arguments(field: str, args: tuple) -> None:
    pid = PID(PIDConfig(setpoint=1.0, kp=1.0, out_min=1e-6, out_max=1.0, scale="log"))
    with pytest.raises(ValueError, match=field):
        pid.update(*args)


# -- derivative on measurement -------------------------------------------------------------------


def test_setpoint_step_causes_no_derivative_kick() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=0.5, ki=0.0, kd=10.0)
    out = PID(cfg).update(1.0, 1.0, 0.0)
    out = PID(cfg).update(1.0, 1.0, out.value, out.state)
    before = out.value
    # schedule moves the setpoint 1 -> 2 while the measurement stays put
    out = PID(replace(cfg, setpoint=2.0)).update(1.0, 1.0, before, out.state)
    assert out.d == 0.0
    assert out.value - before == pytest.approx(0.5 * 1.0)  # only the proportional step kp * dsp
    # whereas the same error change coming from the measurement does move D
    out2 = PID(cfg).update(0.0, 1.0, before, out.state)
    assert out2.d == pytest.approx(10.0)


def test_setpoint_weight_puts_p_on_the_initial_error_of_a_fresh_state_only():
    # b = 0 (default): bumpless start, the first update outputs the knob in effect
    pid0 = PID(PIDConfig(setpoint=1.0, kp=0.5, ki=0.1))
    assert pid0.update(0.0, 1.0, 0.0).value == 0.0
    # b = 1: P acts on the initial error at once (kp * 1.0), the rest of the law as before
    pid1 = PID(PIDConfig(setpoint=1.0, kp=0.5, ki=0.1, setpoint_weight=1.0))
    out = pid1.update(0.0, 1.0, 0.0)
    assert out.value == pytest.approx(0.5) and out.changed
    nxt = pid1.update(0.0, 1.0, out.value, out.state)  # then the integral acts: + ki * e * dt
    assert nxt.value == pytest.approx(0.6)
    # b = 0.5: half the kick; under a rate limit the kick is cut and the integral carries the rest
    assert PID(PIDConfig(setpoint=1.0, kp=0.5, setpoint_weight=0.5)).update(0.0, 1.0, 0.0).value == pytest.approx(0.25)
    lim = PID(PIDConfig(setpoint=1.0, kp=0.5, setpoint_weight=1.0, max_step=0.2))
    first = lim.update(0.0, 1.0, 0.0)
    assert first.value == pytest.approx(0.2) and "rate" in first.limited_by
    assert lim.update(0.0, 1.0, first.value, first.state).value == pytest.approx(0.4)
    # a hand-back after a manual override is bumpless whatever b
    back = pid1.bumpless(0.3, 0.0, nxt.state)
    assert pid1.update(0.0, 1.0, 0.3, back).value == pytest.approx(0.3)
    with pytest.raises(ValueError, match="setpoint_weight"):
        PID(PIDConfig(setpoint=1.0, kp=0.5, setpoint_weight=1.5))
