"""Identification mode on a real Trainer with a real service: the callback steps the learning rate
by the configured size after ``hold`` steps, holds it for ``length`` steps, restores it, sets the
service's decisions on it aside meanwhile, and the stored observations carry the step for
``actuator policy tune`` to fit."""

from __future__ import annotations

import math

import httpx
import pytest

from actuator._exceptions import ConfigError
from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.identification import IdentificationMode
from actuator.agents.probes import KLDrift

from agent_helpers import HELD_OUT, SlowSteps, make_trainer, record_lr_used

# A controller that would cut the learning rate at every probe (drift above a zero setpoint).
POLICY = {"name": "ident-lr", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.0, "kp": 5.0, "ki": 1.0}]}
HOLD, LENGTH, SIZE, LR = 4, 8, 0.7, 5e-3


def test_step_test_is_applied_held_restored_and_recorded(tmp_path, char_tokenizer, sqlite_service):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=16, scheduler="constant", lr=LR)
    used = record_lr_used(trainer)
    cb = ActuatorCallback(
        POLICY, connection=sqlite_service.url, knobs={"learning_rate": {"min": 1e-5, "max": 1e-1}},
        probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)], reporting=Reporting(budget_share=1.0),
        identify={"knob": "learning_rate", "size": SIZE, "hold": HOLD, "length": LENGTH},
    ).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()

    # optimizer step k+1 runs with what was applied at boundary k (used[] is 0-based)
    stepped = LR * math.exp(SIZE)
    assert used[:HOLD] == pytest.approx([LR] * HOLD)
    assert used[HOLD:HOLD + LENGTH] == pytest.approx([stepped] * LENGTH)
    end = HOLD + LENGTH
    # back at the nominal value when the test ends; from then on the controller's decisions apply
    assert used[end] == pytest.approx(LR) or any(e["step"] == end for e in cb.session.applied)
    assert all(e["step"] >= end for e in cb.session.applied)
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert any(d["step"] <= end for d in decisions), "the service did order cuts during the test"
    # the stored observations report the knob in effect: the step is there for tune to fit
    obs = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/report", timeout=30).json()
    assert obs["sampling"]["observations"] >= 8
    r = httpx.post(f"{sqlite_service.url}/v1/policies/tune", json={"run_id": cb.session.run_id, "controller": "drift"},
                   timeout=120)
    # a tiny random model's drift may or may not answer the step above its noise: either a model
    # or a refusal naming the problem, never "the knob did not move"
    assert r.status_code in (200, 409), r.text
    if r.status_code == 409:
        assert r.json()["detail"]["errors"][0]["type"] != "knob_did_not_move", r.text
    else:
        assert r.json()["model"]["knob_move"] >= SIZE - 1e-9  # the step, and the cuts ordered after it


def test_identification_config_is_checked():
    mode = IdentificationMode.from_config({"knob": "kl_beta", "size": -0.3, "length": 5})
    assert mode.knob == "kl_beta" and mode.test.size == -0.3 and mode.due(0) is None  # not bound yet
    with pytest.raises(ConfigError, match="size"):
        IdentificationMode.from_config({"size": 0.0, "length": 5})
    with pytest.raises(ConfigError, match="unexpected keyword"):
        IdentificationMode.from_config({"size": 0.5, "length": 5, "steps": 3})
