"""Issue 54: what of DeepSpeed the agent still refuses at ``train()`` start, each with its reason,
and what it takes (ZeRO-2 and ZeRO-3 run for real in test_deepspeed.py).

A DeepSpeed engine needs a process group, so here a real single-process Trainer carries the
DeepSpeed flag and accelerate's DeepSpeed plugin config (as ``train()`` would find them) and its own
callback handler fires ``on_train_begin``: under test is the callback's reading of the config."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))  # agent_helpers

from actuator._exceptions import ConfigError  # noqa: E402
from actuator.agents import _hf_compat  # noqa: E402
from actuator.agents.callback import ActuatorCallback  # noqa: E402
from actuator.agents.knobs import setter_for  # noqa: E402

from agent_helpers import make_char_tokenizer, make_trainer  # noqa: E402

POLICY = {"name": "p", "controllers": [{"name": "c", "probe": "custom.x", "knob": "learning_rate", "setpoint": 0.0,
                                        "kp": 1.0}]}


def deepspeed_trainer(tmp_path, monkeypatch, config: dict):
    trainer = make_trainer(tmp_path, make_char_tokenizer(), steps=4)
    monkeypatch.setattr(trainer, "is_deepspeed_enabled", True, raising=False)
    # what the agent reads of accelerate's DeepSpeed plugin (its property cannot be set)
    monkeypatch.setattr(trainer, "accelerator", SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config=config))))
    return trainer


@pytest.mark.parametrize("config,reason", [
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}},
     r"offload_param.device='nvme' is not supported: ZeRO-Infinity offload to NVMe needs a local NVMe device"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
     r"offload_optimizer.device='cpu' is not supported: offload to 'cpu' was not exercised"),
    ({"zero_optimization": {"stage": 1}}, r"ZeRO stage 1 is not supported: only stages 2 and 3 were run"),
    ({"zero_optimization": {"stage": 0}}, r"ZeRO stage 0 is not supported"),
    ({"zero_optimization": {"stage": 3}, "pipeline": {"stages": 2}}, r"pipeline parallelism is not supported"),
    ({"zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": 2}},
     r"tensor or sequence parallelism is not supported"),
])
def test_untested_deepspeed_setups_are_refused_with_their_reason(tmp_path, monkeypatch, config, reason):
    trainer = deepspeed_trainer(tmp_path, monkeypatch, config)
    cb = ActuatorCallback(POLICY, connection="http://127.0.0.1:9").attach(trainer)
    with pytest.raises(ConfigError, match=reason):
        trainer.callback_handler.on_train_begin(trainer.args, trainer.state, trainer.control)
    assert cb.session.run_id is None and cb.session.client is None and cb.session.sender is None


@pytest.mark.parametrize("stage", [2, 3])
def test_zero2_and_zero3_without_offload_are_taken(tmp_path, monkeypatch, stage):
    trainer = deepspeed_trainer(tmp_path, monkeypatch, {"zero_optimization": {"stage": stage, "offload_param": {
        "device": "none"}}})
    assert _hf_compat.sharding_unsupported(trainer) is None


def test_learning_rate_under_a_deepspeed_config_scheduler_is_refused(tmp_path, monkeypatch):
    """A scheduler from the DeepSpeed config steps inside ``engine.step()`` and writes its own lr
    back (measured: a param_groups write lasted one step); the HF Trainer's LambdaLR is steered."""
    from deepspeed.runtime.lr_schedules import WarmupLR

    trainer = deepspeed_trainer(tmp_path, monkeypatch, {"zero_optimization": {"stage": 3}})
    optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    wrapped = SimpleNamespace(scheduler=WarmupLR(optimizer, warmup_max_lr=1e-3, warmup_num_steps=1))  # accelerate's wrapper
    with pytest.raises(ConfigError, match=r"knobs.learning_rate: .*WarmupLR from the DeepSpeed config steps inside "
                                          r"engine.step\(\) .* a change would last one step"):
        setter_for("learning_rate", trainer=trainer, optimizer=optimizer, lr_scheduler=wrapped)
    hf_optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    lambda_lr = torch.optim.lr_scheduler.LambdaLR(hf_optimizer, lambda step: 1.0)
    assert setter_for("learning_rate", trainer=trainer, optimizer=hf_optimizer, lr_scheduler=lambda_lr).read() == 1e-3
