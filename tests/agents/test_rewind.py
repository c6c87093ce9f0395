"""Issue 56: rewind on a real ``Trainer.train()`` against the real service. The agent saves at healthy
probe readings and keeps the newest K (never touching the user's checkpoints); a planted fault makes
the guardrail rewind to one of those saves and the optimizer then steps with the damped learning
rate; the escalation ladder's last rung halts; keep-best loads the best reading's weights at the end
(agents/checkpoints.py, actuator/engine.py)."""

from __future__ import annotations

import os

import httpx
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.checkpoints import OWN_DIR
from actuator.agents.probes import Probe
from agent_helpers import Canary, SlowSteps, make_trainer, record_lr_used

LR = 5e-3


class Watch(TrainerCallback):
    """Added after the agent: the agent's own checkpoint folders after every step, and the weights
    right after the first rollback and at the last step (before ``on_train_end``)."""

    def __init__(self, cb, root) -> None:
        self.cb, self.root = cb, root
        self.ever: set[str] = set()
        self.after_rollback = None
        self.last = None

    def on_step_end(self, args, state, control, model=None, **kw):
        if os.path.isdir(self.root):
            self.ever |= set(os.listdir(self.root))
        weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if self.cb.session.rollbacks and self.after_rollback is None:
            self.after_rollback = weights
        self.last = weights


def _guardrail(action="rollback"):
    return {"name": "canary", "probe": "custom.canary", "bound": "upper", "threshold": 0.5, "action": action,
            "knob": "learning_rate", "factor": 0.5}


def _events(service, run_id, kind="guardrail_breach"):
    events = httpx.get(f"{service.url}/v1/runs/{run_id}/events", params={"limit": 1000}).json()
    return [e for e in events if e["kind"] == kind]


def test_healthy_saves_are_pruned_to_k_and_the_rewind_uses_one(tmp_path, char_tokenizer, sqlite_service):
    """The user saves every 30 steps (no checkpoint before the fault: a rollback would have to halt);
    the agent saves every 3 healthy steps and keeps 2. The canary goes bad at step 20: the rollback
    goes back to the agent's newest healthy save, and the optimizer steps on with the learning rate
    halved."""
    trainer = make_trainer(tmp_path, char_tokenizer, steps=36, scheduler="constant", lr=LR, save_strategy="steps",
                           save_steps=30)
    used = record_lr_used(trainer)
    policy = {"name": "rewind-saves", "guardrails": [_guardrail()],
              "rewind": {"healthy_saves": {"keep": 2, "every": 3}}}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Canary(trainer, bad_from=20)],
                          reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2}}).attach(trainer)
    root = os.path.join(trainer.args.output_dir, OWN_DIR)
    watch = Watch(cb, root)
    trainer.add_callback(SlowSteps())
    trainer.add_callback(watch)
    trainer.train()

    assert trainer.state.global_step == 36
    # One rewind (not a halt: the user saved nothing before the fault), to the agent's own save.
    assert len(cb.session.rollbacks) == 1, cb.session.rollbacks
    rb = cb.session.rollbacks[0]
    assert rb["to_step"] < 20 <= rb["at_step"], rb
    assert rb["checkpoint"] == os.path.join(root, f"checkpoint-{rb['to_step']}")
    # The weights after the rewind are exactly the save's.
    saved = load_file(os.path.join(rb["checkpoint"], "model.safetensors"))
    assert all(torch.equal(saved[k], watch.after_rollback[k]) for k in saved)
    # The damped knob is what the optimizer used from the rewind on (constant schedule: 0.5 x).
    at = rb["at_step"]
    assert used[at - 1] == pytest.approx(LR, rel=1e-9)
    assert used[at] == pytest.approx(LR * 0.5, rel=1e-9), used
    # Saved at healthy readings and pruned to K = 2 confirmed saves (plus at most one awaiting the
    # service's word); the saves of the bad stretch after the rewind target are gone.
    kept = sorted(os.listdir(root))
    assert len(watch.ever) > len(kept) >= 2, (watch.ever, kept)
    assert f"checkpoint-{rb['to_step']}" in kept
    confirmed = [s for s in cb.keeper.saves if s.confirmed]
    assert len(confirmed) <= 2 and {f"checkpoint-{s.step}" for s in cb.keeper.saves} == set(kept)
    # The user's checkpoints are untouched.
    assert {"checkpoint-30", "checkpoint-36"} <= set(os.listdir(trainer.args.output_dir))
    # The audit trail: the breach's rung and last healthy step; the saves' cost in the observations.
    breach = _events(sqlite_service, cb.session.run_id)
    assert [e["payload"]["action"] for e in breach] == ["rollback"]
    assert breach[0]["payload"]["healthy_step"] >= rb["to_step"]
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["latest_metrics"]["checkpoint.save_seconds"] > 0
    assert run["latest_metrics"]["checkpoint.saves"] == len(watch.ever)
    # The checkpoint the agent used is in the run's record too (the observations after the rewind).
    assert (run["latest_metrics"]["rewind.to_step"], run["latest_metrics"]["rewind.at_step"]) == (rb["to_step"], at)


class Windows(Probe):
    """``custom.canary`` reads 1.0 (bad) in the steps of ``bad`` windows, 0.0 otherwise."""

    name = "canary"

    def __init__(self, trainer, bad: list[range]) -> None:
        self._init_schedule(1, False)
        self.trainer, self.bad = trainer, bad

    def _measure(self, model, *, max_examples=None):
        step = self.trainer.state.global_step
        return {"custom.canary": 1.0 if any(step in w for w in self.bad) else 0.0}


def test_the_ladder_damps_then_rewinds_then_halts(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=60, scheduler="constant", lr=LR)
    used = record_lr_used(trainer)
    policy = {"name": "rewind-ladder", "guardrails": [_guardrail()],
              "rewind": {"healthy_saves": {"keep": 2, "every": 2},
                         "ladder": {"window": 100, "rungs": [{"action": "adjust"}, {"action": "rollback"},
                                                             {"action": "halt"}]}}}
    cb = ActuatorCallback(policy, connection=sqlite_service.url,
                          probes=[Windows(trainer, [range(8, 11), range(20, 23), range(32, 35)])],
                          reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2}}).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()

    # Third firing: halted, soon after step 32.
    assert 32 < trainer.state.global_step < 45
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["state"] == "halted"
    breach = [e["payload"] for e in _events(sqlite_service, cb.session.run_id)]
    assert [(b["action"], b["rung"]) for b in breach] == [("adjust", 1), ("rollback", 2), ("halt", 3)], breach
    assert all("rung" in b["reason"] and "of the rewind ladder" in b["reason"] for b in breach)
    assert breach[1]["healthy_step"] < 20
    # Rung 1 damped without a rewind, rung 2 rewound once and damped again.
    assert len(cb.session.rollbacks) == 1 and cb.session.rollbacks[0]["to_step"] < 20 <= cb.session.rollbacks[0]["at_step"]
    first_damp = next(i for i, lr in enumerate(used) if lr < LR)
    assert 8 <= first_damp < 20 and used[first_damp] == pytest.approx(LR * 0.5, rel=1e-9)
    assert used[cb.session.rollbacks[0]["at_step"]] == pytest.approx(LR * 0.25, rel=1e-9)


class Score(Probe):
    """``custom.score`` peaks at step ``peak`` and falls after (a probe trained past its best)."""

    name = "score"

    def __init__(self, trainer, peak: int) -> None:
        self._init_schedule(1, False)
        self.trainer, self.peak = trainer, peak

    def _measure(self, model, *, max_examples=None):
        return {"custom.score": -abs(self.trainer.state.global_step - self.peak)}


def test_keep_best_loads_the_best_readings_weights_at_the_end(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=24, scheduler="constant", lr=LR)
    policy = {"name": "rewind-best", "rewind": {"keep_best": {"probe": "custom.score", "mode": "max"}}}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Score(trainer, peak=9)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    root = os.path.join(trainer.args.output_dir, OWN_DIR)
    watch = Watch(cb, root)
    trainer.add_callback(watch)
    trainer.train()

    assert trainer.state.global_step == 24
    # Every new best was saved, the previous one deleted: only the peak's checkpoint is left.
    assert "checkpoint-3" in watch.ever and sorted(os.listdir(root)) == ["checkpoint-9"]
    best = load_file(os.path.join(root, "checkpoint-9", "model.safetensors"))
    live = trainer.model.state_dict()
    assert all(torch.equal(best[k], live[k]) for k in best)  # the model is step 9's ...
    assert any(not torch.equal(watch.last[k], live[k]) for k in best)  # ... not the last step's
    assert cb.kept == {"step": 9, "value": 0.0, "checkpoint": os.path.join(root, "checkpoint-9"), "loaded": True,
                       "probe": "custom.score", "mode": "max"}
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["latest_metrics"]["keep_best.step"] == 9 and run["latest_metrics"]["keep_best.loaded"] == 1


def test_keep_best_at_end_last_leaves_the_last_model(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=12, scheduler="constant", lr=LR)
    policy = {"name": "rewind-last", "rewind": {"keep_best": {"probe": "custom.score", "mode": "max",
                                                              "at_end": "last"}}}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Score(trainer, peak=5)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    watch = Watch(cb, os.path.join(trainer.args.output_dir, OWN_DIR))
    trainer.add_callback(watch)
    trainer.train()
    live = trainer.model.state_dict()
    assert all(torch.equal(watch.last[k], live[k]) for k in live)
    assert cb.kept["step"] == 5 and cb.kept["loaded"] is False
    assert os.listdir(os.path.join(trainer.args.output_dir, OWN_DIR)) == ["checkpoint-5"]
