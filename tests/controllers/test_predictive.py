"""Prediction (``horizon``) and the setpoint ramp (``setpoint_ramp``) of the setpoint PID and the
PID-Lagrangian: the law's arithmetic. What they do on the simulated integrating plant with
Adam-like lag is tests/benchmarks/test_plants_integrating.py."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from actuator.controllers import PID, ParameterError, PIDConfig, PIDLagrangian, PIDState, lagrangian_config


def _run(pid: PID | PIDLagrangian, ys: list[float], current: float) -> list:
    outs, st = [], None
    for y in ys:
        out = pid.update(y, 1.0, current, st)
        outs.append(out)
        st, current = out.state, out.value
    return outs


# -- the law ---------------------------------------------------------------------------------------


def test_prediction_acts_on_the_projected_measurement() -> None:
    base = PIDConfig(setpoint=1.0, kp=2.0, ki=0.5, scale="linear", direction="direct")
    plain, ahead = _run(PID(base), [0.0, 0.2, 0.5], 0.0), _run(PID(replace(base, horizon=2.0)), [0.0, 0.2, 0.5], 0.0)
    # first update: no slope yet, nothing projected (bumpless either way)
    assert ahead[0].projected == 0.0 and ahead[0].value == plain[0].value == 0.0
    # then y + 2·(y − y_prev): 0.2 + 2·0.2 = 0.6, 0.5 + 2·0.3 = 1.1
    assert ahead[1].projected == pytest.approx(0.6) and ahead[2].projected == pytest.approx(1.1)
    assert ahead[1].p == pytest.approx(2.0 * (1.0 - 0.6)) and plain[1].p == pytest.approx(2.0 * (1.0 - 0.2))
    # the integral integrates the projected error: past the setpoint it already falls
    assert ahead[2].i - ahead[1].i == pytest.approx(0.5 * (1.0 - 1.1))
    assert plain[2].i - plain[1].i == pytest.approx(0.5 * (1.0 - 0.5))
    # the reported error stays setpoint − measurement; D stays on the measurement
    assert ahead[2].error == plain[2].error == pytest.approx(0.5)
    assert plain[2].projected is None and plain[2].setpoint is None


def test_a_fitted_model_projects_where_the_knob_in_effect_sends_the_probe() -> None:
    """With an integrating model (rate per log-unit of the knob, drift, around u_ref) the projection
    is y + h·dt·(drift + rate·(ln β − u_ref)), from the first update on (no slope needed)."""
    cfg = PIDConfig(setpoint=0.04, kp=25.0, ki=5.0, out_min=0.03, out_max=3.0, scale="log", direction="reverse",
                    horizon=2.0, model_rate=-0.0054, model_drift=0.0095, model_u_ref=math.log(0.1))
    out = PID(cfg).update(0.01, 2.0, 0.3)
    assert out.projected == pytest.approx(0.01 + 2.0 * 2.0 * (0.0095 - 0.0054 * math.log(3.0)))
    assert out.value == 0.3  # still a bumpless start
    nxt = PID(cfg).update(0.02, 2.0, 0.3, out.state)
    assert nxt.projected == pytest.approx(0.02 + 4.0 * (0.0095 - 0.0054 * math.log(3.0)))
    assert nxt.p == pytest.approx(-25.0 * (0.04 - nxt.projected))
    # without a horizon the model is not used
    assert PID(replace(cfg, horizon=0.0)).update(0.01, 2.0, 0.3).projected is None
    with pytest.raises(ParameterError) as e:
        PID(replace(cfg, model_rate=math.inf))
    assert e.value.field == "model_rate"


def test_prediction_off_changes_nothing() -> None:
    cfg = PIDConfig(setpoint=0.04, kp=25.0, ki=5.0, kd=1.0, out_min=0.03, out_max=3.0, scale="log",
                    direction="reverse", max_step=1.0, deadband=0.001)
    ys = [0.0, 0.01, 0.03, 0.05, 0.045, 0.041, 0.039]
    a, b = _run(PID(cfg), ys, 0.3), _run(PID(replace(cfg, horizon=0.0, setpoint_ramp=0.0)), ys, 0.3)
    assert [(o.value, o.p, o.i, o.d) for o in a] == [(o.value, o.p, o.i, o.d) for o in b]
    assert set(a[-1].state.to_dict()) == {"integral", "last_measurement", "last_output", "since_change", "updates"}


def test_the_lagrangian_charges_weight_before_a_rising_probe_crosses_its_budget() -> None:
    cfg = lagrangian_config(0.1, kp=10.0, ki=2.0, out_max=5.0)
    ys = [0.0, 0.04, 0.08, 0.095]
    plain, ahead = _run(PIDLagrangian(cfg), ys, 0.0), _run(PIDLagrangian(replace(cfg, horizon=2.0)), ys, 0.0)
    assert all(o.value == 0.0 for o in plain)  # below budget: no weight yet
    # at 0.04 rising 0.04 an interval, projected 0.12 > 0.1: weight while the probe is at 0.4 × budget,
    # kp·0.02 + ki·0.02 (the integral starts at the floor); then 0.08 → 0.16: kp·0.06 + ki·(0.02 + 0.06)
    assert ahead[1].projected == pytest.approx(0.12) and ahead[2].projected == pytest.approx(0.16)
    assert ahead[1].value == pytest.approx(10.0 * 0.02 + 2.0 * 0.02)
    assert ahead[2].value == pytest.approx(10.0 * 0.06 + 2.0 * 0.08)
    assert ahead[3].value > 0.0 and plain[3].value == 0.0  # still below budget, still charged


def test_setpoint_ramp_moves_the_setpoint_in_force_linearly() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=0.0, ki=1.0, scale="linear", direction="direct", setpoint_ramp=4.0)
    outs = _run(PID(cfg), [0.2] * 6, 0.0)
    assert [o.setpoint for o in outs] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    # the integral integrates against the ramp (0, 0.2, 0.4, 0.6, 0.8, 0.8), not the full gap 0.8
    assert [o.i for o in outs] == pytest.approx([0.0, 0.2, 0.6, 1.2, 2.0, 2.8])
    # the ramp's state survives JSON (it is stored between observations) and resumes where it was
    st = PIDState.from_dict(json.loads(json.dumps(outs[1].state.to_dict())))
    assert st == outs[1].state and PID(cfg).update(0.2, 1.0, outs[1].value, st).setpoint == pytest.approx(0.6)


def test_ramp_reaches_p_by_the_setpoint_weight_and_schedules_in_full() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=1.0, scale="linear", direction="direct", setpoint_ramp=2.0)
    outs = _run(PID(cfg), [0.0, 0.0, 0.0], 0.0)
    assert [o.p for o in outs] == pytest.approx([0.0, 0.0, 0.0])  # b = 0: bumpless, the ramp is not a kick
    outs = _run(PID(replace(cfg, setpoint_weight=1.0)), [0.0, 0.0, 0.0], 0.0)
    assert [o.p for o in outs] == pytest.approx([0.0, 0.5, 1.0])  # b = 1: P follows the ramp
    # a schedule that moves the setpoint mid-ramp moves the ramp's end, and P sees the change in full
    st = _run(PID(cfg), [0.0, 0.0], 0.0)[-1].state
    moved = PID(replace(cfg, setpoint=2.0)).update(0.0, 1.0, 0.0, st)
    assert moved.setpoint == pytest.approx(2.0) and moved.p == pytest.approx(1.0)


@pytest.mark.parametrize("field", ["horizon", "setpoint_ramp"])
def test_negative_horizon_or_ramp_is_refused(field: str) -> None:
    with pytest.raises(ParameterError) as e:
        PID(PIDConfig(setpoint=1.0, kp=1.0, **{field: -1.0}))
    assert e.value.field == field


def test_the_lagrangian_refuses_a_ramp() -> None:
    with pytest.raises(ParameterError) as e:
        PIDLagrangian(replace(lagrangian_config(0.1, kp=1.0), setpoint_ramp=3.0))
    assert e.value.field == "setpoint_ramp"


# -- release: a one-sided knob lets go past the setpoint ------------------------------------------


def test_release_drops_a_direct_knob_to_its_floor_past_the_edge_and_climbs_back_under_it() -> None:
    cfg = PIDConfig(setpoint=1.0, kp=0.2, ki=0.1, out_min=0.0, out_max=0.3, max_step=0.01, direction="direct",
                    release=0.1)
    outs = _run(PID(cfg), [0.5, 0.5, 1.05, 1.2, 1.2, 0.8], 0.05)
    assert outs[1].value == pytest.approx(0.06) and "release" not in outs[1].limited_by  # under: the PID, rate-limited
    assert outs[2].value == pytest.approx(0.05) and "release" not in outs[2].limited_by  # 1.05: inside +10%
    # 1.2 is past 1.1 (+10%): the floor at once, though max_step is 0.01
    assert outs[3].value == 0.0 and outs[3].limited_by[0] == "release" and outs[3].changed
    assert outs[4].value == 0.0 and "release" in outs[4].limited_by
    # back under the edge: the law again, climbing from the floor at the rate limit (P + I = 0.04 - 0.03)
    assert outs[5].value == pytest.approx(0.01) and outs[5].limited_by == ("rate",)
    assert outs[5].p + outs[5].i > outs[5].value
    # off by default: the same readings never let go
    plain = _run(PID(replace(cfg, release=0.0)), [0.5, 0.5, 1.05, 1.2, 1.2, 0.8], 0.05)
    assert all("release" not in o.limited_by for o in plain) and plain[3].value > 0


def test_release_of_a_reverse_knob_is_under_the_setpoint_and_needs_a_floor() -> None:
    cfg = PIDConfig(setpoint=2.0, kp=0.1, out_min=0.0, out_max=1.0, direction="reverse", release=0.25)
    assert not cfg.released(1.6) and cfg.released(1.4) and not cfg.released(3.0)
    assert _run(PID(cfg), [2.5, 1.4], 0.5)[1].value == 0.0
    with pytest.raises(ParameterError) as e:
        PID(replace(cfg, out_min=-math.inf))
    assert e.value.field == "release"
    with pytest.raises(ParameterError) as e:
        PID(replace(cfg, release=-0.1))
    assert e.value.field == "release"


def test_release_keeps_to_the_runs_own_rate_limit_on_the_knob() -> None:
    """``release_step`` (the run's max_step on the knob) bounds the fall; the controller's max_step does not."""
    cfg = PIDConfig(setpoint=1.0, kp=0.2, out_min=0.0, out_max=0.3, max_step=0.01, release=0.1, release_step=0.05)
    outs = _run(PID(cfg), [1.5, 1.5, 1.5, 1.5], 0.12)
    assert [round(o.value, 6) for o in outs] == [0.07, 0.02, 0.0, 0.0]
    assert all(o.limited_by[0] == "release" for o in outs)
