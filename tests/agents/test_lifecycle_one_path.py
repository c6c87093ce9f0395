"""One lifecycle: ``ActuatorCallback`` under a real ``Trainer.train()`` and ``ControlSession`` in a
loop of one's own take the same path (issue 52).

The same tiny run is driven both ways against the real service: the same model, optimizer,
schedule, probe readings (scripted by their count, so training data does not move them) and
policy (a controller on the learning rate and a guardrail that orders one rollback), checkpoints
every 3 steps. The sender is flushed at each step boundary in both, so every answer lands at the
same boundary. Both runs then go through the same lifecycle phases at the same steps and the
service stores the same registration, observations and decisions; the one rollback goes back to
the same checkpoint step.
"""

from __future__ import annotations

import os

import torch
from transformers import get_linear_schedule_with_warmup

from actuator.agents.callback import ActuatorCallback
from actuator.agents.knobs import LearningRateKnob
from actuator.agents.models import tiny_llama
from actuator.agents.probes import Probe
from actuator.agents.session import ControlSession, Reporting, TrainerParts
from actuator.client import ActuatorClient
from actuator.store import Store

from agent_helpers import NARROW_TASK, Lockstep, lm_dataset, make_trainer

STEPS, SAVE_EVERY, LR, WARMUP = 12, 3, 5e-3, 2
POLICY = {
    "name": "one-path",
    "controllers": [{"name": "count-lr", "probe": "custom.count", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 0.2}],
    "guardrails": [{"name": "bad-reading", "probe": "custom.bad", "bound": "upper", "threshold": 0.5,
                    "action": "rollback", "consecutive": 1}],
}
KNOBS = {"learning_rate": {"min": 1e-4, "max": 1e-2, "max_step": 0.3}}


class Counter(Probe):
    """Every 2 steps: how many readings came before, and one bad reading (the fifth)."""

    name = "counter"

    def __init__(self) -> None:
        self._init_schedule(2, False)
        self.n = 0

    def _measure(self, model, *, max_examples=None):
        n, self.n = self.n, self.n + 1
        return {"custom.count": float(n), "custom.bad": 1.0 if n == 4 else 0.0}


def _by_trainer(tmp_path, tok, url: str) -> ControlSession:
    cb = ActuatorCallback(POLICY, knobs=KNOBS, probes=[Counter()], connection=url, run="by-trainer",
                          reporting=Reporting(budget_share=1.0))
    trainer = make_trainer(tmp_path / "trainer", tok, steps=STEPS, lr=LR, warmup_steps=WARMUP, save_strategy="steps",
                           save_steps=SAVE_EVERY, callbacks=[cb])
    trainer.add_callback(Lockstep(cb))
    trainer.train()
    return cb.session


def _by_own_loop(tmp_path, tok, url: str) -> ControlSession:
    torch.manual_seed(0)
    model = tiny_llama(seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, WARMUP, STEPS)
    out = tmp_path / "loop"

    def load(path: str) -> None:
        state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])

    session = ControlSession(POLICY, setters=[LearningRateKnob(optimizer, scheduler)], knobs=KNOBS,
                             probes=[Counter()], connection=url, run="by-own-loop",
                             reporting=Reporting(budget_share=1.0))
    session.begin(model, max_steps=STEPS, warmup=WARMUP, parts=TrainerParts(load=load, saves_checkpoints=True))
    session.sender.flush(20.0)
    data = lm_dataset(tok, NARROW_TASK)
    for step in range(1, STEPS + 1):
        batch = data[(step - 1) * 4: step * 4]
        ids = torch.tensor(batch["input_ids"])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        session.step(step, model, metrics={"loss": loss.item()})
        session.sender.flush(20.0)
        if step % SAVE_EVERY == 0:
            path = out / f"checkpoint-{step}"
            path.mkdir(parents=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict()}, path / "state.pt")
            session.checkpoint_saved(step, str(path))
    session.finish(STEPS)
    return session


def _stored(url: str, db: str, run_id: str) -> dict:
    with ActuatorClient(url) as client:
        run = client.get_run(run_id)
        decisions = client.list_decisions(run_id, limit=1000).items
    store = Store(db)
    try:
        observations = [(o.seq, o.step, o.probes, o.knobs) for o in store.list_observations(run_id)]
    finally:
        store.close()
    return {
        "state": run.state,
        "knobs": {k: v.model_dump() for k, v in run.knobs.items()},
        "policy": (run.policy_name, run.policy_version),
        "observations": observations,
        "decisions": [(d.number, d.step, d.knob, d.old_value, d.new_value, d.applied_step, d.applied_value, d.skipped)
                      for d in decisions],
    }


def test_the_callback_and_an_own_loop_take_the_same_lifecycle(tmp_path, char_tokenizer, sqlite_service):
    url, db = sqlite_service.url, f"sqlite:///{tmp_path / 'actuator.db'}"
    hf = _by_trainer(tmp_path, char_tokenizer, url)
    own = _by_own_loop(tmp_path, char_tokenizer, url)

    # the same phases, at the same steps, in the same order
    assert list(hf.phases) == list(own.phases)
    names = [name for name, _ in hf.phases]
    assert names[:6] == ["open", "bind", "identify", "register", "share", "start"], names
    for phase in ("probe", "step", "apply", "checkpoint", "rewind", "finish"):
        assert phase in names, (phase, names)
    # the one rollback, to the last checkpoint saved while every guardrail held (step 6), both ways
    assert [(r["at_step"], r["to_step"]) for r in hf.rollbacks] == [(r["at_step"], r["to_step"])
                                                                    for r in own.rollbacks] == [(9, 6)]

    # what the service stored: the same registration, observations and decisions
    stored_hf, stored_own = _stored(url, db, hf.run_id), _stored(url, db, own.run_id)
    assert hf.run_id != own.run_id
    assert stored_hf["state"] == stored_own["state"] == "finished"
    assert stored_hf["knobs"] == stored_own["knobs"]
    assert stored_hf["observations"] == stored_own["observations"]
    assert [o[1] for o in stored_hf["observations"]][:2] == [0, 2]  # the baseline, then every 2 steps
    assert stored_hf["decisions"] == stored_own["decisions"]
    applied = [d for d in stored_hf["decisions"] if d[5] is not None]
    assert applied, stored_hf["decisions"]
    assert [(e["number"], e["step"], e["applied"]) for e in hf.applied] == [
        (e["number"], e["step"], e["applied"]) for e in own.applied]
