"""GRPO's own logged signals as controller inputs, on a real ``GRPOTrainer.train()`` (trl 1.16) and
the real service: ``train.entropy`` moves ``entropy_coef`` and the loss of the next step uses the
ordered coefficient; ``train.kl`` (beta > 0) reaches the service at every step without a probe run;
a ``train.<metric>`` the trainer never logs stops control on it loudly (an ERROR and an event)."""

from __future__ import annotations

import logging

import httpx
import pytest

from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.knobs import KnobNotSupported
from actuator.agents.probes import Perplexity
from actuator.agents.trl_knobs import EntropyCoefKnob, KLBetaKnob
from actuator.catalogue import KNOBS, TRAIN_SIGNALS
from actuator.policy import load_policy, load_preset

from agent_helpers import HELD_OUT, SlowSteps

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()


def make_grpo(tmp_path, tokenizer, model_dir: str, *, steps: int, beta: float, entropy_coef: float = 1e-4, **extra):
    """A GRPO run that records, per optimizer step, the entropy_coef and beta its loss read."""
    from trl import GRPOConfig, GRPOTrainer

    used: dict[int, dict[str, float]] = {}

    class Recording(GRPOTrainer):
        def compute_loss(self, model, inputs, *args, **kwargs):
            used[self.state.global_step + 1] = {"entropy_coef": float(self.entropy_coef), "beta": float(self.beta)}
            return super().compute_loss(model, inputs, *args, **kwargs)

    args = GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=steps, per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=4, beta=beta, entropy_coef=entropy_coef,
                      learning_rate=5e-3, lr_scheduler_type="constant", use_cpu=True, report_to=[],
                      save_strategy="no", bf16=False, disable_tqdm=True, logging_steps=1, seed=0, **extra)
    prompts = datasets.Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(8)]})
    trainer = Recording(model=model_dir, reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
                        args=args, train_dataset=prompts, processing_class=tokenizer)
    return trainer, used


def test_catalogue_knows_the_trainer_signals_and_the_presets_validate():
    assert TRAIN_SIGNALS["train.entropy"].per == "token" and "GRPOTrainer" in TRAIN_SIGNALS["train.entropy"].trainers
    assert TRAIN_SIGNALS["train.kl"].higher_is_better is False
    assert KNOBS["entropy_coef"].spec(1e-4) == {"min": 0.0, "max": 0.1, "scale": "linear", "max_step": 0.01}
    doc = load_preset("rl-entropy")
    assert doc.controllers[0].probe == "train.entropy" and doc.controllers[0].knob == "entropy_coef"
    assert load_preset("rl-kl-fast").controllers[0].probe == "train.kl"
    with pytest.raises(ValueError, match=r"outside the range of train.entropy"):
        load_policy({"name": "x", "controllers": [{"name": "c", "probe": "train.entropy", "knob": "entropy_coef",
                                                   "setpoint": -1.0, "kp": 1.0}]})


def test_entropy_coef_refusals(tmp_path, char_tokenizer, tiny_model_dir):
    trainer, _ = make_grpo(tmp_path, char_tokenizer, tiny_model_dir, steps=1, beta=0.0, entropy_coef=0.0)
    with pytest.raises(KnobNotSupported, match=r"entropy_coef=0.0.*GRPOConfig\(entropy_coef=1e-4\)"):
        EntropyCoefKnob(trainer)
    trainer, _ = make_grpo(tmp_path, char_tokenizer, tiny_model_dir, steps=1, beta=0.0, use_adaptive_entropy=True)
    with pytest.raises(KnobNotSupported, match=r"use_adaptive_entropy=True.*fight"):
        EntropyCoefKnob(trainer)
    trainer.args.use_adaptive_entropy = trainer.use_adaptive_entropy = False
    trainer.args.use_liger_kernel = True
    with pytest.raises(KnobNotSupported, match=r"Liger"):
        EntropyCoefKnob(trainer)


POLICY = {
    "name": "test-grpo-signals",
    "controllers": [
        # far above any entropy a 4-token answer reaches: direct acting, every reading raises the bonus
        {"name": "entropy", "probe": "train.entropy", "knob": "entropy_coef", "setpoint": 50.0, "kp": 0.01,
         "direction": "direct"},
        # KL > 0 = setpoint: reverse acting, every reading raises beta
        {"name": "kl", "probe": "train.kl", "knob": "kl_beta", "setpoint": 0.0, "kp": 50.0, "ki": 5.0,
         "direction": "reverse"},
    ],
}


def test_train_entropy_and_kl_control_grpo_at_every_step(tmp_path, char_tokenizer, tiny_model_dir, sqlite_service):
    steps = 6
    trainer, used = make_grpo(tmp_path, char_tokenizer, tiny_model_dir, steps=steps, beta=0.05)
    # a probe beside them, every 2 steps: its readings (taken before the step's log) must not carry
    # the previous step's entropy and kl for the controllers to act on
    probe = Perplexity(HELD_OUT[:2], char_tokenizer, every=2, max_length=16)
    cb = ActuatorCallback(POLICY, connection=sqlite_service.url,
                          setters=[EntropyCoefKnob(trainer), KLBetaKnob(trainer)],
                          knobs={"entropy_coef": {}, "kl_beta": {"min": 0.01, "max": 5.0, "max_step": 0.5}},
                          probes=[probe], reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps(0.2))
    trainer.train()

    assert sorted(used) == list(range(1, steps + 1))
    assert used[1] == {"entropy_coef": pytest.approx(1e-4), "beta": pytest.approx(0.05)}
    # one observation per optimizer step, no probe run, carrying the step's logged entropy and kl
    sent = [h for h in cb.session.history if "entropy" in h["metrics"]]
    assert [h["step"] for h in sent] == list(range(1, steps + 1)), [h["step"] for h in cb.session.history]
    assert all(h["probes"] == {} and not any(k.startswith("probe_") for k in h["metrics"]) for h in sent)
    probed = [h for h in cb.session.history if "perplexity" in h["probes"]]
    assert probed and all("entropy" not in h["metrics"] and "kl" not in h["metrics"] for h in probed)
    assert all(h["metrics"]["kl"] >= 0 for h in sent)

    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions",
                          params={"limit": 100}).json()["items"]
    by_number = {d["number"]: d for d in decisions}
    applied = {name: [e for e in cb.session.applied if e["knob"] == name] for name in ("entropy_coef", "kl_beta")}
    assert len(applied["entropy_coef"]) >= 2 and len(applied["kl_beta"]) >= 2, cb.session.applied
    for entry in cb.session.applied:
        assert entry["applied"] == pytest.approx(by_number[entry["number"]]["new_value"], rel=1e-12)
        if entry["step"] < steps:  # applied at the end of step s: the loss of step s + 1 read exactly it
            key = "entropy_coef" if entry["knob"] == "entropy_coef" else "beta"
            assert used[entry["step"] + 1][key] == pytest.approx(entry["applied"], rel=1e-12), (entry, used)
    assert used[steps]["entropy_coef"] > 1e-4 and used[steps]["beta"] > 0.05
    # the KL controller decided at consecutive steps, on the logged kl of each
    kl_steps = sorted({d["step"] for d in decisions if d["knob"] == "kl_beta"})
    assert any(b == a + 1 for a, b in zip(kl_steps, kl_steps[1:])), kl_steps
    # each decision read the value the trainer logged at its own step (no stale copy from a probe reading)
    logged = {h["step"]: h["metrics"] for h in sent}
    for d in decisions:
        name = {"kl_beta": "kl", "entropy_coef": "entropy"}[d["knob"]]
        assert d["inputs"]["probe"] == f"train.{name}"
        assert d["inputs"]["raw"] == pytest.approx(logged[d["step"] - 1][name], rel=1e-9), (d, logged)


def test_a_metric_the_trainer_never_logs_stops_control_loudly(tmp_path, char_tokenizer, tiny_model_dir, sqlite_service,
                                                             caplog):
    # beta == 0: GRPO never computes (or logs) kl, so a controller on train.kl could never act
    trainer, _ = make_grpo(tmp_path, char_tokenizer, tiny_model_dir, steps=2, beta=0.0)
    policy = {"name": "test-missing", "controllers": [
        {"name": "kl", "probe": "train.kl", "knob": "entropy_coef", "setpoint": 0.1, "kp": 0.01}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, setters=[EntropyCoefKnob(trainer)],
                          knobs={"entropy_coef": {}}).attach(trainer)
    trainer.add_callback(SlowSteps(0.2))
    with caplog.at_level(logging.ERROR, logger="actuator"):
        trainer.train()

    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("the policy reads train.kl, but the trainer did not log 'kl' at step 1" in m
               and "NOT controlled on train.kl" in m and "train.entropy" in m for m in errors), errors
    events = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/events").json()
    unusable = [e for e in events if e["kind"] == "controller_unusable"]
    assert len(unusable) == 1, events
    payload = unusable[0]["payload"]
    assert unusable[0]["step"] == 1 and payload["controller"] == "kl", unusable
    assert "train.kl is not among the metrics the trainer logs" in payload["reason"]
    assert "not controlled" in payload["reason"]
    assert cb.session.applied == []


def test_release_takes_the_entropy_bonus_off_while_entropy_is_over_the_edge(tmp_path, char_tokenizer, tiny_model_dir,
                                                                            sqlite_service):
    """A one-sided knob (``release``): the untrained model's entropy is far over the setpoint, so the
    bonus goes to its floor at once (the controller's max_step aside; the run's own rate limit on the
    knob allows the fall), and the next step's loss reads 0."""
    steps = 4
    trainer, used = make_grpo(tmp_path, char_tokenizer, tiny_model_dir, steps=steps, beta=0.0, entropy_coef=0.05)
    policy = {"name": "test-release", "controllers": [
        {"name": "entropy", "probe": "train.entropy", "knob": "entropy_coef", "setpoint": 0.5, "gains": "relative",
         "kp": 0.3, "ki": 0.02, "max_step": 0.01, "release": 0.1}]}
    cb = ActuatorCallback(policy, connection=sqlite_service.url, setters=[EntropyCoefKnob(trainer)],
                          knobs={"entropy_coef": {"min": 0.0, "max": 0.1, "max_step": 0.1}},
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps(0.2))
    trainer.train()

    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    first = min(decisions, key=lambda d: d["number"])
    logged = {h["step"]: h["metrics"]["entropy"] for h in cb.session.history if "entropy" in h["metrics"]}
    assert logged[first["step"] - 1] > 0.55  # over the edge, setpoint +10%
    assert first["old_value"] == pytest.approx(0.05) and first["new_value"] == 0.0, first  # not 0.04: max_step aside
    assert "released" in first["reason"] and "entropy_coef to its floor 0" in first["reason"], first["reason"]
    assert "release" in first["inputs"]["limited_by"]
    applied = [e for e in cb.session.applied if e["number"] == first["number"]]
    assert applied and applied[0]["step"] < steps
    assert used[applied[0]["step"] + 1]["entropy_coef"] == 0.0  # the loss of the next step read the floor
