"""Fixtures for the probe tests: an in-process character tokenizer and hand-made causal LMs.

Nothing is downloaded: the tokenizer is built with ``tokenizers`` and wrapped in
``PreTrainedTokenizerFast``; models are tiny random Llamas or modules with known logits.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import pytest
import torch

VOCAB_SIZE = 128
PAD, BOS, EOS = 0, 1, 2


def _char_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": 3}
    for ch in list(string.printable[:-5]) + ["\n"]:
        vocab.setdefault(ch, len(vocab))
    for i in range(len(vocab), VOCAB_SIZE):  # fill up to the tiny model's vocabulary
        vocab[f"<extra_{i}>"] = i
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    extras = [t for t in vocab if t.startswith("<extra_")]
    tokenizer.add_special_tokens({"additional_special_tokens": extras})
    return tokenizer


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Run on one torch thread. The 2 cores are shared with other processes: two intra-op
    threads then wait on each other, and a 0.05 s tiny training run takes 10 s (SmolLM2
    forwards run 2-4x slower on two threads than on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def char_tokenizer():
    """Character-level tokenizer, ids < 128, BOS prepended, no chat template."""
    return _char_tokenizer()


@pytest.fixture(scope="session")
def chat_tokenizer():
    """The same tokenizer with a minimal chat template."""
    tokenizer = _char_tokenizer()
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    return tokenizer


@dataclass
class Output:
    """ModelOutput-like: the probes only read ``.logits``."""

    logits: torch.Tensor


class FixedLogitsLM(torch.nn.Module):
    """Returns the same logits row at every position, whatever the input."""

    def __init__(self, row):
        super().__init__()
        self.row = torch.nn.Parameter(torch.as_tensor(row, dtype=torch.float32), requires_grad=False)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return Output(self.row.expand(*input_ids.shape, -1).clone())


class TableLM(torch.nn.Module):
    """A bigram model: the logits after token ``t`` are ``table[t]`` (context-free)."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.as_tensor(table, dtype=torch.float32), requires_grad=False)

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return Output(self.table[input_ids])


@pytest.fixture
def fixed_lm():
    return FixedLogitsLM


@pytest.fixture
def table_lm():
    return TableLM


@pytest.fixture
def tiny_model():
    from actuator.agents.models import tiny_llama

    return tiny_llama(vocab_size=VOCAB_SIZE)
