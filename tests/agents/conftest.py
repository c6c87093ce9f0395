from __future__ import annotations

import string

import pytest


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


@pytest.fixture(scope="session")
def char_tokenizer():
    return make_char_tokenizer()


def lm_dataset(tokenizer, texts: list[str], length: int = 32):
    """A datasets.Dataset of fixed-length causal-LM examples (labels = input ids)."""
    from datasets import Dataset

    enc = tokenizer(texts, truncation=True, max_length=length, padding="max_length")
    labels = [[t if m else -100 for t, m in zip(ids, mask)] for ids, mask in zip(enc["input_ids"], enc["attention_mask"])]
    return Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})


NARROW_TASK = [f"{a} plus {b} is {a + b}." for a in range(12) for b in range(12)]
HELD_OUT = ["The quick brown fox jumps over the lazy dog.", "Rain falls on the green hills in spring.",
            "A small boat drifted across the quiet lake.", "She wrote a letter to her old friend."]
