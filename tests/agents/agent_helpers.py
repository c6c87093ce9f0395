"""Shared helpers of the agent tests: tiny trainers, scripted probes; the in-process tokenizer
and tiny datasets are the package's (actuator.agents.testing)."""

from __future__ import annotations

import threading
import time
from typing import Any

from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator.agents.models import tiny_llama
from actuator.agents.probes import Probe
from actuator.agents.testing import HELD_OUT, NARROW_TASK, lm_dataset
from actuator.agents.testing import char_tokenizer as make_char_tokenizer

__all__ = ["HELD_OUT", "NARROW_TASK", "Canary", "Lockstep", "NetworkCalls", "SlowSteps", "lm_dataset", "make_char_tokenizer", "make_trainer",
           "record_lr_used"]


class SlowSteps(TrainerCallback):
    """Tiny steps take milliseconds; a short pause lets the service's answers land mid-run."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kw):
        time.sleep(self.seconds)


class Lockstep(TrainerCallback):
    """Add after the agent's callback: at train start and every step end, wait (up to ``timeout``
    s) until what the agent sent is answered, so each answer is taken at the next step boundary.
    Tiny steps take milliseconds; a test that asserts which decisions were applied at which step
    must not depend on the service answering faster than a step (a loaded machine, a collection
    pause). Ranks without a sender (not rank 0) do not wait: they meet rank 0 at the next collective."""

    def __init__(self, cb: Any, timeout: float = 20.0) -> None:
        self.cb, self.timeout = cb, timeout

    def _wait(self) -> None:
        sender = self.cb.session.sender
        if sender is not None:
            sender.flush(self.timeout)

    def on_train_begin(self, args, state, control, **kw):
        self._wait()

    def on_step_end(self, args, state, control, **kw):
        self._wait()


class NetworkCalls(TrainerCallback):
    """Whether training ever waited on the network, asserted without a clock: every HTTP call of
    the agent's client (ActuatorClient._request, still made for real) is recorded with the thread it
    ran on and whether training steps were under way (from the first step's start to the end of
    step ``steps``: add this callback last, so that its step end follows the agent's);
    ``steps_overlapped`` counts the step ends that passed while a request was in flight.
    ``on_training_thread()``: the calls made on the training thread while steps ran (none may be)."""

    def __init__(self, monkeypatch, steps: int) -> None:
        from actuator.client import ActuatorClient

        self.steps = steps
        self.training_thread: int | None = None
        self.stepping = False
        self.calls: list[dict[str, Any]] = []
        self.in_flight = 0
        self.steps_overlapped = 0
        self._lock = threading.Lock()
        request = ActuatorClient._request

        def recorded(client, method, path, **kw):
            record = {"thread": threading.get_ident(), "name": threading.current_thread().name, "path": path,
                      "during_steps": self.stepping}
            with self._lock:
                self.in_flight += 1
            try:
                return request(client, method, path, **kw)
            finally:
                with self._lock:
                    self.in_flight -= 1
                record["during_steps"] = record["during_steps"] or self.stepping
                self.calls.append(record)

        monkeypatch.setattr(ActuatorClient, "_request", recorded)

    def during_steps(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["during_steps"]]

    def on_training_thread(self) -> list[dict[str, Any]]:
        return [c for c in self.during_steps() if c["thread"] == self.training_thread]

    def on_step_begin(self, args, state, control, **kw):
        self.training_thread = threading.get_ident()
        self.stepping = True

    def on_step_end(self, args, state, control, **kw):
        self.steps_overlapped += self.in_flight > 0
        if state.global_step >= self.steps:
            self.stepping = False


def make_trainer(tmp_path, tokenizer, *, steps: int, scheduler: str = "linear", lr: float = 5e-3, callbacks=None,
                 **overrides):
    """A tiny Trainer; ``overrides`` replace TrainingArguments fields, ``callbacks`` go to Trainer()."""
    model = tiny_llama(seed=0)
    fields = dict(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4, learning_rate=lr,
        lr_scheduler_type=scheduler, warmup_steps=2, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )
    fields.update(overrides)
    return Trainer(model=model, args=TrainingArguments(**fields), train_dataset=lm_dataset(tokenizer, NARROW_TASK),
                   callbacks=callbacks)


def record_lr_used(trainer) -> list[float]:
    """The learning rate each optimizer.step() really ran with, read from the optimizer itself."""
    used: list[float] = []
    trainer.create_optimizer()
    trainer.optimizer.register_step_pre_hook(lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    return used


class Canary(Probe):
    """A probe whose value is scripted by step: healthy (0.0) until ``bad_from``, then 1.0."""

    name = "canary"

    def __init__(self, trainer, bad_from: int) -> None:
        self._init_schedule(1, False)
        self.trainer, self.bad_from = trainer, bad_from

    def _measure(self, model, *, max_examples=None):
        return {"custom.canary": 1.0 if self.trainer.state.global_step >= self.bad_from else 0.0}
