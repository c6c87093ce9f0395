"""Shared helpers of the agent tests: an in-process tokenizer, tiny datasets, tiny trainers."""

from __future__ import annotations

import string
import time

from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator.agents.models import tiny_llama
from actuator.agents.probes import Probe


def make_char_tokenizer():
    """A character-level tokenizer built in-process (no download), 128 ids like tiny_llama."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(string.ascii_letters + string.digits + string.punctuation + " \n")
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    assert len(vocab) <= 128
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def lm_dataset(tokenizer, texts: list[str], length: int = 32):
    """A datasets.Dataset of fixed-length causal-LM examples (labels = input ids)."""
    from datasets import Dataset

    enc = tokenizer(texts, truncation=True, max_length=length, padding="max_length")
    labels = [[t if m else -100 for t, m in zip(ids, mask)] for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


NARROW_TASK = [f"{a} plus {b} is {a + b}." for a in range(12) for b in range(12)]
HELD_OUT = ["The quick brown fox jumps over the lazy dog.", "Rain falls on the green hills in spring.",
            "A small boat drifted across the quiet lake.", "She wrote a letter to her old friend."]


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
