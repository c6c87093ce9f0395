"""ActuatorCallback on a real Trainer.train() with a real controller service."""

from __future__ import annotations

import logging
import time

import httpx
import pytest
from transformers import TrainerCallback

from actuator import ConfigError
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift

from agent_helpers import HELD_OUT, NetworkCalls, SlowSteps, make_trainer, record_lr_used

POLICY = {
    "name": "test-drift-lr",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 5.0, "ki": 1.0}],
}


@pytest.mark.parametrize("scheduler", ["linear", "cosine", "constant_with_warmup"])
def test_learning_rate_decisions_are_what_the_optimizer_uses(tmp_path, char_tokenizer, sqlite_service, scheduler):
    trainer = make_trainer(tmp_path, char_tokenizer, steps=24, scheduler=scheduler)
    used = record_lr_used(trainer)
    cb = ActuatorCallback(
        POLICY, connection=sqlite_service.url,
        knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
        probes=[KLDrift(HELD_OUT, char_tokenizer, every=3, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()

    assert cb.session.run_id is not None
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert len(decisions) >= 2, "drift above a zero setpoint must lower the learning rate"
    assert len(cb.session.applied) >= 2
    by_number = {d["number"]: d for d in decisions}
    # The knob is the schedule's peak: the lr a step runs with is the ordered peak times the
    # schedule's own factor at that step (warm-up and decay untouched).
    lam = trainer.lr_scheduler.lr_lambdas[0]
    for entry in cb.session.applied:
        ordered = by_number[entry["number"]]["new_value"]
        assert entry["applied"] == pytest.approx(ordered, rel=1e-12)
        # The step that follows the boundary where it was applied ran with exactly that peak
        # (optimizer step k+1 is used[k]: used[] is 0-based, global_step counts from 1); one
        # applied at the final boundary has no next step.
        if entry["step"] < len(used):
            assert used[entry["step"]] == pytest.approx(ordered * lam(entry["step"]), rel=1e-9), (entry, used)
    assert sum(e["step"] < len(used) for e in cb.session.applied) >= 1
    # Every applied value was lower than the last: drift is above setpoint 0.
    news = [e["applied"] for e in cb.session.applied]
    assert all(b < a for a, b in zip(news, news[1:]))
    # The scheduler's shape survives: between decisions the lr still follows lambda(step)
    last = cb.session.applied[-1]
    k = last["step"]
    if k + 2 <= len(used):
        assert used[k + 1] == pytest.approx(last["applied"] * lam(k + 1), rel=1e-9)
    # The trainer's log (what TensorBoard / W&B receive) carries the knob (peak) in effect at each
    # step, beside the trainer's own learning_rate (the scheduled value).
    logged = [(h["step"], h["actuator/learning_rate"]) for h in trainer.state.log_history if "actuator/learning_rate" in h]
    assert len(logged) >= 20
    for step, peak in logged:
        if step < len(used):
            assert peak * lam(step) == pytest.approx(used[step], rel=1e-9)
    assert any("actuator/learning_rate_ordered" in h for h in trainer.state.log_history)
    # The observations report the knob value in effect.
    state = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    assert state["state"] == "finished"
    assert state["knobs_in_effect"]["learning_rate"] == pytest.approx(cb.session.history[-1]["knobs"]["learning_rate"])


class KillAt(TrainerCallback):
    def __init__(self, service, step: int) -> None:
        self.service, self.step = service, step
        self.killed_at: float | None = None

    def on_step_end(self, args, state, control, **kw):
        if state.global_step == self.step:
            self.service.kill()
            self.killed_at = time.monotonic()


def test_controller_killed_mid_run_training_finishes(tmp_path, char_tokenizer, sqlite_service, caplog, monkeypatch):
    calls = NetworkCalls(monkeypatch, 30)
    trainer = make_trainer(tmp_path, char_tokenizer, steps=30, scheduler="constant")
    used = record_lr_used(trainer)
    cb = ActuatorCallback(
        POLICY, connection=Connection(sqlite_service.url, flush_timeout=1.0, timeout=0.5),
        knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
        probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    killer = KillAt(sqlite_service, step=12)
    trainer.add_callback(killer)
    trainer.add_callback(SlowSteps(0.02))
    trainer.add_callback(calls)  # last: its step end follows the agent's
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        out = trainer.train()
    assert trainer.state.global_step == 30 and out.global_step == 30
    assert killer.killed_at is not None
    # after the kill the lr stays at the last applied value: training continues with the last values
    # (answers already in flight at the kill may still land at the next boundary or two)
    assert all(lr == pytest.approx(used[15]) for lr in used[15:])
    warnings = [r for r in caplog.records if "controller unreachable" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    # the sender never blocked training: no request of the agent ran on the training thread while
    # steps ran (asserted by thread, not by a clock: the machine may be loaded)
    assert cb.session.sender is not None and cb.session.sender.backlog > 0
    assert calls.during_steps() and calls.on_training_thread() == []


def test_probe_schedule_comes_from_the_policy(tmp_path, char_tokenizer, sqlite_service):
    """Changing how often probes run is a policy change, not a code change."""
    import httpx as _httpx

    stored = {**POLICY, "name": "schedule-policy", "probes": [{"name": "kl_drift", "every": 2}]}
    assert _httpx.post(f"{sqlite_service.url}/v1/policies", json=stored).status_code == 201
    trainer = make_trainer(tmp_path, char_tokenizer, steps=20, scheduler="constant")
    probe = KLDrift(HELD_OUT, char_tokenizer, every=1000, max_length=32)  # the script says: rarely
    cb = ActuatorCallback("schedule-policy", connection=sqlite_service.url, probes=[probe],
                          reporting=Reporting(budget_share=1.0),
                          knobs={"learning_rate": {"min": 1e-5, "max": 1e-2}}).attach(trainer)
    trainer.add_callback(SlowSteps(0.03))
    trainer.train()
    assert probe.every == 2
    steps = [h["step"] for h in cb.session.history if "kl_drift" in h["probes"]]
    assert len(steps) >= 8 and all(s % 2 == 0 for s in steps)


def test_unknown_stored_policy_fails_loudly_at_train_start(tmp_path, char_tokenizer, sqlite_service):
    """A policy name the service does not have is the user's mistake, not an outage: train() stops
    before its first step with an error that names the policy."""
    trainer = make_trainer(tmp_path, char_tokenizer, steps=6, scheduler="constant")
    cb = ActuatorCallback("no-such-policy", connection=sqlite_service.url,
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)]).attach(trainer)
    with pytest.raises(ConfigError, match=r"policy: .*no stored policy 'no-such-policy'"):
        trainer.train()
    assert trainer.state.global_step == 0
    assert cb.session.run_id is None and cb.session.sender is None
    assert httpx.get(f"{sqlite_service.url}/v1/runs").json() == []


RAISE_POLICY = {
    "name": "test-raise-lr",
    # drift far below the setpoint and a pure integral: the controller asks for more lr every probe
    "controllers": [{"name": "raise", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 50.0,
                     "kp": 0.0, "ki": 0.05}],
}


@pytest.mark.parametrize("explicit_max", [None, 5e-2])
def test_default_bounds_never_raise_the_lr_above_the_configured_value(tmp_path, char_tokenizer, sqlite_service,
                                                                      explicit_max):
    lr = 5e-3
    trainer = make_trainer(tmp_path, char_tokenizer, steps=12, scheduler="constant", lr=lr)
    used = record_lr_used(trainer)
    knobs = None if explicit_max is None else {"learning_rate": {"min": lr / 100, "max": explicit_max}}
    cb = ActuatorCallback(RAISE_POLICY, connection=sqlite_service.url, knobs=knobs,
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps())
    trainer.train()

    run = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}").json()
    if explicit_max is None:
        assert run["knobs"]["learning_rate"]["max"] == pytest.approx(lr)
        assert max(used) <= lr * (1 + 1e-9) and not cb.session.applied
    else:  # the same policy with room above does raise it: the default is what held it
        assert cb.session.applied and max(used) > lr * 1.05


def test_refused_registration_fails_loudly_at_train_start(tmp_path, char_tokenizer, sqlite_service):
    """A configuration the service refuses (here: a controller whose bounds miss its knob's) stops
    train() before the first step, with the service's message naming the field; nothing is stored."""
    trainer = make_trainer(tmp_path, char_tokenizer, steps=6, scheduler="constant")
    used = record_lr_used(trainer)
    policy = {"name": "miss-the-knob", "controllers": [
        {"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1.0,
         "min": 1.0, "max": 2.0}]}  # the learning rate's bounds are [5e-5, 5e-3]
    cb = ActuatorCallback(policy, connection=sqlite_service.url,
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)]).attach(trainer)
    with pytest.raises(ConfigError, match=r"refused to register.*422.*controllers\.0\.(min|max)") as info:
        trainer.train()
    assert info.value.__cause__ is not None and info.value.__cause__.status_code == 422
    assert trainer.state.global_step == 0 and used == []
    assert cb.session.run_id is None and cb.session.sender is None
    assert httpx.get(f"{sqlite_service.url}/v1/runs").json() == []


def test_unreachable_service_at_train_start_trains_without_control(tmp_path, char_tokenizer, caplog):
    """Only an unreachable service means 'train on without control': one warning, every step runs."""
    from actuator.testing import free_port

    trainer = make_trainer(tmp_path, char_tokenizer, steps=8, scheduler="constant")
    cb = ActuatorCallback(POLICY, connection=Connection(f"http://127.0.0.1:{free_port()}", flush_timeout=0.5),
                          probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)]).attach(trainer)
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    assert trainer.state.global_step == 8
    assert cb.session.run_id is None and cb.session.sender is not None and cb.session.sender.backlog == len(cb.session.history) > 0
    warnings = [r.getMessage() for r in caplog.records if "controller unreachable" in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_the_audit_trail_says_which_decisions_the_agent_applied(tmp_path, char_tokenizer, service):
    """Each decision the agent applied is stored with the step boundary and the value it really
    set; the decision ordered on the final step's observation, which no step is left to use, is
    stored as not applied, and the CLI's --explain says so (SQLite and Postgres)."""
    from typer.testing import CliRunner

    from actuator.cli import app

    trainer = make_trainer(tmp_path, char_tokenizer, steps=12)
    cb = ActuatorCallback(
        POLICY, connection=service.url, knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}},
        probes=[KLDrift(HELD_OUT, char_tokenizer, every=3, max_length=32)], reporting=Reporting(budget_share=1.0),
    ).attach(trainer)
    trainer.add_callback(SlowSteps(0.2))
    trainer.train()

    stored = httpx.get(f"{service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    by_number = {d["number"]: d for d in stored}
    assert len(cb.session.applied) >= 2, cb.session.applied
    for entry in cb.session.applied:
        d = by_number[entry["number"]]
        assert d["applied_step"] == entry["step"] and d["skipped"] is None, (d, entry)
        assert d["applied_value"] == pytest.approx(entry["applied"], rel=1e-12)
    applied = {e["number"] for e in cb.session.applied}
    never = [d for d in stored if d["number"] not in applied]
    assert never, "the last observation (step 12) orders a decision no step is left to apply"
    assert max(by_number) in {d["number"] for d in never}
    assert all(d["applied_step"] is None and d["applied_value"] is None and d["skipped"] is None for d in never)

    out = CliRunner().invoke(app, ["decisions", cb.session.run_id, "--url", service.url, "--explain"])
    assert out.exit_code == 0, out.output
    assert out.output.count("NOT applied") == len(never)
    assert out.output.count("applied after step") == len(applied)
