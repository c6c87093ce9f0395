"""The reverse-spelling SFT task on SmolLM2-135M-Instruct that sft-drift and forgetting share:
the model, data and probes every arm starts from (:class:`Setup`) and the plain ``Trainer`` an
arm trains with (:func:`make_trainer`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from actuator.agents.general import PROBE_PROMPTS as GENERAL_PROMPTS
from actuator.agents.general import PROBE_TEXTS as GENERAL_TEXT
from actuator.agents.general import chat
from benchmarks.control.data import WORDS, collator, task_dataset
from benchmarks.control.harness import console

__all__ = ["Setup", "make_trainer", "task_accuracy", "GENERAL_PROMPTS", "GENERAL_TEXT"]


class Setup:
    """The model, data and probes every arm shares."""

    def __init__(self, seed: int, hotpot_records: int, completion_only: bool = False) -> None:
        from actuator.agents.models import load_smollm2
        from actuator.agents.probes import HotpotQA, KLDrift, Perplexity

        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            # answers must learn to end: pad with <|endoftext|>, not the end-of-turn token
            self.model, self.tok = load_smollm2(pad_with_endoftext=True)
        self.base = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.train = task_dataset(self.tok, 400, seed, completion_only=completion_only)
        self.heldout = task_dataset(self.tok, 32, seed + 1000, completion_only=completion_only)
        self.drift_prompts = [chat(self.tok, q) for q in GENERAL_PROMPTS]
        self.ppl = Perplexity(GENERAL_TEXT, self.tok, every=None, batch_size=4)
        self.hotpot = HotpotQA(None, self.tok, every=None, max_examples=hotpot_records, max_new_tokens=8)
        self.KLDrift = KLDrift

    def reset(self) -> None:
        self.model.load_state_dict(self.base)

    def task_accuracy(self) -> float:
        return task_accuracy(self.model, self.tok)

    def final_metrics(self, trainer: Any) -> dict[str, float]:
        from actuator.agents.probes import ProbeSuite

        task_loss = trainer.evaluate(self.heldout)["eval_loss"]
        suite = ProbeSuite([self.ppl, self.hotpot], budget_share=1.0)
        suite.setup(self.model)
        values = suite.run(self.model, 0, force=True).values
        return {"task_loss": task_loss, "task_accuracy": self.task_accuracy(), "perplexity": values["perplexity"],
                "gold_logprob": values["hotpotqa.gold_logprob"], "hotpotqa_f1": values["hotpotqa.f1"]}


def make_trainer(setup: Setup, name: str, lr: float, steps: int, seed: int, out: Path, batch_size: int = 4) -> Any:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    torch.manual_seed(seed)
    args = TrainingArguments(
        output_dir=str(out / name), max_steps=steps, per_device_train_batch_size=batch_size, learning_rate=lr,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
        seed=seed, disable_tqdm=True, dataloader_num_workers=0, weight_decay=0.0, per_device_eval_batch_size=8,
    )
    trainer = Trainer(model=setup.model, args=args, train_dataset=setup.train,
                      data_collator=collator(setup.tok, setup.train))
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


@torch.no_grad()
def task_accuracy(model: Any, tok: Any) -> float:
    """Greedy exact match of the reversed spelling, over every word of the vocabulary."""
    was_training = model.training
    model.eval()
    tok.padding_side = "left"
    prompts = [chat(tok, f"Reverse the word: {w}") for w in WORDS]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id
                         or tok.eos_token_id)
    answers = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    tok.padding_side = "right"
    model.train(was_training)
    # Right when the answer starts with the reversed spelling and the spelling stops there.
    return sum(re.match(re.escape("-".join(reversed(w))) + r"(?![-A-Za-z])", a.strip()) is not None
               for a, w in zip(answers, WORDS)) / len(WORDS)
