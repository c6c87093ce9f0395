"""Held-out data inputs: lists, text files, datasets.Dataset; clear errors; long texts; PEFT models."""

from __future__ import annotations

import math

import pytest
import torch

from actuator.agents.probes import (
    AnswerKL,
    DraftAcceptance,
    EmbeddingDrift,
    HotpotQA,
    KLDrift,
    Perplexity,
    PolicyKL,
    ProbeDataError,
    ProbeDataNotFoundError,
    ProbeSuite,
)
from actuator.agents.probes._perplexity import load_texts


def test_text_file_split_into_paragraphs_or_lines(tmp_path):
    path = tmp_path / "heldout.txt"
    path.write_text("first paragraph\nstill first\n\n  \nsecond paragraph\n\n\nthird\n", encoding="utf-8")
    assert load_texts(path) == ["first paragraph\nstill first", "second paragraph", "third"]
    assert load_texts(str(path), file_split="line") == ["first paragraph", "still first", "second paragraph", "third"]


def test_dataset_column(tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_dict({"body": ["one text", "two texts"], "id": [1, 2]})
    assert load_texts(dataset, text_field="body") == ["one text", "two texts"]
    with pytest.raises(ProbeDataError, match=r"no column 'text'.*body"):
        load_texts(dataset)
    with pytest.raises(ProbeDataError, match="empty"):
        load_texts(Dataset.from_dict({"text": []}))


def test_clear_errors_for_missing_and_empty_data(tmp_path, char_tokenizer):
    with pytest.raises(ProbeDataNotFoundError, match="missing.txt"):
        Perplexity(tmp_path / "missing.txt", char_tokenizer)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(ProbeDataError, match="empty"):
        Perplexity(empty, char_tokenizer)
    with pytest.raises(ProbeDataError, match="empty"):
        Perplexity([], char_tokenizer)
    with pytest.raises(ProbeDataError, match=r"texts\[1\] is int"):
        Perplexity(["ok", 3], char_tokenizer)
    with pytest.raises(ValueError, match="stride"):
        Perplexity(["ok"], char_tokenizer, max_length=8, stride=8)


def test_perplexity_from_file_and_dataset_agree(tmp_path, char_tokenizer, tiny_model):
    from datasets import Dataset

    texts = ["a held-out paragraph", "another one, longer than the first"]
    path = tmp_path / "heldout.txt"
    path.write_text("\n\n".join(texts))
    from_list = Perplexity(texts, char_tokenizer).measure(tiny_model)
    assert Perplexity(path, char_tokenizer).measure(tiny_model) == from_list
    assert Perplexity(Dataset.from_dict({"text": texts}), char_tokenizer).measure(tiny_model) == from_list


def test_long_text_uses_the_model_context(char_tokenizer, tiny_model):
    # tiny_llama has 256 positions: a 700-character text needs windows, and must not fail.
    text = "the quick brown fox jumps over the lazy dog. " * 16
    probe = Perplexity([text], char_tokenizer)
    value = probe.measure(tiny_model)["perplexity"]
    assert math.isfinite(value) and probe._window(tiny_model) == (256, 128)


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_every_probe_runs_on_a_peft_model(char_tokenizer, chat_tokenizer):
    from peft import LoraConfig, get_peft_model

    from actuator.agents.models import tiny_llama

    class Embedder:
        def encode(self, texts):
            return torch.tensor([[len(t) + 1.0, sum(map(ord, t)) % 7 + 1.0] for t in texts])

    teacher = tiny_llama(seed=3)
    model = get_peft_model(
        tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    texts = ["some held-out text", "more text"]
    records = HotpotQA(None, chat_tokenizer).records[:4]
    suite = ProbeSuite(
        [
            Perplexity(texts, char_tokenizer),
            KLDrift(texts, char_tokenizer),
            EmbeddingDrift(texts, chat_tokenizer, embedder=Embedder(), max_new_tokens=4),
            HotpotQA(records, chat_tokenizer, max_new_tokens=3, max_length=256),
            DraftAcceptance(teacher, texts, char_tokenizer),
        ],
        on_error="raise",
    )
    suite.setup(model)
    model.train()
    report = suite.run(model, 0)
    assert model.training and report.skipped == [] and report.failed == []
    assert all(math.isfinite(v) for v in report.values.values())
    assert report.values["kl_drift"] > 0  # adapters disabled = the base: the LoRA moved it


@pytest.mark.parametrize(("cls", "field", "message"), [
    (KLDrift, "max_length", "max_length and batch_size must be >= 1"),
    (KLDrift, "batch_size", "max_length and batch_size must be >= 1"),
    (AnswerKL, "answer_tokens", "answer_tokens and batch_size must be >= 1"),
    (PolicyKL, "samples", "max_new_tokens, samples and batch_size must be >= 1"),
    (PolicyKL, "max_new_tokens", "max_new_tokens, samples and batch_size must be >= 1"),
    (EmbeddingDrift, "max_new_tokens", "max_new_tokens and batch_size must be >= 1"),
])
def test_reference_probes_name_the_size_that_is_not_positive(cls, field, message, char_tokenizer):
    with pytest.raises(ValueError) as caught:
        cls(["a b", "c d"], char_tokenizer, **{field: 0})
    assert str(caught.value) == message


def test_reference_probes_share_setup_and_count_their_prompts(char_tokenizer, tiny_model):
    """Every probe against a reference takes its frozen copy at setup and counts its prompts."""
    model = tiny_model
    for cls in (KLDrift, AnswerKL, PolicyKL):
        probe = cls(["a b", "c d", "e f"], char_tokenizer)
        assert probe.num_examples == 3 and probe.aux_models() == ()
        probe.setup(model)
        copies = probe.aux_models()
        assert len(copies) == 1 and copies[0] is not model
        assert all(torch.equal(a, b) for a, b in zip(copies[0].state_dict().values(), model.state_dict().values()))
