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


def _bigram_draft(table_lm, vocab: int = 4):
    """After token 0 the draft says (1/2, 1/6, 1/6, 1/6), the teacher's distribution; after any
    other token it is uniform."""
    table = torch.zeros(128, vocab)
    table[0] = torch.tensor([LN3, 0.0, 0.0, 0.0])
    return table_lm(table)


def test_acceptance_is_measured_on_the_teachers_own_samples(fixed_lm, table_lm, char_tokenizer):
    # Teacher p = (1/2, 1/6, 1/6, 1/6) everywhere. After token 0 the draft equals p (Σ min = 1),
    # elsewhere it is uniform (Σ min = 3/4). The text's characters are never token 0, so on the
    # text α = 3/4; on the teacher's samples, half of the continuation tokens are 0, so every
    # continuation position but the first has E[Σ min] = 1/2 · 1 + 1/2 · 3/4 = 7/8.
    teacher, draft = fixed_lm([LN3, 0.0, 0.0, 0.0]), _bigram_draft(table_lm)
    texts = [f"prompt number {i} with some text" for i in range(8)]
    probe = DraftAcceptance(teacher, texts, char_tokenizer, gamma=4, prompt_tokens=6, new_tokens=64, seed=1)
    rng = torch.get_rng_state()
    alpha = probe.measure(draft)["draft.acceptance"]
    assert torch.equal(torch.get_rng_state(), rng)  # sampling used its own seeded stream
    # hand computation on the samples the probe drew: the first continuation position follows a
    # prompt character (3/4), each later one follows the previous sampled token
    per_position = []
    for ids, k, probs in probe.teacher_samples():
        assert k == 6 and len(ids) == 6 + 64
        assert all(0 <= t < 4 for t in ids[k:])  # tokens the teacher (vocab 4) can produce
        assert torch.allclose(probs, torch.tensor([0.5, 1 / 6, 1 / 6, 1 / 6]).expand(64, 4))
        per_position += [0.75] + [1.0 if prev == 0 else 0.75 for prev in ids[k:-1]]
    assert alpha == pytest.approx(sum(per_position) / len(per_position), rel=1e-6)
    expected = (0.75 + 63 * 0.875) / 64  # 0.873..., the expectation over the teacher's samples
    assert alpha == pytest.approx(expected, abs=4 * 0.125 / math.sqrt(8 * 63))
    values = probe.measure(draft)
    assert values["draft.acceptance"] == alpha  # the samples are kept: the same number again
    assert values["draft.tokens_per_call"] == pytest.approx((1 - alpha**5) / (1 - alpha), rel=1e-9)
    # teacher-forced on the text: never after token 0, so exactly 3/4
    text = DraftAcceptance(teacher, texts, char_tokenizer, gamma=4, on="text").measure(draft)
    assert text["draft.acceptance"] == pytest.approx(0.75, rel=1e-6)
    # the same seed draws the same continuations; another seed others
    again = DraftAcceptance(teacher, texts, char_tokenizer, prompt_tokens=6, new_tokens=64, seed=1)
    other = DraftAcceptance(teacher, texts, char_tokenizer, prompt_tokens=6, new_tokens=64, seed=2)
    assert [s[0] for s in again.teacher_samples()] == [s[0] for s in probe.teacher_samples()]
    assert [s[0] for s in other.teacher_samples()] != [s[0] for s in probe.teacher_samples()]


def test_teacher_sampled_acceptance_of_a_real_tiny_llama(tiny_model, char_tokenizer):
    """KV-cached sampling through a real causal LM: the draft equal to the teacher accepts all,
    another random model less, and the continuations are the teacher's T = 1 samples."""
    from actuator.agents.models import tiny_llama

    prompts = ["hello world", "the quick brown fox"]
    probe = DraftAcceptance(tiny_model, prompts, char_tokenizer, prompt_tokens=4, new_tokens=8)
    assert probe.measure(tiny_model)["draft.acceptance"] == pytest.approx(1.0, abs=1e-6)
    assert probe.measure(tiny_llama(vocab_size=128, seed=5))["draft.acceptance"] < 0.99
    # the cached sampling path and a recomputation without cache give the same probabilities
    for ids, k, probs in probe.teacher_samples():
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([ids])).logits[0, k - 1: len(ids) - 1]
        assert torch.allclose(torch.softmax(logits, -1), probs, atol=1e-5)


def test_draft_acceptance_refuses_bad_arguments(fixed_lm, char_tokenizer):
    teacher = fixed_lm([0.0, 0.0])
    for field in ("gamma", "prompt_tokens", "new_tokens", "batch_size"):
        with pytest.raises(ValueError, match=field):
            DraftAcceptance(teacher, ["abc", "def"], char_tokenizer, **{field: 0})
    with pytest.raises(ValueError, match="on must be"):
        DraftAcceptance(teacher, ["abc", "def"], char_tokenizer, on="student")
