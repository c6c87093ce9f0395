"""Every Python snippet of README.md's "Use it in your training script" section runs as written, on
tiny models against the real controller service: the trainer is built by the snippet, trains a few
steps under control, and the run the service stores has the knob the preset steers, with the
setter the callback found on the trainer, and every probe the policy names (built by the callback
where the snippet passes none). Models are built in memory, as the project's own loader
(``load_smollm2()``) gives them: nothing for TRL to load a reference model from again."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import torch
from transformers import Trainer, TrainingArguments

from actuator.agents.callback import ActuatorCallback
from actuator.agents.compression import factorize
from actuator.agents.distill import DistillationTrainer
from actuator.agents.models import tiny_llama
from actuator.agents.trl_knobs import KL_BETA_START
from actuator.policy import probe_for_key

from agent_helpers import HELD_OUT, NARROW_TASK, lm_dataset
from test_trl_knobs import _reward, preference_dataset

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

README = Path(__file__).resolve().parents[2] / "README.md"
STEPS = 3


def section_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("## Use it in your training script")
    section = text[start:text.index("\n## ", start + 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def kind_of(block: str) -> str:
    for marker, kind in (("SFTTrainer(", "sft"), ("DPOTrainer(", "dpo"), ("GRPOTrainer(", "grpo"),
                         ("DistillationTrainer(", "distill"), ("ThresholdKnob(", "threshold"),
                         ("factorize(", "compress"), ("policy={", "own")):
        if marker in block:
            return kind
    return "imports"


# knob the snippet's preset steers, and the setter the callback must find for it
EXPECTED = {"sft": ("learning_rate", "LearningRateKnob"), "dpo": ("kl_weight", "KLAnchorKnob"),
            "grpo": ("kl_beta", "KLBetaKnob"), "distill": ("distill_lambda", "DistillLambdaKnob"),
            "compress": ("rank", "RankKnob"), "threshold": ("compression_threshold", "ThresholdKnob"),
            "own": ("learning_rate", "LearningRateKnob")}


def test_the_section_covers_every_kind_of_training():
    assert sorted(kind_of(b) for b in section_blocks()) == sorted(["imports", *EXPECTED])


def _common(tmp_path) -> dict:
    return dict(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=2, use_cpu=True,
                report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1, seed=0,
                dataloader_num_workers=0)


def saved_tiny(tmp_path, tok) -> str:
    model_dir = tmp_path / "tiny"
    tiny_llama(seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    return str(model_dir)


def namespace(kind: str, tmp_path, tok) -> dict:
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    ns = {"tok": tok, "tokenizer": tok, "prompts": HELD_OUT, "texts": HELD_OUT, "held_out_prompts": HELD_OUT,
          "held_out_texts": HELD_OUT, "Trainer": Trainer, "SFTTrainer": SFTTrainer, "DPOTrainer": DPOTrainer,
          "GRPOTrainer": GRPOTrainer, "DistillationTrainer": DistillationTrainer, "factorize": factorize}
    plain = TrainingArguments(**_common(tmp_path), learning_rate=5e-3)
    if kind == "sft":
        ns.update(model=tiny_llama(seed=0), ds=datasets.Dataset.from_dict({"text": NARROW_TASK}),
                  args=SFTConfig(**_common(tmp_path), max_length=32, bf16=False))
    elif kind == "dpo":  # in memory, like load_smollm2(): the snippet passes ref_model=
        ns.update(model=tiny_llama(seed=0), pairs=preference_dataset(8),
                  args=DPOConfig(**_common(tmp_path), max_length=32, bf16=False))
    elif kind == "grpo":
        ns.update(model_id=saved_tiny(tmp_path, tok), reward=_reward,
                  prompt_ds=datasets.Dataset.from_dict({"prompt": ["1+1=", "2+2=", "3+3=", "4+4="]}),
                  grpo_args=GRPOConfig(**_common(tmp_path), num_generations=2, max_completion_length=4,
                                       beta=KL_BETA_START, bf16=False))
    elif kind == "distill":
        ns.update(student=tiny_llama(seed=0), teacher=tiny_llama(seed=1), args=plain,
                  ds=lm_dataset(tok, NARROW_TASK))
    elif kind == "threshold":
        gen = torch.Generator().manual_seed(0)
        ns.update(model=tiny_llama(seed=0), args=plain, ds=lm_dataset(tok, NARROW_TASK),
                  calibration_blocks=[torch.randint(3, 128, (16,), generator=gen).tolist() for _ in range(4)])
    else:  # compress, own
        ns.update(model=tiny_llama(seed=0), args=plain, ds=lm_dataset(tok, NARROW_TASK),
                  train=lm_dataset(tok, NARROW_TASK))
    return ns


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_readme_snippet_trains_under_control(kind, tmp_path, char_tokenizer, sqlite_service, monkeypatch):
    monkeypatch.setenv("ACTUATOR_URL", sqlite_service.url)
    monkeypatch.chdir(tmp_path)  # a snippet may write (the compression export)
    blocks = section_blocks()
    ns = namespace(kind, tmp_path, char_tokenizer)
    exec(compile(next(b for b in blocks if kind_of(b) == "imports"), "README.md", "exec"), ns)
    snippet = next(b for b in blocks if kind_of(b) == kind)
    exec(compile(snippet, f"README.md ({kind})", "exec"), ns)
    trainer = ns["trainer"]
    if "trainer.train()" not in snippet:
        trainer.train()

    assert trainer.state.global_step == STEPS
    cb = next(c for c in trainer.callback_handler.callbacks if isinstance(c, ActuatorCallback))
    knob, setter = EXPECTED[kind]
    assert type(cb.setters[knob]).__name__ == setter
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.run_id}").json()
    assert run["state"] == "finished" and knob in run["knobs"]
    assert run["knobs_in_effect"][knob] == pytest.approx(cb.setters[knob].read())
    # every probe the policy names was measured at the baseline (the callback built those not passed)
    named = {spec.name for spec in cb.policy_doc.probes}
    assert named <= {probe_for_key(key) or key for key in cb.history[0]["probes"]}, cb.history[0]
    if kind == "threshold":  # the export the snippet wrote loaded back without Actuator's classes
        assert (tmp_path / "compressed" / "config.json").exists()
        # (a plain transformers class, or the exported modeling_actuator_lowrank.py file's: not the actuator package)
        assert type(ns["model"]).__module__.split(".")[0] != "actuator", type(ns["model"]).__module__
