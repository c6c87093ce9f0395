"""Identification and SIMC tuning on plants with known parameters (controllers/identify.py,
controllers/tuning.py): gain and time constant recovered within 20% with noise and dead time,
the integrating model picked for an integrating plant, the drift term for a probe that also moves
on its own, refusals that name the problem."""

from __future__ import annotations

import math
import random

import pytest
from actuator.controllers import ParameterError
from actuator.controllers.identify import (
    KnobDidNotMove,
    NoResponse,
    NotIdentifiable,
    StepTest,
    TooFewObservations,
    fit_fopdt,
    fit_integrating,
    identify,
)
from actuator.controllers.tuning import effective_dead_time, simc


def record(*, gain: float = 2.0, tau: float = 8.0, delay: int = 0, noise: float = 0.0, every: int = 1,
           steps: int = 80, step_at: int = 10, size: float = 1.0, u0: float = 0.0, y0: float = 0.0,
           integrating: bool = False, seed: int = 0) -> tuple[list[int], list[float], list[float]]:
    """A discrete plant driven by a step test, observed every ``every`` steps; each observation
    reports the knob in effect over the steps before it (as the agent does)."""
    rng = random.Random(seed)
    y, pipe = y0, [0.0] * delay
    ts, us, ys = [], [], []
    for k in range(steps + 1):
        u = u0 + (size if k > step_at else 0.0)
        if k:
            pipe.append(u - u0)
            seen = pipe.pop(0)
            y = y + gain * seen if integrating else y + (gain * seen + y0 - y) * (1 - math.exp(-1 / tau))
        if k % every == 0:
            ts.append(k)
            us.append(u)
            ys.append(y + rng.gauss(0, noise))
    return ts, us, ys


@pytest.mark.parametrize("gain, tau, delay, noise, every", [
    (2.0, 8.0, 0, 0.0, 1),
    (2.0, 8.0, 3, 0.05, 1),
    (-0.5, 20.0, 5, 0.02, 1),
    (0.1, 40.0, 20, 0.003, 10),  # per-probe sampling: a probe every 10 steps
])
def test_fopdt_recovers_gain_and_time_constant_within_20_percent(gain, tau, delay, noise, every):
    steps = max(80, int(10 * tau))
    for seed in range(3):
        m = identify(*record(gain=gain, tau=tau, delay=delay, noise=noise, every=every, steps=steps,
                             step_at=steps // 8, seed=seed))
        assert m.kind == "fopdt", m
        assert m.gain == pytest.approx(gain, rel=0.2)
        assert m.tau == pytest.approx(tau, rel=0.2)
        assert abs(m.theta - delay) <= every + 1  # the sample interval blurs the dead time
        assert m.r2 > 0.8 and m.nrmse < 0.1


def test_a_run_that_starts_away_from_equilibrium_is_fitted_with_its_transient():
    # the probe starts at 0 and heads for gain * u0 before the knob moves (KL starts at 0)
    ts, us, ys = record(gain=2.0, tau=6.0, u0=1.0, step_at=20, size=0.5, steps=60, noise=0.02)
    m = identify(ts, us, ys)
    assert m.kind == "fopdt" and m.gain == pytest.approx(2.0, rel=0.2) and m.tau == pytest.approx(6.0, rel=0.2)
    assert m.transient < 0  # rising towards the operating point


def test_integrating_plant_is_picked_and_its_rate_recovered():
    ts, us, ys = record(gain=0.05, delay=2, noise=0.01, integrating=True, steps=80)
    m = identify(ts, us, ys)
    assert m.kind == "integrating"
    assert m.rate == pytest.approx(0.05, rel=0.2) and m.tau == 0.0
    # forcing a FOPDT on it needs a time constant far past the data
    f = fit_fopdt(ts, us, ys)
    assert f.tau > 80 and f.aic > m.aic
    assert fit_integrating(ts, us, ys).rate == pytest.approx(m.rate)


@pytest.mark.parametrize("ramp", [-0.01, 0.01])
def test_a_probe_that_drifts_on_its_own_is_fitted_with_the_drift_term(ramp):
    # FOPDT (gain 2, tau 8, dead time 2) plus a steady drift of the probe, the benchmark's step
    # test (hold 20, step 40): the drift term separates the step's effect from the drift
    for seed in range(3):
        ts, us, ys = record(gain=2.0, tau=8.0, delay=2, noise=0.02, steps=60, step_at=20, size=0.5, seed=seed)
        ys = [y + ramp * t for y, t in zip(ys, ts)]
        m = identify(ts, us, ys)
        assert m.kind == "fopdt", m
        assert m.gain == pytest.approx(2.0, rel=0.2) and m.tau == pytest.approx(8.0, rel=0.2)
        assert m.drift == pytest.approx(ramp, rel=0.25) and abs(m.theta - 2) <= 1
        # without it the drift is credited to the knob: the gain is 35-40% off, and the fit worse
        plain = fit_fopdt(ts, us, ys)
        assert plain.drift == 0.0 and abs(plain.gain / 2.0 - 1) > 0.3 and plain.aic > m.aic + 10
        assert fit_fopdt(ts, us, ys, drift=None).drift == m.drift


def test_the_drift_term_stays_out_of_a_probe_that_does_not_drift_and_of_short_records():
    for seed in range(5):
        ts, us, ys = record(gain=2.0, tau=8.0, delay=2, noise=0.02, steps=60, step_at=20, size=0.5, seed=seed)
        m = identify(ts, us, ys)
        # the term must be significant at 1% (AIC alone took a drift worth 12% of the step on seed 1)
        assert m.drift == 0.0, m
        assert m.gain == pytest.approx(2.0, rel=0.2)
    # 12 observations cannot tell a drift from a slow transient: the term is not tried
    ts, us, ys = record(gain=2.0, tau=3.0, noise=0.01, steps=11, step_at=3, size=0.5)
    ys = [y + 0.05 * t for y, t in zip(ys, ts)]
    assert identify(ts, us, ys).drift == 0.0 and fit_fopdt(ts, us, ys, drift=True).drift != 0.0


def replay(m, us):
    """The fitted model driven by the recorded knob, from its own start."""
    state = m.start()
    sim = [m.output(state)]
    for u in us[1:]:
        y, state = m.step(state, u)
        sim.append(y)
    return sim


def test_a_drifting_model_replays_its_own_fit_and_its_balance_point_moves():
    ts, us, ys = record(gain=1.5, tau=5.0, delay=2, noise=0.0, y0=0.3, steps=40)
    ys = [y - 0.02 * t for y, t in zip(ys, ts)]
    m = fit_fopdt(ts, us, ys, drift=True)
    assert m.drift == pytest.approx(-0.02, rel=1e-3)
    assert replay(m, us) == pytest.approx(list(m.fitted), abs=1e-6)
    # to hold the same probe value 10 steps later the knob must make up 10 steps of drift
    target = m.offset + m.gain * 0.5
    assert m.steady_knob(target, at_step=10) == pytest.approx(m.u_ref + 0.5 - 10 * m.drift / m.gain)
    assert -10 * m.drift / m.gain == pytest.approx(0.2 / 1.5, rel=1e-3)


@pytest.mark.parametrize("delay", [2, 5, 10])
def test_integrating_plant_rate_and_dead_time_within_20_percent(delay):
    for seed in range(3):
        m = identify(*record(gain=0.05, delay=delay, noise=0.01, integrating=True, steps=80, seed=seed))
        # the drift term does not make a near-integrating FOPDT of it (tau is capped at half the span)
        assert m.kind == "integrating", m
        assert m.rate == pytest.approx(0.05, rel=0.2) and m.theta == pytest.approx(delay, rel=0.2)


@pytest.mark.parametrize("plant, kind, drifts", [
    ({"gain": 2.0, "tau": 8.0, "delay": 2}, "fopdt", False),
    ({"gain": 2.0, "tau": 8.0, "delay": 2, "ramp": -0.01}, "fopdt", True),
    ({"gain": -0.5, "tau": 15.0, "delay": 4, "ramp": 0.005}, "fopdt", True),
])  # integrating plants: test_integrating_plant_rate_and_dead_time_within_20_percent
def test_model_selection_picks_the_structure_of_known_plants(plant, kind, drifts):
    ramp = plant.pop("ramp", 0.0)
    for seed in range(3):
        ts, us, ys = record(**plant, noise=0.01, steps=80, step_at=20, size=0.5, seed=seed)
        m = identify(ts, us, [y + ramp * t for y, t in zip(ys, ts)])
        assert m.kind == kind, m
        assert (m.drift != 0.0) == drifts, m


def test_the_model_replays_its_own_fit():
    ts, us, ys = record(gain=1.5, tau=5.0, delay=2, noise=0.0, y0=0.3, steps=40)
    m = identify(ts, us, ys)
    assert replay(m, us) == pytest.approx(list(m.fitted), abs=1e-6)
    assert m.steady_knob(m.offset + m.gain * 0.5) == pytest.approx(m.u_ref + 0.5)


def test_refusals_name_the_problem():
    ts, us, ys = record(size=0.0, noise=0.05)
    with pytest.raises(KnobDidNotMove, match="knob moved by 0"):
        identify(ts, us, ys)
    ts, us, ys = record(size=0.01, noise=0.01)
    with pytest.raises(KnobDidNotMove, match="larger than 0.05"):
        identify(ts, us, ys, min_move=0.05)
    with pytest.raises(TooFewObservations, match="at least 6"):
        identify(ts[:4], us[:4], ys[:4])
    # a move whose effect is far below the probe's noise
    ts, us, ys = record(gain=0.01, size=0.1, noise=0.5, steps=40)
    with pytest.raises(NoResponse, match="lost in its noise"):
        identify(ts, us, ys)
    for exc in (KnobDidNotMove, TooFewObservations, NoResponse):
        assert issubclass(exc, NotIdentifiable) and issubclass(exc, ValueError)
    with pytest.raises(ParameterError, match="steps"):
        identify([0, 2, 1, 3, 4, 5], [0.0] * 6, [0.0] * 6)


def test_simc_rules_in_the_pid_parameterisation():
    ts, us, ys = record(gain=-2.0, tau=10.0, delay=2, steps=100)
    m = identify(ts, us, ys)
    t = simc(m)
    theta = effective_dead_time(m.theta, 1.0)
    assert theta == pytest.approx(m.theta + 0.5) and t.tau_c == pytest.approx(theta)
    assert t.kp == pytest.approx(m.tau / (2.0 * 2 * theta), rel=0.05)  # Kc = tau / (|k| (tau_c + theta))
    assert t.tau_i == pytest.approx(min(m.tau, 8 * theta)) and t.ki == pytest.approx(t.kp / t.tau_i)
    assert t.direction == "reverse" and t.kd == 0.0
    fast = simc(m, aggressiveness=2.0)
    assert fast.tau_c == pytest.approx(theta / 2) and fast.kp > t.kp
    # a probe every 10 steps: half an interval of dead time (the hold); an EMA on the probe: a
    # second lag tau_2 = h (1 - alpha) / alpha, cancelled by derivative (series PID -> parallel)
    slow = simc(m, interval=10.0, filter_alpha=0.5)
    theta10 = m.theta + 5.0
    assert slow.theta_eff == pytest.approx(theta10)
    kc, ti, tau2 = m.tau / (abs(m.gain) * 2 * theta10), min(m.tau, 8 * theta10), 10.0
    assert slow.kp == pytest.approx(kc * (1 + tau2 / ti)) and slow.tau_i == pytest.approx(ti + tau2)
    assert slow.tau_d == pytest.approx(ti * tau2 / (ti + tau2)) and slow.kd == pytest.approx(slow.kp * slow.tau_d)
    assert slow.ki == pytest.approx(slow.kp / slow.tau_i) and "tau_D" in slow.rule
    # integrating: Kc = 1 / (k (tau_c + theta)), tau_I = 4 (tau_c + theta)
    im = identify(*record(gain=0.05, delay=1, integrating=True))
    ti = simc(im)
    th = effective_dead_time(im.theta, 1.0)
    assert ti.kp == pytest.approx(1 / (im.rate * 2 * th)) and ti.tau_i == pytest.approx(8 * th)
    with pytest.raises(ParameterError, match="aggressiveness"):
        simc(m, aggressiveness=0.0)


def test_step_test_schedule():
    st = StepTest(size=0.5, length=10, hold=5, start=100)
    assert [st.offset(k) for k in (99, 104, 105, 114, 115)] == [0.0, 0.0, 0.5, 0.5, 0.0]
    assert st.end == 115
    assert st.value(110, 1e-3, "log") == pytest.approx(1e-3 * math.exp(0.5))
    assert st.value(110, 1e-3, "log", hi=1.2e-3) == 1.2e-3
    assert st.value(110, 0.2, "linear") == pytest.approx(0.7) and st.value(120, 0.2, "linear") == 0.2
    assert StepTest(size=0.6, length=3).value(0, 8, "integer") == 9.0
    with pytest.raises(ParameterError, match="size"):
        StepTest(size=0.0, length=3)


def test_theta_hi_bounds_the_dead_time_the_noise_hides_and_sizes_tau_c():
    # noise-free: the SSE rises at once past the fitted dead time
    clean = identify(*record(gain=2.0, tau=8.0, delay=2, steps=80))
    assert clean.theta <= clean.theta_hi <= clean.theta + 1.0
    # noisy: the bound widens, and it never lies below the fit
    for seed in range(5):
        noisy = identify(*record(gain=2.0, tau=8.0, delay=2, noise=0.15, steps=60, step_at=20, size=0.5, seed=seed))
        assert noisy.theta_hi >= noisy.theta
        assert noisy.theta_hi >= 1.0, noisy  # the true dead time (2) is not ruled out
    # SIMC sizes tau_c on the bound, Kc keeps the best-fit dead time
    from dataclasses import replace
    m = replace(clean, theta=0.5, theta_hi=2.0)
    t = simc(m)
    assert t.tau_c == pytest.approx(2.5) and t.theta_eff == pytest.approx(1.0) and t.theta_hi_eff == pytest.approx(2.5)
    assert t.kp == pytest.approx(m.tau / (abs(m.gain) * (2.5 + 1.0)))
    assert t.setpoint_weight == 1.0  # SIMC's structure: P on the error


def test_noise_jitter_is_the_probe_noise_fed_back_through_the_gains_and_the_plant_lag():
    from dataclasses import replace

    from actuator.controllers.tuning import noise_jitter

    m = replace(identify(*record(gain=2.0, tau=8.0, delay=2, steps=80)), residual_sd=0.1)
    t = simc(m)
    assert noise_jitter(m, t) == pytest.approx(2.0 * t.kp * 0.1 * math.sqrt(1 / 16), rel=0.05)
    # an EMA (alpha 0.5: variance / 3) and a derivative (two samples: 2 kd^2)
    t2 = simc(m, filter_alpha=0.5)
    expected = 2.0 * math.sqrt(t2.kp ** 2 + 2 * t2.kd ** 2) * 0.1 * math.sqrt(1 / 3) * math.sqrt(1 / 16)
    assert noise_jitter(m, t2, filter_alpha=0.5) == pytest.approx(expected, rel=0.05)
    assert noise_jitter(identify(*record(gain=0.05, delay=1, integrating=True)), t) is None
