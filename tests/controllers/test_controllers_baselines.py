"""Baselines follow their published formulas: checked by hand and against torch itself."""

from __future__ import annotations

import json
import random

import pytest
from actuator.controllers import (
    AdaptiveKLController,
    AdaptiveKLState,
    FixedSchedule,
    KLAdaptiveLR,
    ParameterError,
    PlateauState,
    ReduceLROnPlateau,
)

# -- Ziegler et al. 2019 -------------------------------------------------------------------------


def test_adaptive_kl_matches_hand_computed_values() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # KL 6.6: error 0.1 -> beta * (1 + 0.1 * 512 / 10000) = 0.2 * 1.00512
    beta, st = ctl.update(6.6, 512)
    assert beta == pytest.approx(0.201024, abs=1e-15)
    # KL 30: error clipped to +0.2 -> * 1.01024
    beta, st = ctl.update(30.0, 512, st)
    assert beta == pytest.approx(0.201024 * 1.01024, abs=1e-15)
    # KL 0: error clipped to -0.2 -> * 0.98976
    beta, st = ctl.update(0.0, 512, st)
    assert beta == pytest.approx(0.201024 * 1.01024 * 0.98976, abs=1e-15)
    # at target nothing moves; n_steps = 0 nothing moves
    assert ctl.update(6.0, 512, st)[0] == beta
    assert ctl.update(100.0, 0, st)[0] == beta
    assert st == AdaptiveKLState.from_dict(json.loads(json.dumps(st.to_dict())))


def test_adaptive_kl_matches_the_reference_loop() -> None:
    # the TRL / lm-human-preferences update written out literally, state kept in an object
    class Reference:
        def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
            self.value, self.target, self.horizon = init_kl_coef, target, horizon

        def update(self, current: float, n_steps: int) -> None:
            proportional_error = min(max(current / self.target - 1, -0.2), 0.2)
            mult = 1 + proportional_error * n_steps / self.horizon
            self.value *= mult

    rng = random.Random(0)
    ref, ours, st = Reference(0.1, 6.0, 10000), AdaptiveKLController(0.1, 6.0, 10000), None
    for _ in range(200):
        kl, n = rng.uniform(0.0, 15.0), rng.choice([64, 256, 512])
        ref.update(kl, n)
        beta, st = ours.update(kl, n, st)
        assert beta == ref.value


@pytest.mark.parametrize("kwargs,field", [({"init_kl_coef": 0.0}, "init_kl_coef"), ({"target": -1.0}, "target"),
                                          ({"horizon": 0.0}, "horizon")])
def test_adaptive_kl_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ParameterError) as exc:
        AdaptiveKLController(**{"init_kl_coef": 0.1, "target": 6.0, "horizon": 10000, **kwargs})
    assert exc.value.field == field


# -- ReduceLROnPlateau against torch -------------------------------------------------------------


def metric_sequence(seed: int, n: int = 120) -> list[float]:
    """Improving stretches, plateaus, and noise: exercises patience, cooldown and thresholds."""
    rng = random.Random(seed)
    x, out = 2.0, []
    for k in range(n):
        phase = (k // 15) % 3
        x += {0: -0.05, 1: 0.0, 2: 0.01}[phase] + rng.gauss(0.0, 0.004)
        out.append(x if rng.random() > 0.1 else out[-1] if out else x)  # exact repeats too
    return out


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mode": "min", "factor": 0.5, "patience": 3},
        {"mode": "max", "factor": 0.5, "patience": 2, "threshold": 0.01, "threshold_mode": "abs"},
        {"mode": "max", "factor": 0.3, "patience": 0, "threshold_mode": "rel"},
        {"mode": "min", "factor": 0.5, "patience": 1, "cooldown": 4, "threshold_mode": "abs", "threshold": 0.0},
        {"mode": "min", "factor": 0.1, "patience": 0, "min_lr": 1e-4},
        {"mode": "min", "factor": 0.9, "patience": 0, "eps": 0.005},  # small reductions skipped
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_reduce_lr_on_plateau_equals_torch(kwargs: dict, seed: int) -> None:
    torch = pytest.importorskip("torch")
    metrics = metric_sequence(seed)
    if kwargs.get("mode") == "max":
        metrics = [-m for m in metrics]
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)
    ours, lr, st = ReduceLROnPlateau(**kwargs), 0.1, None
    torch_lrs, our_lrs = [], []
    for k, m in enumerate(metrics):
        sched.step(m)
        torch_lrs.append(float(opt.param_groups[0]["lr"]))
        lr, st = ours.update(m, lr, st)
        if k == 40:  # the state survives a JSON round trip mid-sequence
            st = PlateauState.from_dict(json.loads(json.dumps(st.to_dict(), allow_nan=False)))
        our_lrs.append(lr)
        assert st.num_bad_epochs == sched.num_bad_epochs and st.cooldown_counter == sched.cooldown_counter
    assert our_lrs == torch_lrs
    assert len(set(torch_lrs)) > 1 or kwargs.get("eps")  # the sequence really exercised reductions


@pytest.mark.parametrize("kwargs,field", [({"factor": 1.0}, "factor"), ({"mode": "avg"}, "mode"),
                                          ({"threshold_mode": "pct"}, "threshold_mode"), ({"patience": -1}, "patience"),
                                          ({"cooldown": 1.5}, "cooldown"), ({"min_lr": -1.0}, "min_lr")])
def test_plateau_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ParameterError) as exc:
        ReduceLROnPlateau(**kwargs)
    assert exc.value.field == field


def test_plateau_rejects_non_finite_metric() -> None:
    with pytest.raises(ValueError, match="metric"):
        ReduceLROnPlateau().update(float("nan"), 0.1)


# -- fixed schedules -----------------------------------------------------------------------------


def test_cubic_schedule_endpoints_and_shape() -> None:
    sched = FixedSchedule.cubic(v0=64, v_final=8, t_init=100, t_final=1100)
    assert sched.value_at(0) == 64 and sched.value_at(100) == 64
    assert sched.value_at(1100) == 8 and sched.value_at(5000) == 8
    assert sched.value_at(600) == pytest.approx(8 + 56 * 0.5**3)  # 15.0
    assert sched.value_at(350) == pytest.approx(8 + 56 * 0.75**3)
    values = [sched.value_at(t) for t in range(0, 1200, 10)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    # front-loaded: half the reduction is done well before half the time
    assert sched.value_at(100 + 0.21 * 1000) < 36


def test_cubic_schedule_integer_rounding() -> None:
    sched = FixedSchedule.cubic(v0=12, v_final=4, t_init=0, t_final=10, integer=True)
    assert [sched.value_at(t) for t in (0, 1, 5, 9, 10)] == [12.0, 10.0, 5.0, 4.0, 4.0]  # 9.832, 5.0, 4.008


def test_constant_and_piecewise_schedules() -> None:
    assert FixedSchedule.constant(2e-4).value_at(12345) == 2e-4
    pw = FixedSchedule.piecewise([(0, 1e-4), (100, 3e-4)])
    assert pw.value_at(50) == pytest.approx(2e-4) and pw.value_at(1000) == 3e-4


def test_cubic_schedule_validation() -> None:
    with pytest.raises(ParameterError) as exc:
        FixedSchedule.cubic(v0=8, v_final=2, t_init=10, t_final=10)
    assert exc.value.field == "t_final"


# -- TorchRL KLAdaptiveLR ------------------------------------------------------------------------


def test_kl_adaptive_lr_follows_the_torchrl_rule() -> None:
    """torchrl.objectives.KLAdaptiveLR's documented rule: KL > 2·target → lr / factor; 0 < KL <
    target/2 → lr · factor; otherwise unchanged; clamped to [min_lr, max_lr] (defaults 1.5, 1e-5, 1e-2)."""
    ctl = KLAdaptiveLR(0.04)
    assert (ctl.factor, ctl.min_lr, ctl.max_lr) == (1.5, 1e-5, 1e-2)
    assert ctl.update(0.09, 3e-4) == pytest.approx(2e-4)  # above 2·target: divided
    assert ctl.update(0.01, 2e-4) == pytest.approx(3e-4)  # below target/2: multiplied
    for kl in (0.02, 0.04, 0.08):  # the band, its edges included, leaves it alone
        assert ctl.update(kl, 2e-4) == 2e-4
    assert ctl.update(0.0, 2e-4) == 2e-4  # a policy that did not move: no runaway growth
    assert ctl.update(-0.001, 2e-4) == 2e-4  # nor a negative estimate of a KL
    assert ctl.update(0.01, 9e-3) == 1e-2  # clamped at max_lr
    assert ctl.update(1.0, 1.2e-5) == 1e-5  # and at min_lr
    custom = KLAdaptiveLR(0.1, factor=2.0, min_lr=1e-7, max_lr=1e-5)
    assert custom.update(0.3, 1e-5) == pytest.approx(5e-6)
    assert custom.update(0.01, 8e-6) == 1e-5  # ×2 = 1.6e-5, never above the peak


def test_kl_adaptive_lr_matches_a_literal_loop() -> None:
    rng = random.Random(1)
    ctl, lr, ref = KLAdaptiveLR(0.05, factor=1.5, min_lr=1e-6, max_lr=1e-3), 1e-4, 1e-4
    for _ in range(300):
        kl = rng.uniform(-0.01, 0.2)
        if kl > 2 * 0.05:
            ref = ref / 1.5
        elif 0 < kl < 0.05 / 2:
            ref = ref * 1.5
        ref = min(max(ref, 1e-6), 1e-3)
        lr = ctl.update(kl, lr)
        assert lr == ref


@pytest.mark.parametrize("kwargs,field", [({"target_kl": 0.0}, "target_kl"), ({"factor": 1.0}, "factor"),
                                          ({"factor": 0.5}, "factor"), ({"min_lr": -1.0}, "min_lr"),
                                          ({"max_lr": 0.0}, "max_lr"), ({"min_lr": 1e-2, "max_lr": 1e-3}, "min_lr")])
def test_kl_adaptive_lr_validation(kwargs: dict, field: str) -> None:
    args = {"target_kl": 0.1, **kwargs}
    with pytest.raises(ParameterError) as e:
        KLAdaptiveLR(args.pop("target_kl"), **args)
    assert e.value.field == field
