"""Issue 57, no quiet gaps, on a real Trainer.train() against the real service: a halt names the
guardrail, its reading and threshold in the agent's log and in the event the service stores; under
save_strategy="no" it saves no checkpoint; a rollback guardrail on a run that saves no checkpoints
is said at train() start."""

from __future__ import annotations

import logging
import re

import httpx

from actuator.agents.callback import ActuatorCallback, Reporting
from agent_helpers import Canary, SlowSteps, make_trainer


def test_a_halt_names_the_guardrail_reading_and_threshold_and_saves_nothing_under_save_strategy_no(
        tmp_path, char_tokenizer, sqlite_service, caplog):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=40, scheduler="constant")  # save_strategy="no"
    policy = {"name": "halt-why", "guardrails": [
        {"name": "canary-halt", "probe": "custom.canary", "bound": "upper", "threshold": 0.5, "action": "halt"},
        # never breached (the canary reads 0 or 1): only its action matters, at train() start
        {"name": "canary-restore", "probe": "custom.canary", "bound": "upper", "threshold": 5.0, "action": "rollback",
         "knob": "learning_rate", "factor": 0.5}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, probes=[Canary(trainer, bad_from=6)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps())
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    stopped = trainer.state.global_step
    assert 6 < stopped < 40 and cb.session.run_state == "halted"
    text = caplog.text

    # train() start: the rollback guardrail has nothing to roll back to.
    assert re.search(r"guardrail\(s\) canary-restore may order a rollback, which would halt the run instead: "
                     r"save_strategy='no' saves no checkpoint", text), text

    # The event the service stored names the guardrail, the reading, the threshold and the step ...
    events = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/events").json()
    breach = next(e for e in events if e["kind"] == "guardrail_breach")
    stored = breach["payload"]
    assert stored["guardrail"] == "canary-halt" and stored["value"] == 1.0 and stored["threshold"] == 0.5
    reason = stored["reason"]
    assert reason == f"guardrail canary-halt: custom.canary 1 above threshold 0.5 at step {breach['step']} (halt)"
    # ... and so does the agent's log, with the step it stopped at and no checkpoint.
    assert (f"the controller halted this run at step {stopped}: {reason}; stopping (no checkpoint saved)"
            in text), text
    assert not list((tmp_path / "out").glob("checkpoint-*"))
