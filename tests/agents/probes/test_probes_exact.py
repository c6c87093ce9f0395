"""Exact values on hand-computable cases: models with known logits give known KL, acceptance,
perplexity; perplexity equals exp(mean token NLL) computed independently."""

from __future__ import annotations

import math

import pytest
import torch

from actuator.agents.probes import (
    DraftAcceptance,
    KLDrift,
    Perplexity,
    expected_tokens_per_call,
    sliding_windows,
)

LN3 = math.log(3.0)


def test_kl_of_known_distributions_is_half_log_four_thirds(fixed_lm, char_tokenizer):
    # p = softmax(ln3, 0, 0, 0) = (1/2, 1/6, 1/6, 1/6), q uniform (1/4 each):
    # KL(p||q) = 1/2 ln(2) + 3 * 1/6 ln(2/3) = 1/2 ln(4/3)
    reference, current = fixed_lm([LN3, 0.0, 0.0, 0.0]), fixed_lm([0.0, 0.0, 0.0, 0.0])
    probe = KLDrift(["abc", "a much longer prompt"], char_tokenizer, reference=reference)
    assert probe.measure(current)["kl_drift"] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)


def test_acceptance_of_known_distributions(fixed_lm, char_tokenizer):
    # sum_v min(p, q) = min(1/2, 1/4) + 3 min(1/6, 1/4) = 3/4; gamma = 4:
    # tokens per call = (1 - 0.75^5) / (1 - 0.75) = 3.05078125
    teacher, draft = fixed_lm([LN3, 0.0, 0.0, 0.0]), fixed_lm([0.0, 0.0, 0.0, 0.0])
    probe = DraftAcceptance(teacher, ["abc", "defgh"], char_tokenizer, gamma=4)
    values = probe.measure(draft)
    assert values["draft.acceptance"] == pytest.approx(0.75, rel=1e-6)
    assert values["draft.tokens_per_call"] == pytest.approx(3.05078125, abs=1e-6)


def test_identical_models_have_no_drift_and_full_acceptance(tiny_model, char_tokenizer):
    prompts = ["hello world", "a b", "the quick brown fox jumps"]
    assert KLDrift(prompts, char_tokenizer, reference=tiny_model).measure(tiny_model)["kl_drift"] == pytest.approx(
        0.0, abs=1e-6
    )
    values = DraftAcceptance(tiny_model, prompts, char_tokenizer, gamma=3).measure(tiny_model)
    assert values["draft.acceptance"] == pytest.approx(1.0, abs=1e-6)
    assert values["draft.tokens_per_call"] == pytest.approx(4.0, abs=1e-4)


def test_expected_tokens_per_call_limits():
    assert expected_tokens_per_call(1.0, 4) == 5.0
    assert expected_tokens_per_call(0.0, 4) == 1.0
    assert expected_tokens_per_call(0.5, 2) == pytest.approx(1.75)


def _bigram_table(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(128, 128, generator=generator) * 2.0


def _bigram_kl_by_hand(table_ref, table_cur, ids):
    log_p = torch.log_softmax(table_ref.double(), -1)
    log_q = torch.log_softmax(table_cur.double(), -1)
    kls = [float((log_p[t].exp() * (log_p[t] - log_q[t])).sum()) for t in ids]
    return kls


def test_kl_excludes_padding(table_lm, char_tokenizer):
    # Token-dependent logits: a pad position counted by mistake would change the mean.
    t_ref, t_cur = _bigram_table(0), _bigram_table(1)
    prompts = ["ab", "abcdefgh"]
    expected = []
    for text in prompts:
        expected += _bigram_kl_by_hand(t_ref, t_cur, char_tokenizer(text).input_ids)
    probe = KLDrift(prompts, char_tokenizer, reference=table_lm(t_ref), batch_size=2)
    assert probe.measure(table_lm(t_cur))["kl_drift"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)


def test_uniform_model_has_perplexity_vocab_size(fixed_lm, char_tokenizer):
    probe = Perplexity(["some text", "more held-out text here"], char_tokenizer)
    assert probe.measure(fixed_lm(torch.zeros(128)))["perplexity"] == pytest.approx(128.0, rel=1e-6)


def _bigram_perplexity_by_hand(table, sequences):
    log_probs = torch.log_softmax(table.double(), -1)
    nll, count = 0.0, 0
    for ids in sequences:
        for prev, nxt in zip(ids[:-1], ids[1:]):
            nll -= float(log_probs[prev, nxt])
            count += 1
    return math.exp(nll / count)


@pytest.mark.parametrize("max_length,stride", [(None, None), (8, 3), (5, 4), (2, 1)])
def test_perplexity_of_bigram_model_counts_each_token_once(table_lm, char_tokenizer, max_length, stride):
    # A bigram model ignores context, so any sliding window must give exactly the full value.
    table = _bigram_table(2)
    texts = ["short", "a text long enough to need several windows of eight", "xy"]
    expected = _bigram_perplexity_by_hand(table, [char_tokenizer(t).input_ids for t in texts])
    probe = Perplexity(texts, char_tokenizer, max_length=max_length, stride=stride, batch_size=2)
    assert probe.measure(table_lm(table))["perplexity"] == pytest.approx(expected, rel=1e-6)


def test_perplexity_equals_exp_mean_nll_computed_independently(tiny_model, char_tokenizer):
    texts = ["held-out text number one.", "two", "a third, somewhat longer, held-out text to pad against"]
    nll, count = 0.0, 0
    with torch.no_grad():
        for text in texts:  # one text at a time: no padding involved
            ids = torch.tensor([char_tokenizer(text).input_ids])
            loss = tiny_model(input_ids=ids, labels=ids).loss  # mean NLL of the len-1 predictions
            nll += float(loss) * (ids.shape[1] - 1)
            count += ids.shape[1] - 1
    tiny_model.train()
    value = Perplexity(texts, char_tokenizer, batch_size=3).measure(tiny_model)["perplexity"]
    assert value == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert tiny_model.training


def test_sliding_windows_score_every_token_once_with_context():
    for n in range(0, 40):
        for max_length in range(2, 12):
            for stride in range(1, max_length):
                windows = sliding_windows(n, max_length, stride)
                scored = [t for start, end, first in windows for t in range(first, end)]
                assert scored == list(range(1, n)), (n, max_length, stride)
                for start, end, first in windows:
                    assert 0 <= start < first <= end <= n and end - start <= max_length


def test_perplexity_subsamples_documents(table_lm, char_tokenizer):
    table = _bigram_table(3)
    texts = ["first doc", "second document", "third", "fourth text"]
    probe = Perplexity(texts, char_tokenizer)
    # Evenly spaced subset of 2 out of 4: documents 0 and 2.
    expected = _bigram_perplexity_by_hand(table, [char_tokenizer(texts[i]).input_ids for i in (0, 2)])
    assert probe.measure(table_lm(table), max_examples=2)["perplexity"] == pytest.approx(expected, rel=1e-6)
