"""The benchmark data the control scenarios share, in one place: the reverse-spelling task's
vocabulary and chat dataset (sft-drift, forgetting), English prose from standard-library
docstrings cut into token blocks (draft-distill, compress-rank, compress-width-offline) and
SmolLM2's bare chat prompt (dpo-kl, rl-kl). General text and prompts the probes read ship with
the package (``actuator.agents.general``). Nothing here downloads anything."""

from __future__ import annotations

import random
from typing import Any

from actuator.agents.corpus import blocks, stdlib_text
from actuator.agents.general import answer_labels, chat

__all__ = ["WORDS", "task_dataset", "collator", "stdlib_text", "blocks", "prompt_text"]

WORDS = ("apple river candle mountain window garden silver rocket planet forest violin marble tiger lemon castle "
         "harbor pencil meadow thunder island copper velvet falcon lantern orchid glacier compass saddle timber "
         "canyon beacon walnut quartz ember willow").split()


def task_dataset(tok: Any, n: int, seed: int, max_length: int = 64, completion_only: bool = False) -> Any:
    """``n`` chat examples of the task. ``completion_only``: a ``labels`` column that counts the
    answer only (the system prompt and the request are context, -100), as TRL's SFTTrainer does
    for prompt-completion data; without it the loss counts every token."""
    from datasets import Dataset

    rng = random.Random(seed)
    requests, texts = [], []
    for _ in range(n):
        w = rng.choice(WORDS)
        requests.append(f"Reverse the word: {w}")
        texts.append(chat(tok, requests[-1], "-".join(reversed(w))))
    enc = tok(texts, truncation=True, max_length=max_length)
    columns = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if completion_only:
        columns["labels"] = answer_labels(tok, requests, enc["input_ids"])
    return Dataset.from_dict(columns)


def collator(tok: Any, dataset: Any) -> Any:
    """Pads a batch; labels are the inputs, or the dataset's own ``labels`` (completion-only) padded with -100."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorForSeq2Seq

    if "labels" in dataset.column_names:
        return DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100)
    return DataCollatorForLanguageModeling(tok, mlm=False)


def prompt_text(q: str) -> str:
    """SmolLM2's chat format without the default system prompt (20 tokens fewer per sequence:
    on shared CPU cores the sequence length is the cost)."""
    return f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
