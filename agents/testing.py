"""Offline companions of :func:`actuator.agents.models.tiny_llama` for tests of a training
integration: a character-level tokenizer built in-process (no download) whose ids fit the tiny
model's 128-entry vocabulary, fixed-length causal-LM datasets, and two small text sets.

::

    from actuator.agents.models import tiny_llama
    from actuator.agents.testing import NARROW_TASK, char_tokenizer, lm_dataset

    tok = char_tokenizer()
    trainer = Trainer(model=tiny_llama(), args=..., train_dataset=lm_dataset(tok, NARROW_TASK))

With :func:`actuator.testing.service` for the service, a whole controlled run takes seconds on a
CPU (the tests and the agent-overhead benchmark use these). Needs transformers and datasets.
"""

from __future__ import annotations

import string
from typing import Any

__all__ = ["HELD_OUT", "NARROW_TASK", "char_tokenizer", "lm_dataset"]

# A narrow task (arithmetic sentences) and general held-out text, for forgetting-style probes.
NARROW_TASK = [f"{a} plus {b} is {a + b}." for a in range(12) for b in range(12)]
HELD_OUT = ["The quick brown fox jumps over the lazy dog.", "Rain falls on the green hills in spring.",
            "A small boat drifted across the quiet lake.", "She wrote a letter to her old friend."]


def char_tokenizer() -> Any:
    """A character-level ``PreTrainedTokenizerFast`` (ASCII letters, digits, punctuation, space,
    newline; ``<pad>`` 0, ``<s>`` 1, ``</s>`` 2, ``<unk>`` 3): 100 ids, within tiny_llama's 128."""
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


def lm_dataset(tokenizer: Any, texts: list[str], length: int = 32) -> Any:
    """A ``datasets.Dataset`` of fixed-length causal-LM examples (labels = input ids, -100 on padding)."""
    from datasets import Dataset

    enc = tokenizer(texts, truncation=True, max_length=length, padding="max_length")
    labels = [[t if m else -100 for t, m in zip(ids, mask)] for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
