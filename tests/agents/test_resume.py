"""Resume with ``restore_callback_states_from_checkpoint=True`` (transformers rebuilds every stateful
callback from the checkpoint's trainer_state.json): a real run is interrupted after a checkpoint,
resumed by a new Trainer, and the same controlled run continues with its probes, sequence numbers
and decisions."""

from __future__ import annotations

import json

import httpx
import pytest
from transformers import TrainerCallback

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.probes import KLDrift

from agent_helpers import HELD_OUT, SlowSteps, make_trainer

POLICY = {
    "name": "resume-drift-lr",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 5.0, "ki": 1.0}],
}


class CrashAfterSave(TrainerCallback):
    """The job dies right after the checkpoint at ``step`` is written (after what was observed by
    then has been delivered)."""

    def __init__(self, cb: ActuatorCallback, step: int) -> None:
        self.cb, self.step = cb, step

    def on_save(self, args, state, control, **kw):
        if state.global_step == self.step:
            self.cb.session.sender.flush(10.0)
            raise RuntimeError("node lost")


def _callback(url: str, tok) -> ActuatorCallback:
    return ActuatorCallback(POLICY, connection=url, knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
                            probes=[KLDrift(HELD_OUT, tok, every=2, max_length=32)], reporting=Reporting(budget_share=1.0))


@pytest.mark.parametrize("how", ["callbacks", "attach"])
def test_resume_restoring_callback_states_continues_the_same_run(how, tmp_path, char_tokenizer, sqlite_service):
    url = sqlite_service.url
    first = _callback(url, char_tokenizer)
    trainer = make_trainer(tmp_path, char_tokenizer, steps=12, scheduler="constant", save_strategy="steps",
                           save_steps=3, callbacks=[first])
    trainer.add_callback(SlowSteps())
    trainer.add_callback(CrashAfterSave(first, step=6))
    try:
        with pytest.raises(RuntimeError, match="node lost"):
            trainer.train()
    finally:
        first.session.sender.close(1.0)
    saved = json.loads((tmp_path / "out" / "checkpoint-6" / "trainer_state.json").read_text())
    saved = saved["stateful_callbacks"]["ActuatorCallback"]
    assert saved["attributes"]["run_id"] == first.session.run_id and saved["attributes"]["seq"] > 0
    # The contract transformers relies on: the saved args rebuild a callback.
    rebuilt = ActuatorCallback(**saved["args"])
    assert rebuilt.session.url == url and rebuilt.session.knob_bounds == first.session.knob_bounds

    second = _callback(url, char_tokenizer)
    trainer = make_trainer(tmp_path, char_tokenizer, steps=12, scheduler="constant", save_strategy="steps",
                           save_steps=3, restore_callback_states_from_checkpoint=True,
                           callbacks=[second] if how == "callbacks" else None)
    if how == "attach":
        second.attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-6"))

    assert trainer.state.global_step == 12
    ours = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ActuatorCallback)]
    assert ours == [second]  # the configured callback (with its probes) did the work
    assert second.session.run_id == first.session.run_id
    assert [r["id"] for r in httpx.get(f"{url}/v1/runs").json()] == [first.session.run_id]
    run = httpx.get(f"{url}/v1/runs/{first.session.run_id}").json()
    # Sequence numbers continue from the checkpoint: every observation after it stored, once.
    assert second.session.seq > saved["attributes"]["seq"]
    assert run["last_seq"] == second.session.seq - 1 and run["state"] == "finished"
    # probes ran after the resume: a baseline where it starts, then on their schedule
    assert [h["step"] for h in second.session.history if "kl_drift" in h["probes"]] == [6, 8, 10, 12]
    assert second.session.last_decision >= saved["attributes"]["last_decision"]
    assert run["knobs_in_effect"]["learning_rate"] == pytest.approx(second.session.history[-1]["knobs"]["learning_rate"])
