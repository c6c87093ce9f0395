"""The tuned arm's preparation shared by sft_drift, dpo_kl and forgetting
(benchmarks/control/_common.identify_and_tune), without a model or a service: each scenario's
pre-run arm, arguments, controller and policy, and the refusal handling only forgetting has."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

import actuator.client
from actuator import ActuatorError
from benchmarks.control import harness as _common


class FakeClient:
    calls: list[tuple[str, str, dict[str, Any]]] = []
    refuse = False

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url

    def tune_policy(self, run_id: str, controller: str, *, policy: dict[str, Any]) -> dict[str, Any]:
        FakeClient.calls.append((run_id, controller, policy))
        if FakeClient.refuse:
            raise ActuatorError("409: the knob's effect is lost in its noise")
        return {"gains": {"kp": 1.0}}


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    monkeypatch.setattr(actuator.client, "ActuatorClient", FakeClient)
    FakeClient.calls, FakeClient.refuse = [], False
    return FakeClient


def fake_run_arm(runs: list[tuple[dict[str, Any], argparse.Namespace]]) -> Any:
    def run_arm(setup: Any, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
        runs.append((arm, a))
        a.ran = True  # the policy is built after the pre-run
        return {"run_id": "r1", "trace": [{"step": 1}], "seconds": 2.0, "final": {"ppl": 40.0}, "other": 0}
    return run_arm


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(ident_steps=8, ident_hold=3, ident_size=-1.0, lr=3e-5, ran=False, **kw)


def test_the_pre_run_steps_the_knob_then_tune_gets_the_policy_built_after_it(client):
    runs: list[Any] = []
    a = args()
    out = _common.identify_and_tune(fake_run_arm(runs), None, a, "http://x", 0, controller="c",
                                    policy=lambda: {"ran": a.ran}, arm={"lr": a.lr, "steps": 8})
    arm, ran_with = runs[0]
    assert arm == {"name": "identification", "kind": "identify", "lr": 3e-5, "steps": 8,
                   "identify": {"knob": "learning_rate", "size": -1.0, "hold": 3, "length": 5}}
    assert ran_with is a and client.calls == [("r1", "c", {"ran": True})]
    assert out == {"tune": {"gains": {"kp": 1.0}}, "test": arm["identify"],
                   "identification": {"trace": [{"step": 1}], "seconds": 2.0, "run_id": "r1"}}


def test_a_refusal_is_raised_unless_the_scenario_records_it(client):
    client.refuse = True
    with pytest.raises(ActuatorError, match="409"):
        _common.identify_and_tune(fake_run_arm([]), None, args(), "u", 0, controller="c", policy=dict)
    out = _common.identify_and_tune(fake_run_arm([]), None, args(), "u", 0, controller="c", policy=dict,
                                    keep=("trace", "final"), refusals=True)
    assert out["refused"].startswith("409") and out["identification"] == {"trace": [{"step": 1}],
                                                                           "final": {"ppl": 40.0}}


def test_each_scenario_keeps_its_own_pre_run_and_controller(client, monkeypatch):
    from benchmarks.control import dpo_kl, forgetting, sft_drift

    for mod, controller, knob in ((sft_drift, "drift-lr", "learning_rate"), (dpo_kl, "kl-lr", "learning_rate"),
                                  (forgetting, "capability-budget", "kl_weight")):
        runs: list[Any] = []
        monkeypatch.setattr(mod, "run_arm", fake_run_arm(runs))
        policy = {"name": mod.__name__}
        for name in ("pid_policy", "constraint_policy"):
            if hasattr(mod, name):
                monkeypatch.setattr(mod, name, lambda a, _p=policy: _p)
        if hasattr(mod, "restoring_policy"):
            monkeypatch.setattr(mod, "restoring_policy", lambda a, arms, _p=policy: (_p, None))
        a = args(steps=40)
        out = mod.identify_and_tune(None, a, "u", 0)
        arm, ran_with = runs[0]
        assert arm["identify"]["knob"] == knob and client.calls[-1] == ("r1", controller, policy)
        if mod is dpo_kl:  # the pre-run's length through a copy of the arguments
            assert ran_with is not a and ran_with.steps == 8 and a.steps == 40 and "lr" not in arm
        else:
            assert ran_with is a and arm["steps"] == 8 and arm["lr"] == 3e-5
        assert ("final" in out["identification"]) == (mod is forgetting)
    client.refuse = True
    assert "refused" in forgetting.identify_and_tune(None, args(steps=40), "u", 0)
    with pytest.raises(ActuatorError):
        sft_drift.identify_and_tune(None, args(steps=40), "u", 0)
