"""Shared helpers of the agent tests: tiny trainers, scripted probes; the in-process tokenizer
and tiny datasets are the package's (actuator.agents.testing)."""

from __future__ import annotations

import time

from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator.agents.models import tiny_llama
from actuator.agents.probes import Probe
from actuator.agents.testing import HELD_OUT, NARROW_TASK, lm_dataset
from actuator.agents.testing import char_tokenizer as make_char_tokenizer

__all__ = ["HELD_OUT", "NARROW_TASK", "Canary", "SlowSteps", "lm_dataset", "make_char_tokenizer", "make_trainer",
           "record_lr_used"]


class SlowSteps(TrainerCallback):
    """Tiny steps take milliseconds; a short pause lets the service's answers land mid-run."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kw):
        time.sleep(self.seconds)


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
