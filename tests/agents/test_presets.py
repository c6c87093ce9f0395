"""Presets bring their knobs: a policy driving kl_beta on a DPOTrainer declares it and finds its
setter (actuator.agents.trl_knobs.KLBetaKnob) from the trainer, ActuatorCallback("preset:dpo-kl")
on an anchored DPOTrainer finds the learning rate and the KL anchor's weight, with no knobs= or
setters= given; a knob the trainer cannot have fails at train() start naming the setter's module."""

from __future__ import annotations

import httpx
import pytest
from transformers import Trainer, TrainerCallback, TrainingArguments

from actuator import ConfigError
from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.knobs import LearningRateKnob
from actuator.agents.models import tiny_llama
from actuator.agents.probes import KLDrift
from actuator.agents.trl_knobs import KLBetaKnob

from agent_helpers import HELD_OUT, NARROW_TASK, SlowSteps, lm_dataset, record_lr_used
from test_trl_knobs import BetaUsedByLoss, make_dpo

pytest.importorskip("trl")


class OverrideAt(TrainerCallback):
    """An operator pins kl_beta through the REST API at a step boundary (a real decision)."""

    def __init__(self, cb: ActuatorCallback, url: str, step: int, value: float) -> None:
        self.cb, self.url, self.step, self.value = cb, url, step, value

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            r = httpx.post(f"{self.url}/v1/runs/{self.cb.session.run_id}/knobs/kl_beta/override",
                           json={"value": self.value, "note": "test"})
            assert r.status_code == 200, r.text


BETA_POLICY = {"name": "dpo-beta", "probes": [{"name": "kl_drift", "every": 10}],
               "controllers": [{"name": "kl-beta", "probe": "kl_drift", "knob": "kl_beta", "setpoint": 0.1,
                                "kp": 6.0, "ki": 0.6, "direction": "reverse"}]}


def test_a_kl_beta_policy_on_dpo_needs_no_knobs_or_setters(tmp_path, char_tokenizer, sqlite_service):
    # On a TRL DPOTrainer: nothing but the policy and a probe.
    cb = ActuatorCallback(BETA_POLICY, connection=sqlite_service.url, reporting=Reporting(report_every=1),
                          probes=[KLDrift(HELD_OUT, char_tokenizer, max_length=32, reference=tiny_llama(seed=0))])
    trainer = make_dpo(tmp_path, char_tokenizer, steps=14, beta=0.1, callbacks=[cb])
    probe = BetaUsedByLoss(trainer)
    trainer.add_callback(OverrideAt(cb, sqlite_service.url, step=3, value=0.18))  # within the default rate limit (x2 per decision)
    trainer.add_callback(SlowSteps())
    trainer.train()

    assert isinstance(cb.session.setters["kl_beta"], KLBetaKnob) and isinstance(cb.session.setters["learning_rate"], LearningRateKnob)
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["policy_name"] == "dpo-beta"
    kl_beta = run["knobs"]["kl_beta"]
    assert kl_beta["value"] == pytest.approx(0.18)  # the override moved it from the trainer's 0.1
    assert (kl_beta["min"], kl_beta["max"], kl_beta["scale"]) == (pytest.approx(1e-3), pytest.approx(1.0), "log")
    # The decision came back, was applied at a step boundary, and the DPO loss used it from then on.
    applied = [e for e in cb.session.applied if e["knob"] == "kl_beta"]
    assert applied and applied[0]["applied"] == pytest.approx(0.18), cb.session.applied
    used = probe.used()
    k = applied[0]["step"]
    assert 3 <= k < len(used)
    assert used[:3] == pytest.approx([0.1] * 3, rel=1e-3)
    assert used[k:] == pytest.approx([0.18] * (len(used) - k), rel=1e-3)
    assert run["knobs_in_effect"]["kl_beta"] == pytest.approx(0.18)


def test_dpo_preset_on_an_anchored_dpo_trainer_turns_the_learning_rate_and_the_anchor(tmp_path, char_tokenizer,
                                                                                      sqlite_service):
    """The README's DPO lines: anchor_trainer(DPOTrainer) with a KLAnchor and preset:dpo-kl. The
    callback finds both knobs' setters; the tiny model drifts past the preset's KL setpoint, so the
    learning rate falls and the anchor's weight rises, and what the optimizer and the anchor term
    really used are the decisions applied."""
    from trl import DPOConfig, DPOTrainer

    from actuator.agents.anchor import KLAnchor, KLAnchorKnob, anchor_trainer

    from test_trl_knobs import preference_dataset

    pairs = preference_dataset(24)
    anchor = KLAnchor([p + c for p, c in zip(pairs["prompt"], pairs["chosen"])], char_tokenizer, max_length=32)
    cb = ActuatorCallback("preset:dpo-kl", connection=sqlite_service.url, reporting=Reporting(report_every=1),
                          probes=[KLDrift(HELD_OUT, char_tokenizer, max_length=32, every=2, reference=tiny_llama(seed=0))])
    args = DPOConfig(output_dir=str(tmp_path / "dpo"), max_steps=20, per_device_train_batch_size=2, learning_rate=3e-2,
                     lr_scheduler_type="constant", beta=0.1, max_length=32, use_cpu=True, report_to=[],
                     logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0,
                     bf16=False)
    trainer = anchor_trainer(DPOTrainer)(model=tiny_llama(seed=0), ref_model=tiny_llama(seed=0), args=args,
                                         train_dataset=pairs,
                                         processing_class=char_tokenizer, kl_anchor=anchor, callbacks=[cb])
    used_lr = record_lr_used(trainer)
    used_w: list[float] = []
    loss = anchor.loss
    anchor.loss = lambda model: (used_w.append(anchor.weight), loss(model))[1]  # type: ignore[method-assign]
    trainer.add_callback(SlowSteps())
    trainer.train()

    assert isinstance(cb.session.setters["kl_weight"], KLAnchorKnob) and isinstance(cb.session.setters["learning_rate"],
                                                                              LearningRateKnob)
    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert run["policy_name"] == "dpo-kl" and set(run["knobs"]) == {"learning_rate", "kl_weight"}
    assert max(h["probes"].get("kl_drift", 0.0) for h in cb.session.history) > 0.1, "the tiny model must pass the setpoint"
    by_knob = {k: [e for e in cb.session.applied if e["knob"] == k] for k in ("learning_rate", "kl_weight")}
    assert by_knob["learning_rate"] and by_knob["kl_weight"], cb.session.applied
    assert by_knob["learning_rate"][-1]["applied"] < 3e-2 and by_knob["kl_weight"][-1]["applied"] > 0
    checked = set()
    for knob, used in (("learning_rate", used_lr), ("kl_weight", used_w)):
        for e in by_knob[knob]:  # optimizer step k+1 (used[k]) ran with what was applied after step k
            if e["step"] < len(used):
                assert used[e["step"]] == pytest.approx(e["applied"], rel=1e-9), (knob, e, used)
                checked.add(knob)
    assert checked == {"learning_rate", "kl_weight"}


def _plain_trainer(tmp_path, tokenizer) -> Trainer:
    return Trainer(model=tiny_llama(seed=0), train_dataset=lm_dataset(tokenizer, NARROW_TASK), args=TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, use_cpu=True, report_to=[], disable_tqdm=True))


@pytest.mark.parametrize(("policy", "message"), [
    ("preset:rl-kl", r"knobs\.kl_beta: .*Trainer has no `beta`.*actuator\.agents\.trl_knobs\.KLBetaKnob"),
    ("preset:dpo-kl", r"knobs\.kl_weight: the trainer has no KL anchor.*anchor_trainer"),
    ("preset:compress-ppl", r"knobs\.rank: .*no LowRankLinear layers.*actuator\.agents\.compression\.factorize"),
    ("preset:compress-threshold",
     r"knobs\.compression_threshold: .*calibration.*actuator\.agents\.compression\.ThresholdKnob\(model, calibration\)"),
    ("preset:compress-width",
     r"knobs\.mlp_channel_threshold: .*calibration.*actuator\.agents\.compression\.ChannelThresholdKnob\(model, "
     r"calibration\)"),
    ("preset:draft-distill", r"knobs\.distill_lambda: .*actuator\.agents\.distill\.DistillLambdaKnob"),
    ({"name": "custom", "controllers": [{"name": "c", "probe": "kl_drift", "knob": "custom.temperature",
                                         "setpoint": 0.1, "kp": 1.0}]},
     r"knobs\.custom\.temperature: no setter.*KnobSetter protocol, actuator\.agents\.knobs"),
])
def test_a_knob_the_trainer_cannot_have_fails_at_train_start(tmp_path, char_tokenizer, policy, message):
    trainer = _plain_trainer(tmp_path, char_tokenizer)
    ActuatorCallback(policy, connection="http://127.0.0.1:9").attach(trainer)
    with pytest.raises(ConfigError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0
