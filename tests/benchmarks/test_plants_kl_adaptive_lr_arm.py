"""The ``kl-adaptive-lr`` arm (TorchRL's KLAdaptiveLR rule on the learning rate) of dpo_kl and rl_kl:
its flags and the rule it builds from them (the real runs load SmolLM2, not run here)."""

from __future__ import annotations

import argparse
import importlib

import pytest
from actuator.controllers import KLAdaptiveLR


@pytest.mark.parametrize("module", ["dpo_kl", "rl_kl"])
def test_the_arm_and_its_flags_are_offered(module: str, capsys) -> None:
    main = importlib.import_module(f"benchmarks.control.{module}").main
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "kl-adaptive-lr" in text and "--kl-lr-factor" in text and "--kl-lr-bounds" in text
    with pytest.raises(SystemExit) as exc:  # an arm name that does not exist is refused at parsing
        main(["--arms", "kl-adaptive", "--help"])
    assert exc.value.code == 2


@pytest.mark.parametrize("module", ["dpo_kl", "rl_kl"])
def test_the_rule_is_torchrl_s_at_the_target_within_the_configured_rate(module: str) -> None:
    build = importlib.import_module(f"benchmarks.control.{module}").kl_adaptive_lr
    a = argparse.Namespace(target=0.04, lr=3e-5, kl_lr_factor=1.5, kl_lr_bounds=[0.01, 1.0])
    rule = build(a)
    assert isinstance(rule, KLAdaptiveLR)
    assert (rule.target_kl, rule.factor) == (0.04, 1.5)
    assert rule.min_lr == pytest.approx(3e-7) and rule.max_lr == pytest.approx(3e-5)
    assert rule.update(0.01, 3e-5) == pytest.approx(3e-5)  # KL low at the configured rate: never above it
    assert rule.update(0.09, 3e-5) == pytest.approx(2e-5)  # KL above 2·target: ÷ 1.5


class _Beta:
    """A β knob (the scenarios' KLBetaKnob reads and writes the trainer's beta)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def read(self) -> float:
        return self.value

    def apply(self, value: float) -> float:
        self.value = value
        return value


def test_the_baseline_arms_apply_their_rules_at_each_measurement() -> None:
    """harness.KLBaselines, shared by dpo_kl and rl_kl: Ziegler's β with n = samples since its last
    update, KLAdaptiveLR on the optimizer's learning rate, nothing for another arm."""
    import torch

    from actuator.controllers import AdaptiveKLController
    from benchmarks.control.harness import KLBaselines

    a = argparse.Namespace(beta=0.1, target=0.04, horizon=8.0, lr=1e-5, kl_lr_factor=1.5, kl_lr_bounds=[0.01, 1.0])

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=a.lr)

    beta, opt = _Beta(a.beta), optimizer()
    ziegler = KLBaselines("ziegler", a, samples_per_step=4)
    expected, state, last = AdaptiveKLController(a.beta, a.target, a.horizon), None, 0
    for step, kl in ((2, 0.08), (4, 0.09), (8, 0.02)):
        ziegler.update(kl, step, beta, opt, None)
        want, state = expected.update(kl, (step - last) * 4, state)
        last = step
        assert beta.read() == pytest.approx(want)
    assert beta.read() != a.beta and opt.param_groups[0]["lr"] == a.lr  # β moved, the lr did not

    beta, opt = _Beta(a.beta), optimizer()
    KLBaselines("kl-adaptive-lr", a, samples_per_step=4).update(0.2, 2, beta, opt, None)  # KL 5× target
    assert opt.param_groups[0]["lr"] == pytest.approx(a.lr / 1.5) and beta.read() == a.beta

    beta, opt = _Beta(a.beta), optimizer()
    KLBaselines("lr+anchor", a, samples_per_step=4).update(0.2, 2, beta, opt, None)
    assert opt.param_groups[0]["lr"] == a.lr and beta.read() == a.beta
