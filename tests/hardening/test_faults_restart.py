"""The controller is SIGKILLed mid-run and restarted on the same port and database while a real
``Trainer.train()`` runs under ``ActuatorCallback``.

What must hold:
- training never stalls: no step boundary-to-boundary interval exceeds the sender's HTTP timeout
  plus a margin (the kill, the outage and the restart all happen during training);
- every observation arrives: the stored sequence numbers are exactly 0..n-1 (no gap, none twice),
  including those taken during the outage, and the sender dropped nothing;
- controller state is restored from the store and the loop is bumpless: the decisions the
  service took across the restart are exactly those of an engine that never stopped, replaying
  the same observations; the first decision after the restart starts from the value the last one
  before it set, and moves by no more than the knob's rate limit.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from datetime import datetime, timezone

import httpx
import pytest
from transformers import TrainerCallback

import actuator.agents.session as session_module  # the session builds the sender and client
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from actuator.agents.sender import BackgroundSender
from actuator.engine import Engine, RunContext
from actuator.policy import PolicyDocument
from actuator.schemas import ObservationCreate
from agent_helpers import HELD_OUT, NetworkCalls, SlowSteps, make_trainer
from harden import StepClock, StoreView
from actuator.testing import make_service

POLICY = {
    "name": "restart-drift",
    # a slow controller that keeps deciding through the whole run (drift never reaches 0)
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 0.5, "ki": 0.1}],
}
MAX_STEP = 0.2  # log units per decision
HTTP_TIMEOUT = 0.5  # the callback's (the sender's) request timeout


class KillThenRestart(TrainerCallback):
    """SIGKILL the service at one step; restart it (same port, same database) from another
    thread at a later step: the training loop itself never waits for the service to come back."""

    def __init__(self, service, kill_at: int, restart_at: int, cb: ActuatorCallback) -> None:
        self.service, self.kill_at, self.restart_at, self.cb = service, kill_at, restart_at, cb
        self.killed_at = self.up_at = None
        self.seq_at_kill = self.seq_at_up = None
        self.thread: threading.Thread | None = None

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.kill_at:
            self.service.kill()
            self.killed_at, self.seq_at_kill = time.monotonic(), self.cb.session.seq
            self.killed_wall = datetime.now(timezone.utc).replace(tzinfo=None)
        if state.global_step == self.restart_at:
            self.thread = threading.Thread(target=self._restart, daemon=True)
            self.thread.start()

    def _restart(self) -> None:
        self.service.start(timeout=60)
        self.up_at, self.seq_at_up = time.monotonic(), self.cb.session.seq


@pytest.fixture
def fast_backoff(monkeypatch):
    """The callback builds its sender with the defaults (0.5 s doubling up to 30 s); a test of a
    few seconds uses tighter bounds so delivery resumes within a second of the restart."""
    monkeypatch.setattr(session_module, "BackgroundSender",
                        functools.partial(BackgroundSender, initial_backoff=0.05, max_backoff=0.5))


def test_controller_killed_and_restarted_mid_run(tmp_path, char_tokenizer, fast_backoff, caplog, monkeypatch):
    db = f"sqlite:///{tmp_path / 'actuator.db'}"
    svc = make_service(db, log_dir=str(tmp_path)).start()
    steps = 150
    trainer = make_trainer(tmp_path, char_tokenizer, steps=steps, scheduler="constant")
    cb = ActuatorCallback(
        POLICY, connection=Connection(svc.url, timeout=HTTP_TIMEOUT, flush_timeout=30.0),
        knobs={"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": MAX_STEP}},
        probes=[KLDrift(HELD_OUT, char_tokenizer, every=3, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    faults = KillThenRestart(svc, kill_at=20, restart_at=35, cb=cb)
    clock = StepClock()
    calls = NetworkCalls(monkeypatch, steps)
    trainer.add_callback(faults)
    trainer.add_callback(SlowSteps(0.03))
    trainer.add_callback(clock)
    trainer.add_callback(calls)  # last: its step end follows the agent's
    try:
        with caplog.at_level(logging.INFO, logger="actuator.agents"):
            trainer.train()
        assert faults.thread is not None
        faults.thread.join(60)
        assert faults.up_at is not None, "the service did not come back"

        # -- training never stalled: no request ran on the training thread while steps ran (asserted
        # by thread, not by step times: the machine may be loaded) --------------------------------
        assert trainer.state.global_step == steps
        assert calls.during_steps() and calls.on_training_thread() == []
        worst = max(clock.intervals)
        outage_steps = [dt for t, dt in zip(clock.times[1:], clock.intervals) if faults.killed_at <= t <= faults.up_at]
        assert len(outage_steps) >= 10, "the outage should span training steps"

        # -- nothing lost, nothing twice ---------------------------------------------------------
        sender = cb.session.sender
        assert sender is not None
        assert sender.stats.dropped == 0 and sender.backlog == 0, sender.stats
        view = StoreView(db)
        try:
            seqs = view.seqs(cb.session.run_id)
            assert seqs == list(range(cb.session.seq)), f"stored {len(seqs)} of {cb.session.seq}"
            assert faults.seq_at_up > faults.seq_at_kill, "observations were taken during the outage"
            run = view.store.get_run(cb.session.run_id)
            decisions, _ = view.store.list_decisions(cb.session.run_id, limit=10_000)
            observations = view.store.list_observations(cb.session.run_id, limit=10_000)
            registered = next(e for e in view.store.list_events(cb.session.run_id) if e.kind == "run_registered")
        finally:
            view.close()
        warnings = [r.getMessage() for r in caplog.records if "controller unreachable" in r.getMessage()]
        assert len(warnings) == 1, warnings
        assert any("reachable again" in r.getMessage() for r in caplog.records)

        # -- state restored from the store: the decisions are those of a controller that never stopped
        engine = Engine(PolicyDocument.model_validate(POLICY))
        ctx = RunContext.from_json(registered.payload["knobs"])
        replayed = []
        for o in observations:
            replayed.extend(engine.observe(ctx, ObservationCreate(seq=o.seq, step=o.step, probes=o.probes,
                                                                  metrics=o.metrics, knobs=o.knobs)).decisions)
        assert [(d.number, d.step) for d in decisions] == [(d.number, d.step) for d in replayed]
        for got, want in zip(decisions, replayed):
            assert got.new_value == pytest.approx(want.new_value, rel=1e-12)
            assert got.old_value == pytest.approx(want.old_value, rel=1e-12)
        assert run.controllers["drift"]["pid"] == pytest.approx(ctx.to_json()["controllers"]["drift"]["pid"])

        # -- bumpless across the restart -----------------------------------------------------------
        def naive(t: datetime) -> datetime:
            return t.astimezone(timezone.utc).replace(tzinfo=None) if t.tzinfo else t

        before = [d for d in decisions if naive(d.created_at) < faults.killed_wall]
        after = decisions[len(before):]
        assert all(naive(d.created_at) > faults.killed_wall for d in after)
        assert before and after, "decisions on both sides of the outage"
        first = after[0]
        assert first.old_value == pytest.approx(before[-1].new_value, rel=1e-12), "restarted from the last value"
        assert abs(math.log(first.new_value / first.old_value)) <= MAX_STEP + 1e-9
        # and every decision of the run respects the rate limit (no jump anywhere)
        assert all(abs(math.log(d.new_value / d.old_value)) <= MAX_STEP + 1e-9 for d in decisions)

        # -- the agent applied each decision once, in order --------------------------------------
        numbers = [e["number"] for e in cb.session.applied]
        assert numbers == sorted(set(numbers)) and numbers, numbers
        print(f"\nrestart: {steps} steps, worst step {worst * 1000:.0f} ms, "
              f"outage {faults.up_at - faults.killed_at:.1f}s "
              f"over {len(outage_steps)} steps, observations {cb.session.seq} (taken during the outage "
              f"{faults.seq_at_up - faults.seq_at_kill}), decisions {len(before)} before / {len(after)} after, "
              f"applied {len(cb.session.applied)}")
        state = httpx.get(f"{svc.url}/v1/runs/{cb.session.run_id}").json()
        assert state["state"] == "finished"
        assert cb.session.run_token not in caplog.text
    finally:
        svc.stop()
