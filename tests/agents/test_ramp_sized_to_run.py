"""A setpoint ramp fits the run (issue 57). preset:dpo-kl's learning-rate ramp (8 probe intervals,
measured on a 40-step run probed every 2) is cut, like its probe intervals, to the run's length:
at most 40% of the readings the run takes, so a 10-step DPO run's ramp is 4 readings long, and the
service's decisions act on that ramp. A policy of one's own whose ramp ends after the last step is
warned at train() start, with the arithmetic. Real Trainer.train() and the real service."""

from __future__ import annotations

import logging

import httpx
import pytest

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.models import tiny_llama
from actuator.agents.probes import KLDrift
from agent_helpers import HELD_OUT, make_trainer

pytest.importorskip("trl")


def test_dpo_kl_ramp_follows_max_steps(tmp_path, char_tokenizer, sqlite_service, caplog) -> None:
    from trl import DPOConfig, DPOTrainer

    from actuator.agents.anchor import KLAnchor, anchor_trainer
    from test_trl_knobs import preference_dataset

    pairs = preference_dataset(24)
    anchor = KLAnchor([p + c for p, c in zip(pairs["prompt"], pairs["chosen"])], char_tokenizer, max_length=32)
    # no every= on the probe: the preset's interval (4), fitted to 10 steps, is 1
    cb = ActuatorCallback("preset:dpo-kl", connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          probes=[KLDrift(HELD_OUT, char_tokenizer, max_length=32, reference=tiny_llama(seed=0))])
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=10, per_device_train_batch_size=2, learning_rate=3e-2,
                     lr_scheduler_type="constant", beta=0.1, max_length=32, use_cpu=True, report_to=[],
                     logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
                     bf16=False)
    trainer = anchor_trainer(DPOTrainer)(model=tiny_llama(seed=0), ref_model=tiny_llama(seed=0), args=args,
                                         train_dataset=pairs, processing_class=char_tokenizer, kl_anchor=anchor,
                                         callbacks=[cb])
    with caplog.at_level(logging.INFO, logger="actuator.agents"):
        trainer.train()

    url = sqlite_service.url
    run = httpx.get(f"{url}/v1/runs/{cb.session.run_id}").json()
    stored = httpx.get(f"{url}/v1/policies/{run['policy_name']}/versions/{run['policy_version']}").json()["document"]
    ramp = {c["name"]: c.get("setpoint_ramp", 0) for c in stored["controllers"]}
    assert ramp["kl-lr"] == 4  # int(0.4 x 10 readings), not the preset's 8
    assert "setpoint ramp sized to the run: 8 -> 4 probe intervals (max_steps=10" in caplog.text
    assert "reaches the setpoint at step" not in caplog.text  # the fitted ramp ends inside the run
    decisions = httpx.get(f"{url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    lr = [d for d in decisions if d["knob"] == "learning_rate" and "ramped setpoint" in d["reason"]]
    assert lr and all("of 4 probe intervals toward 0.1" in d["reason"] for d in lr), [d["reason"] for d in decisions]


POLICY = {"name": "own-ramp", "probes": [{"name": "kl_drift", "every": 2}],
          "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.5,
                           "kp": 1.0, "ki": 0.1, "setpoint_ramp": 8, "direction": "direct"}]}


def test_a_ramp_longer_than_the_run_is_warned_at_train_start(tmp_path, char_tokenizer, sqlite_service,
                                                             caplog) -> None:
    cb = ActuatorCallback(POLICY, connection=sqlite_service.url, reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-6, "max": 1e-2}},
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)])
    trainer = make_trainer(tmp_path, char_tokenizer, steps=10, scheduler="constant", callbacks=[cb])
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    warned = [r.getMessage() for r in caplog.records if "setpoint ramp" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    assert ("its setpoint ramp of 8 probe intervals x every 2 steps reaches the setpoint at step 0 + 8 x 2 = 16, "
            "after the last step (max_steps=10); at step 10 the setpoint in force is 62% of the way") in warned[0]
    assert "Shorten setpoint_ramp (at most 5 here)" in warned[0]
