"""Probes compare like with like in any precision. Under ``bf16=True`` (TRL's default) accelerate
wraps the model's forward in ``torch.autocast``; the drift reference is a frozen copy whose
forward is its class's, so it must run under the same autocast, or precision alone reads as
drift. On a real Trainer.train() in bf16, the drift probes at step 0 (before any update) read
exactly no drift."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.models import tiny_llama
from actuator.agents.probes import DraftAcceptance, EmbeddingDrift, KLDrift
from actuator.agents.probes._common import observe_precision, probe_mode

from agent_helpers import HELD_OUT, make_trainer

POLICY = {"name": "precision", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                "setpoint": 0.5, "kp": 1.0}]}


class CharCounts:
    """A tiny embedder: letter counts (any fixed map from text to vector works here)."""

    def encode(self, texts):
        return np.array([[t.count(c) + 1e-3 for c in "etaoinshrdlu"] for t in texts], dtype=np.float64)


@pytest.mark.parametrize("bf16", [True, False])
def test_drift_is_exactly_zero_before_training_in_any_precision(bf16, tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=2, scheduler="constant", bf16=bf16)
    kl = KLDrift(HELD_OUT, char_tokenizer, every=100, max_length=32)
    answers = EmbeddingDrift(HELD_OUT, char_tokenizer, every=100, embedder=CharCounts(), max_new_tokens=6,
                             use_chat_template=False)
    cb = ActuatorCallback(POLICY, connection=sqlite_service.url, probes=[kl, answers],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.train()

    with probe_mode(trainer.model), observe_precision(trainer.model) as seen:
        trainer.model(input_ids=torch.ones((1, 2), dtype=torch.long))
    assert seen[0].enabled is bf16 and (not bf16 or seen[0].dtype == torch.bfloat16)  # training's autocast
    baseline = cb.session.history[0]
    assert baseline["step"] == 0
    assert baseline["probes"]["kl_drift"] == 0.0
    assert baseline["probes"]["answer_agreement"] == 1.0 and baseline["probes"]["embedding_drift"] == 0.0


def test_the_reference_runs_under_the_autocast_the_model_runs_under(char_tokenizer):
    """Without a Trainer: a model whose forward enters bf16 autocast itself (as accelerate makes it)
    against a plain fp32 reference copy, and a teacher for draft acceptance."""
    model = tiny_llama(seed=0)
    inner = type(model).forward

    def autocast_forward(self, *args, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return inner(self, *args, **kwargs)

    model.forward = autocast_forward.__get__(model)
    kl = KLDrift(HELD_OUT, char_tokenizer, max_length=32, reference=tiny_llama(seed=0))
    assert kl.measure(model)["kl_drift"] == 0.0
    draft = DraftAcceptance(tiny_llama(seed=0), HELD_OUT, char_tokenizer, max_length=32)
    assert draft.measure(model)["draft.acceptance"] == pytest.approx(1.0, abs=1e-6)


ROOT = Path(__file__).resolve().parents[2]


def test_native_precision_follows_the_machine():
    """bf16 only where the machine computes it natively: a GPU that supports it, or a CPU with
    AVX512-BF16 / AMX-BF16 (this box: AVX2 only, so fp32). Results files record the choice."""
    sys.path.insert(0, str(ROOT))
    from actuator.agents.precision import cpu_flags, native_precision, precision_args
    from benchmarks.control.harness import machine

    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        flags = []
    native = (torch.cuda.is_available() and torch.cuda.is_bf16_supported()) or (
        not torch.cuda.is_available()
        and (torch.cpu._is_avx512_bf16_supported() or "avx512_bf16" in flags or "amx_bf16" in flags))
    assert native_precision() == ("bf16" if native else "fp32")
    assert set(cpu_flags()) <= set(flags) and ("avx2" in flags) == ("avx2" in cpu_flags())
    record = machine()
    assert record["native_precision"] == native_precision() and record["cpu_flags"] == cpu_flags()
    assert precision_args("fp32") == {"bf16": False, "fp16": False}
    assert precision_args("bf16") == {"bf16": True, "fp16": False}
    with pytest.raises(ValueError, match="precision"):
        precision_args("fp8")


def test_scripts_never_keep_trl_bf16_default():
    """TRL's configs turn bf16 on when it is left unset: every TRL config an example or benchmark
    builds sets its precision through precision_args."""
    calls = re.compile(r"\b(\w+Config)\(")
    unset = []
    for path in sorted([*ROOT.glob("examples/*.py"), *ROOT.glob("benchmarks/control/*.py")]):
        text = path.read_text()
        for match in calls.finditer(text):
            if match.group(1) not in {"DPOConfig", "SFTConfig", "GRPOConfig", "RLOOConfig", "GKDConfig", "KTOConfig"}:
                continue
            depth, end = 0, match.end() - 1
            for end in range(match.end() - 1, len(text)):
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            if "precision_args" not in text[match.start():end]:
                unset.append(f"{path.relative_to(ROOT)}: {match.group(1)}")
    assert not unset, unset
