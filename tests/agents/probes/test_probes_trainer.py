"""A real ``transformers.Trainer.train()`` gives the same per-step losses with probes as without.

The tiny Llama trains with attention dropout on and over two epochs, so both the dropout masks
and the second epoch's shuffle come from the global torch RNG: a probe that consumed random
numbers or left the model in eval mode would change the losses (the control run shows it does).
"""

from __future__ import annotations

import numpy as np
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

RECORDS = [
    {
        "_id": f"{i:024x}",
        "question": question,
        "answer": answer,
        "context": [["Ada Vell", ["Ada Vell was born in Tor."]], ["Tor", ["Tor is in Osk."]], ["Bim", ["Bim is big."]]],
        "supporting_facts": [["Ada Vell", 0], ["Tor", 0]],
        "type": "bridge",
        "level": "hard",
    }
    for i, (question, answer) in enumerate([("Where was Ada Vell born?", "Tor"), ("Ada's country?", "Osk")])
]


class CharCountEmbedder:
    def encode(self, texts):
        out = np.zeros((len(texts), 128))
        for i, text in enumerate(texts):
            for ch in text or " ":
                out[i, ord(ch) % 128] += 1.0
        return out


def _dataset():
    from datasets import Dataset

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 100, (8, 24), generator=generator).tolist()
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def _model():
    from actuator.agents.models import tiny_llama

    model = tiny_llama(vocab_size=128, seed=0)
    for module in model.modules():  # dropout on: losses depend on the torch RNG
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.2
    return model


def _train(tmp_path, callbacks):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=8,  # 4 steps per epoch: the second epoch reshuffles after probes have run
        learning_rate=5e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=_model(), args=args, train_dataset=_dataset(), callbacks=callbacks)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # every run alike (thread count changes float sums), and fast
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 8
    return losses, [p.detach().clone() for p in trainer.model.parameters()]


def _callbacks(make_suite):
    from transformers import TrainerCallback

    class ProbeCallback(TrainerCallback):
        def __init__(self):
            self.suite = None
            self.reports = []
            self.modes = []

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.suite = make_suite(model)
            self.suite.setup(model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            report = self.suite.run(model, state.global_step)
            if report is not None:
                self.reports.append(report)
            self.modes.append(model.training)

    return ProbeCallback()


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """Losses and final weights of the run without probes."""
    return _train(tmp_path_factory.mktemp("plain"), [])


def test_probes_do_not_change_training(tmp_path, baseline, char_tokenizer, chat_tokenizer):
    from actuator.agents.models import tiny_llama

    texts = ["held-out text one", "another held-out text, a bit longer than the first"]
    teacher = tiny_llama(vocab_size=128, seed=1)  # built before training: tiny_llama reseeds torch

    def make_suite(model):
        return ProbeSuite(
            [
                Perplexity(texts, char_tokenizer, every=2),
                KLDrift(texts, char_tokenizer, every=2),
                DraftAcceptance(teacher, texts, char_tokenizer, every=3),
                HotpotQA(RECORDS, chat_tokenizer, every=4, max_new_tokens=3, max_length=200),
                EmbeddingDrift(texts, chat_tokenizer, embedder=CharCountEmbedder(), max_new_tokens=4, every=4),
            ],
            budget_share=1.0,
            on_error="raise",
        )

    baseline_losses, baseline_weights = baseline
    callback = _callbacks(make_suite)
    probed, probed_weights = _train(tmp_path / "probed", [callback])

    assert probed == baseline_losses  # bit-for-bit the same per-step losses
    assert all(torch.equal(a, b) for a, b in zip(baseline_weights, probed_weights))
    assert all(callback.modes)  # the model is back in train mode after every probe run
    ran = {name for report in callback.reports for name in report.seconds}
    assert ran == {"perplexity", "kl_drift", "draft", "hotpotqa", "embedding_drift"}
    values = {k: v for report in callback.reports for k, v in report.values.items()}
    assert values["kl_drift"] > 0  # the model has moved away from its starting weights
    assert all(np.isfinite(v) for v in values.values())


def test_control_a_probe_that_consumes_rng_changes_training(tmp_path, baseline):
    from transformers import TrainerCallback

    class Careless(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            torch.rand(1)  # what an unwrapped probe sampling a subset would do

    careless, _ = _train(tmp_path / "careless", [Careless()])
    assert careless[0] == baseline[0][0] and careless != baseline[0]
