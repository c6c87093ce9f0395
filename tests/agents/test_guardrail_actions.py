"""Guardrail actions end to end on a real Trainer: halt leaves a checkpoint; rollback restores
exactly the saved weights and training continues with a damped learning rate."""

from __future__ import annotations

import os

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from actuator.agents.callback import ActuatorCallback, Protect, Reporting
from agent_helpers import Canary, SlowSteps, make_trainer, record_lr_used


def test_halt_stops_training_and_leaves_a_checkpoint(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=40, scheduler="constant", save_strategy="steps",
                           save_steps=1000)  # a run that saves checkpoints: the halt saves one too
    policy = {"name": "halt-test", "guardrails": [{"name": "canary-halt", "probe": "custom.canary",
                                                   "bound": "upper", "threshold": 0.5, "action": "halt"}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Canary(trainer, bad_from=6)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()
    stopped = trainer.state.global_step
    assert 6 < stopped < 40, "halt must stop training early, soon after the breach"
    ckpt = tmp_path / "out" / f"checkpoint-{stopped}"
    assert (ckpt / "model.safetensors").exists()
    saved = load_file(ckpt / "model.safetensors")
    live = trainer.model.state_dict()
    assert all(torch.equal(saved[k], live[k]) for k in saved)
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["state"] == "halted"
    assert run["guardrails"]["canary-halt"]["active"] is True


class Snapshot(TrainerCallback):
    """Captures the weights right after a rollback happened at a step boundary."""

    def __init__(self, cb) -> None:
        self.cb, self.seen, self.weights = cb, 0, None

    def on_step_end(self, args, state, control, model=None, **kw):
        if len(self.cb.session.rollbacks) > self.seen and self.weights is None:
            self.seen = len(self.cb.session.rollbacks)
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_rollback_restores_saved_weights_and_training_continues(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=30, scheduler="constant")
    trainer.args.save_strategy = "steps"
    trainer.args.save_steps = 3
    used = record_lr_used(trainer)
    cb = ActuatorCallback(protect=Protect({"custom.canary": 0.5}, on_breach="rollback"), connection=sqlite_service.url,
                          probes=[Canary(trainer, bad_from=10)], reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2}}).attach(trainer)
    snap = Snapshot(cb)
    trainer.add_callback(snap)
    trainer.add_callback(SlowSteps())
    trainer.train()

    assert trainer.state.global_step == 30, "training continues after a rollback"
    assert len(cb.session.rollbacks) == 1
    rb = cb.session.rollbacks[0]
    assert rb["to_step"] < 10 <= rb["at_step"], rb  # a checkpoint from before the breach
    saved = load_file(os.path.join(rb["checkpoint"], "model.safetensors"))
    assert snap.weights is not None
    for k, v in saved.items():
        assert torch.equal(snap.weights[k], v), k
    # continue with a damped knob: the lr used after the rollback is half the one before
    assert used[rb["at_step"]] == pytest.approx(used[0] * 0.5, rel=1e-9)
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert decisions and "guardrail" in decisions[0]["reason"]
