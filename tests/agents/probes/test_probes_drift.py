"""Drift probes: the reference (snapshot, given, PEFT base without a copy) and answer drift."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from actuator.agents.probes import (
    EmbeddingDrift,
    KLDrift,
    ProbeDataError,
    ProbeSetupError,
    ProbeSuite,
)
from actuator.agents.probes import _common

PROMPTS = ["hello there", "what is two plus two", "name a colour", "count: 1 2 3"]


class HashEmbedder:
    """Deterministic bag-of-characters embedding: equal strings, equal vectors."""

    def encode(self, texts):
        out = np.zeros((len(texts), 64))
        for i, text in enumerate(texts):
            for ch in text or " ":
                out[i, int(hashlib.md5(ch.encode()).hexdigest(), 16) % 64] += 1.0
        return out


def _perturb(model, scale=0.5):
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lm_head" in name or "embed" in name:
                parameter.add_(scale * torch.randn_like(parameter))


def test_kl_snapshot_is_taken_at_setup(tiny_model, char_tokenizer):
    probe = KLDrift(PROMPTS, char_tokenizer)
    with pytest.raises(ProbeSetupError, match="setup"):
        probe.measure(tiny_model)
    probe.setup(tiny_model)
    snapshot = probe.reference_holder.snapshot
    assert snapshot is not tiny_model and not any(p.requires_grad for p in snapshot.parameters())
    assert probe.measure(tiny_model)["kl_drift"] == pytest.approx(0.0, abs=1e-7)
    torch.manual_seed(0)
    _perturb(tiny_model)
    assert probe.measure(tiny_model)["kl_drift"] > 1e-3
    assert snapshot not in [m for m in tiny_model.modules()]


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_kl_of_peft_model_uses_the_base_without_a_copy(char_tokenizer):
    import copy

    from peft import LoraConfig, get_peft_model

    from actuator.agents.models import tiny_llama

    base = tiny_llama()
    reference = copy.deepcopy(base)
    model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    probe = KLDrift(PROMPTS, char_tokenizer)
    probe.setup(model)
    assert probe.reference_holder.snapshot is None  # no second copy in memory
    model.train()
    value = probe.measure(model)["kl_drift"]
    assert model.training
    assert value > 1e-4
    # The base with adapters disabled is exactly the original model.
    expected = KLDrift(PROMPTS, char_tokenizer, reference=reference).measure(model)["kl_drift"]
    assert value == pytest.approx(expected, rel=1e-5)


def test_suite_shares_one_snapshot_between_drift_probes(tiny_model, char_tokenizer):
    kl = KLDrift(PROMPTS, char_tokenizer)
    emb = EmbeddingDrift(PROMPTS, char_tokenizer, embedder=HashEmbedder(), max_new_tokens=4)
    ProbeSuite([kl, emb]).setup(tiny_model)
    assert kl.reference_holder.snapshot is emb.reference_holder.snapshot is not None


def test_embedding_drift_zero_for_unchanged_model_and_reference_answers_cached(tiny_model, char_tokenizer, monkeypatch):
    probe = EmbeddingDrift(PROMPTS, char_tokenizer, embedder=HashEmbedder(), max_new_tokens=6)
    probe.setup(tiny_model)
    calls = []
    real = _common.greedy_generate

    def counting(model, *args, **kwargs):
        calls.append(model)
        return real(model, *args, **kwargs)

    monkeypatch.setattr("actuator.agents.probes._drift.greedy_generate", counting)
    values = probe.measure(tiny_model)
    assert values == {"embedding_drift": 0.0, "answer_agreement": 1.0}
    assert calls == [tiny_model]  # the reference's answers came from the cache
    with torch.no_grad():
        tiny_model.lm_head.weight.mul_(-1.0)  # greedy answers change
    values = probe.measure(tiny_model)
    assert 0.0 < values["embedding_drift"] <= 2.0 and values["answer_agreement"] < 1.0


def test_embedding_drift_with_chat_template_and_subsample(tiny_model, chat_tokenizer):
    probe = EmbeddingDrift(PROMPTS, chat_tokenizer, reference=tiny_model, embedder=HashEmbedder(), max_new_tokens=3)
    assert chat_tokenizer.decode(probe._ids[0]).endswith("<assistant>")
    values = probe.measure(tiny_model, max_examples=2)
    assert values["answer_agreement"] == 1.0 and len(probe.last_answers) == 2


def test_empty_prompts_are_rejected(char_tokenizer):
    with pytest.raises(ProbeDataError, match="empty"):
        KLDrift([], char_tokenizer)
    with pytest.raises(ProbeDataError, match=r"prompts\[1\]"):
        EmbeddingDrift(["ok", ""], char_tokenizer, embedder=HashEmbedder())
    with pytest.raises(TypeError):
        KLDrift("a single string", char_tokenizer)


def test_batched_greedy_generation_matches_one_at_a_time(tiny_model, char_tokenizer):
    prompts = [char_tokenizer(p).input_ids for p in PROMPTS]
    batched = _common.greedy_generate(tiny_model, char_tokenizer, prompts, max_new_tokens=8, batch_size=4)
    single = [_common.greedy_generate(tiny_model, char_tokenizer, [p], max_new_tokens=8, batch_size=1)[0] for p in prompts]
    assert batched == single


def test_default_embedder_is_minilm_from_the_package():
    from actuator.agents.probes import load_minilm

    model = load_minilm()
    vectors = model.encode(["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"])
    vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert vectors.shape == (3, 384)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2


# -- PolicyKL: KL(current ‖ reference) on the current model's own sampled answers ---------------
def _constant_lm(first_logit: float):
    """A tiny Llama whose next-token distribution is the same at every position: softmax of
    (first_logit, 0, 0, ...), whatever the input (final norm zeroed, lm_head a bias)."""
    from actuator.agents.models import tiny_llama

    model = tiny_llama(vocab_size=128)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        head = torch.nn.Linear(model.config.hidden_size, 128, bias=True)
        head.weight.zero_()
        head.bias.zero_()
        head.bias[0] = first_logit  # token 0 is <pad>: never an end token, so answers run full length
    model.lm_head = head
    return model.eval()


def test_policy_kl_is_exact_and_in_the_current_to_reference_direction(char_tokenizer):
    from actuator.agents.probes import PolicyKL

    v, ln3 = 128, math.log(3.0)
    p0, rest = 3 / (v + 2), 1 / (v + 2)  # softmax(ln3, 0, ..., 0) over 128 tokens
    forward = p0 * math.log(p0 * v) + (v - 1) * rest * math.log(rest * v)  # KL(p ‖ uniform)
    backward = (1 / v) * math.log(1 / (v * p0)) + ((v - 1) / v) * math.log(1 / (v * rest))  # KL(uniform ‖ p)
    peaked, uniform = _constant_lm(ln3), _constant_lm(0.0)
    probe = PolicyKL(PROMPTS, char_tokenizer, reference=uniform, max_new_tokens=5, samples=3, every=1,
                     use_chat_template=False)
    assert probe.measure(peaked)["policy_kl"] == pytest.approx(forward, rel=1e-4)  # float32 logits
    swapped = PolicyKL(PROMPTS, char_tokenizer, reference=peaked, max_new_tokens=5, samples=3, every=1,
                       use_chat_template=False)
    assert swapped.measure(uniform)["policy_kl"] == pytest.approx(backward, rel=1e-4)
    assert abs(forward - backward) > 1e-3  # the two directions differ here: the test tells them apart


def test_policy_kl_is_zero_for_the_reference_repeatable_and_leaves_the_rng_alone(tiny_model, char_tokenizer):
    from actuator.agents.probes import PolicyKL

    probe = PolicyKL(PROMPTS, char_tokenizer, max_new_tokens=6, samples=2, every=1, use_chat_template=False)
    probe.setup(tiny_model)
    assert probe.measure(tiny_model)["policy_kl"] == pytest.approx(0.0, abs=1e-7)
    torch.manual_seed(0)
    _perturb(tiny_model)
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    first = probe.measure(tiny_model)["policy_kl"]
    assert torch.equal(torch.rand(3), expected_next)  # the run's RNG stream is untouched
    assert first > 1e-3
    assert probe.measure(tiny_model)["policy_kl"] == first  # a fixed seed per measurement


def test_policy_kl_refuses_bad_settings(char_tokenizer):
    from actuator.agents.probes import PolicyKL

    with pytest.raises(ValueError, match="samples"):
        PolicyKL(PROMPTS, char_tokenizer, samples=0)
    with pytest.raises(ProbeDataError):
        PolicyKL([], char_tokenizer)


# -- AnswerKL: KL(reference ‖ current) on the first tokens of the reference's own answers -------
def _table(seed: int, vocab: int = 128) -> torch.Tensor:
    return torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * 3.0


def test_answer_kl_reads_exactly_the_positions_that_predict_the_references_first_answer_tokens(
        char_tokenizer, table_lm):
    from actuator.agents.probes import AnswerKL, token_kl

    ref_table = _table(0)
    x = char_tokenizer.convert_tokens_to_ids("x")
    ref_table[x, :] = -10.0  # after "x" the reference ends its answer: </s>
    ref_table[x, 2] = 10.0
    reference = table_lm(ref_table)
    prompts = [char_tokenizer(p).input_ids for p in PROMPTS]
    # The reference's greedy answers, by hand: a bigram chain from the prompt's last token, up to 3
    # tokens, the end token kept when it comes first.
    expected_answers = []
    for ids in prompts:
        answer, last = [], ids[-1]
        while len(answer) < 3:
            last = int(ref_table[last].argmax())
            answer.append(last)
            if last == 2:
                break
        expected_answers.append(answer)
    current_table = ref_table + _table(1) * 0.3
    probe = AnswerKL(PROMPTS, char_tokenizer, reference=reference, answer_tokens=3, every=1, use_chat_template=False)
    probe.setup(table_lm(current_table))
    assert probe.answers == expected_answers
    per_context = token_kl(ref_table[None], current_table[None])[0]  # KL after each token
    kls = [float(per_context[ctx]) for ids, ans in zip(prompts, expected_answers) for ctx in [ids[-1]] + ans[:-1]]
    assert probe.measure(table_lm(current_table))["answer_kl"] == pytest.approx(sum(kls) / len(kls), rel=1e-5)

    # A change after tokens that only the prompts' bodies hold: KLDrift sees it, AnswerKL does not.
    onset = {ids[-1] for ids in prompts} | {t for ans in expected_answers for t in ans}
    body_only = sorted({t for ids in prompts for t in ids[:-1]} - onset)
    assert body_only
    elsewhere = ref_table.clone()
    elsewhere[body_only] += _table(2)[body_only]
    assert probe.measure(table_lm(elsewhere))["answer_kl"] == pytest.approx(0.0, abs=1e-6)
    drift = KLDrift(PROMPTS, char_tokenizer, reference=reference)
    drift.setup(table_lm(elsewhere))
    assert drift.measure(table_lm(elsewhere))["kl_drift"] > 0.1


def test_answer_kl_is_zero_for_the_start_answers_once_and_sees_a_trained_change(tiny_model, chat_tokenizer):
    from actuator.agents.probes import AnswerKL

    probe = AnswerKL(PROMPTS, chat_tokenizer, answer_tokens=4, every=1)
    with pytest.raises(ProbeSetupError, match="setup"):
        probe.measure(tiny_model)
    probe.setup(tiny_model)
    answers = [list(a) for a in probe.answers]
    assert all(1 <= len(a) <= 4 for a in answers)
    # through the chat template: the answers continue the generation prompt
    start = chat_tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}], tokenize=False,
                                               add_generation_prompt=True)
    assert probe._ids[0] == chat_tokenizer(start, add_special_tokens=False).input_ids
    assert probe.measure(tiny_model)["answer_kl"] == pytest.approx(0.0, abs=1e-7)
    torch.manual_seed(0)
    _perturb(tiny_model)
    changed = probe.measure(tiny_model)["answer_kl"]
    assert changed > 1e-3
    assert probe.answers == answers  # the reference's answers are made once, at setup
    assert probe.measure(tiny_model, max_examples=2)["answer_kl"] > 0.0


def test_answer_kl_refuses_bad_settings(char_tokenizer):
    from actuator.agents.probes import AnswerKL

    with pytest.raises(ValueError, match="answer_tokens"):
        AnswerKL(PROMPTS, char_tokenizer, answer_tokens=0)
    with pytest.raises(ProbeDataError):
        AnswerKL([], char_tokenizer)


def test_greedy_token_ids_keeps_the_end_token_only_when_asked(char_tokenizer, table_lm, tiny_model):
    a = char_tokenizer.convert_tokens_to_ids("a")
    table = torch.full((128, 128), -10.0)
    table[:, a] = 10.0  # every token is followed by "a" ...
    table[a, :] = -10.0
    table[a, 2] = 10.0  # ... and "a" by </s>
    prompt = [char_tokenizer("hi").input_ids]
    assert _common.greedy_token_ids(table_lm(table), char_tokenizer, prompt, max_new_tokens=5, batch_size=1) == [[a]]
    assert _common.greedy_token_ids(table_lm(table), char_tokenizer, prompt, max_new_tokens=5, batch_size=1,
                                    keep_eos=True) == [[a, 2]]
    prompts = [char_tokenizer(p).input_ids for p in PROMPTS]
    ids = _common.greedy_token_ids(tiny_model, char_tokenizer, prompts, max_new_tokens=6, batch_size=4)
    text = _common.greedy_generate(tiny_model, char_tokenizer, prompts, max_new_tokens=6, batch_size=4)
    assert [char_tokenizer.decode(t, skip_special_tokens=True).strip() for t in ids] == text
