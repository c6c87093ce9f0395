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
