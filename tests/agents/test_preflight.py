"""At train() start a run says, with the arithmetic, when a controller's first decision can only
land after its last step (issue 36's SFT first contact: a preset probing every 10 steps on a
10-step run took one decision, applied never, and said nothing)."""

from __future__ import annotations

import logging

import httpx
import pytest

from actuator import ConfigError
from actuator.agents.callback import ActuatorCallback, Reporting
from actuator.agents.preflight import late_first_decisions
from actuator.agents.probes import KLDrift
from actuator.policy import PolicyDocument

from agent_helpers import HELD_OUT, Lockstep, make_trainer

POLICY = {
    "name": "preflight-drift-lr",
    "probes": [{"name": "kl_drift", "every": 10}],
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.0,
                     "kp": 5.0, "ki": 1.0}],
}
KNOBS = {"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.5}}


def _late(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "after the last step" in r.getMessage()]


def _train_10_steps(tmp_path, tokenizer, service, policy, *, probe_every, caplog) -> ActuatorCallback:
    """A 10-step tiny Trainer under ``policy`` with a KL-drift probe, warnings captured; each answer
    is taken at the step boundary after its reading (Lockstep), as a run of real steps would."""
    trainer = make_trainer(tmp_path, tokenizer, steps=10)
    cb = ActuatorCallback(policy, connection=service.url, knobs=KNOBS,
                          probes=[KLDrift(HELD_OUT, tokenizer, every=probe_every, max_length=32)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(Lockstep(cb))
    with caplog.at_level(logging.WARNING, logger="actuator.agents"):
        trainer.train()
    return cb


def test_a_run_too_short_for_its_first_decision_is_warned_at_train_start(tmp_path, char_tokenizer, sqlite_service,
                                                                         caplog):
    cb = _train_10_steps(tmp_path, char_tokenizer, sqlite_service, POLICY, probe_every=2, caplog=caplog)
    late = _late(caplog)
    assert len(late) == 1, late
    assert "max_steps=10" in late[0] and "every 10 steps" in late[0] and "step 11" in late[0]
    # The warning told the truth: nothing was applied during training.
    assert cb.session.applied == [] or all(e["step"] >= 10 for e in cb.session.applied)
    decisions = httpx.get(f"{sqlite_service.url}/v1/runs/{cb.session.run_id}/decisions").json()["items"]
    assert all(d["step"] >= 10 for d in decisions)


def test_a_run_long_enough_is_not_warned_and_is_controlled(tmp_path, char_tokenizer, sqlite_service, caplog):
    policy = {**POLICY, "probes": [{"name": "kl_drift", "every": 3}]}
    cb = _train_10_steps(tmp_path, char_tokenizer, sqlite_service, policy, probe_every=3, caplog=caplog)
    assert _late(caplog) == []
    assert any(e["step"] < 10 for e in cb.session.applied), cb.session.applied


def test_the_arithmetic_counts_identification_and_resumes():
    doc = PolicyDocument.model_validate(POLICY)
    # every 4 (the probe's own, as the policy names no schedule): reading at 4, applied from 5.
    doc_own = PolicyDocument.model_validate({**POLICY, "probes": []})
    assert late_first_decisions(doc_own, {"kl_drift": 4}, max_steps=5) == []
    assert len(late_first_decisions(doc_own, {"kl_drift": 4}, max_steps=4)) == 1
    # The intervals read are the ones the callback scheduled (a written policy's, here every 10).
    assert len(late_first_decisions(doc, {"kl_drift": 10}, max_steps=10)) == 1
    # Identification holding the knob until step 30 delays the first decision past a 20-step run.
    msgs = late_first_decisions(doc_own, {"kl_drift": 2}, max_steps=20, free_from={"learning_rate": 30})
    assert len(msgs) == 1 and "identification holds learning_rate until step 30" in msgs[0]
    # A resume at step 95 of 100 with a probe every 10: next reading at 100, too late.
    assert len(late_first_decisions(doc_own, {"kl_drift": 10}, max_steps=100, start_step=95)) == 1
    assert late_first_decisions(doc_own, {"kl_drift": 10}, max_steps=100, start_step=85) == []
    # A probe with no schedule never feeds its controller; a probe not given is warned elsewhere.
    assert "never read" in late_first_decisions(doc_own, {"kl_drift": None}, max_steps=100)[0]
    assert late_first_decisions(doc_own, {}, max_steps=100) == []


def test_a_split_range_controller_is_named_by_its_legs_knobs_and_free_once_either_is():
    legs = [{"knob": "learning_rate", "range": [0, 1], "values": [1e-6, 1e-4], "acts": "direct"},
            {"knob": "kl_weight", "range": [-1, 0], "values": [2.0, 0.0], "acts": "reverse"}]
    doc = PolicyDocument.model_validate({"name": "split", "controllers": [{
        "name": "kl", "kind": "split_range", "probe": "kl_drift", "setpoint": 0.1, "gains": "relative",
        "kp": 0.5, "ki": 0.1, "legs": legs}]})
    (msg,) = late_first_decisions(doc, {"kl_drift": None}, max_steps=100)
    assert "(kl_drift -> learning_rate / kl_weight)" in msg and "-> None" not in msg
    # identification holding the learning rate leaves the anchor leg free: no late decision
    assert late_first_decisions(doc, {"kl_drift": 2}, max_steps=20, free_from={"learning_rate": 30}) == []
    (late,) = late_first_decisions(doc, {"kl_drift": 2}, max_steps=20,
                                   free_from={"learning_rate": 30, "kl_weight": 25})
    assert "identification holds learning_rate / kl_weight until step 25" in late


@pytest.mark.parametrize("url, says", [
    ("localhost:8731", "not an http(s) URL"),          # the scheme forgotten: httpx's UnsupportedProtocol before
    ("127.0.0.1:8000", "not an http(s) URL"),
    ("http://127.0.0.1:8000/v1", "/v1 prefix"),         # POST /v1/v1/runs: 404 "fix the policy" before
    ("http://127.0.0.1:8000/v1/", "/v1 prefix"),
    ("http://127.0.0.1:99999", "bad port"),
    ("http://127.0.0.1:8000/?x=1", "query"),
    ("ftp://127.0.0.1:8000", "not an http(s) URL"),
])
def test_a_bad_controller_url_is_refused_when_the_callback_is_built(url, says, monkeypatch):
    with pytest.raises(ConfigError, match="url") as err:
        ActuatorCallback(POLICY, connection=url, knobs=KNOBS)
    assert says in str(err.value)
    monkeypatch.setenv("ACTUATOR_URL", url)
    with pytest.raises(ConfigError, match="ACTUATOR_URL"):
        ActuatorCallback(POLICY, knobs=KNOBS)


def test_good_urls_are_kept_without_a_trailing_slash():
    assert ActuatorCallback(POLICY, connection="http://127.0.0.1:8000/", knobs=KNOBS).session.url == "http://127.0.0.1:8000"
    # A service behind a reverse proxy under a path prefix is a good URL.
    assert ActuatorCallback(POLICY, connection="https://ctl.example/actuator", knobs=KNOBS).session.url == "https://ctl.example/actuator"
