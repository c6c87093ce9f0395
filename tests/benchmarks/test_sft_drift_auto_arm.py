"""sft-drift's ``gains: auto`` arm (issue 37's auto-vs-fixed comparison): the hand PID with
``gains: auto``, its hand gains carried over as the relative fallback, a valid policy the service
accepts, the step test sized by ``--auto-window`` (or left to the agent), and a negative window
refused naming the flag before a model loads."""

from __future__ import annotations

import pytest

from actuator.policy import load_policy
from benchmarks.control import sft_drift


class _Parsed(Exception):
    pass


def parse(monkeypatch, *argv: str):
    """The scenario's parsed flags (main() parses, then starts the service: stop it there)."""
    seen = {}

    def stop(a):
        seen["a"] = a
        raise _Parsed

    monkeypatch.setattr(sft_drift, "start", stop)
    with pytest.raises(_Parsed):
        sft_drift.main(list(argv))
    return seen["a"]


def test_the_auto_arm_is_the_hand_pid_with_gains_auto_and_its_gains_as_the_relative_fallback(monkeypatch) -> None:
    a = parse(monkeypatch, "--auto-window", "12")
    hand = sft_drift.pid_policy(a)["controllers"][0]
    auto = sft_drift.auto_policy(a)["controllers"][0]
    assert auto["gains"] == "auto"
    # the hand gains are kp 4 / setpoint per nat; relative, that is kp 4 per unit of relative error
    assert auto["kp"] * 1 / a.setpoint == pytest.approx(hand["kp"])
    assert auto["ki"] * 1 / a.setpoint == pytest.approx(hand["ki"])
    assert auto["identify"] == {"hold": 3, "length": 9}
    for key in ("probe", "knob", "setpoint", "direction", "filter"):
        assert auto[key] == hand[key]
    doc = load_policy(sft_drift.auto_policy(a))
    c = doc.controllers[0]
    assert c.gains == "auto" and c.identify.hold == 3 and c.identify.length == 9


def test_without_a_window_the_agent_sizes_the_test(monkeypatch) -> None:
    a = parse(monkeypatch)
    auto = sft_drift.auto_policy(a)["controllers"][0]
    assert "identify" not in auto
    assert load_policy(sft_drift.auto_policy(a)).controllers[0].identify is None


def test_a_negative_window_is_refused_naming_the_flag(capsys) -> None:
    with pytest.raises(SystemExit):
        sft_drift.main(["--auto-window", "-1"])
    assert "--auto-window must be >= 0, got -1" in capsys.readouterr().err


def run(kind: str, seed: int, drifts: list[float], outcome: dict | None = None) -> dict:
    return {"arm": kind, "kind": kind, "seed": seed, "final_kl_drift": sum(drifts[-3:]) / 3,
            "trace": [{"step": 2 * i, "kl_drift": d, "lr": 3e-5} for i, d in enumerate(drifts)],
            "auto_gains": outcome}


def test_auto_is_judged_against_the_hand_gains_on_the_seeds_both_ran() -> None:
    hand = [0.5, 1.2, 1.7, 1.6, 1.55, 1.5]
    late = [0.5, 1.6, 2.6, 2.4, 2.3, 2.2]  # the step test holds the rate while drift passes the setpoint
    runs = {("actuator", s): run("actuator", s, hand) for s in range(5)}
    runs |= {("auto", s): run("auto", s, late, {"kind": "auto_gains_fallback", "problem": "wrong_direction"})
             for s in range(4)}
    runs[("auto", 4)] = run("auto", 4, hand, {"kind": "auto_gains"})  # as good on one seed
    v = sft_drift.auto_against_hand(runs, 1.5)
    assert v["seeds"] == [0, 1, 2, 3, 4]
    assert v["final_error_no_worse"]["seeds_held"] == 1 and v["final_error_no_worse"]["met"] is False
    assert v["peak_no_higher"]["held_per_seed"] == {"0": False, "1": False, "2": False, "3": False, "4": True}
    assert v["final_error_no_worse"]["auto"] > v["final_error_no_worse"]["hand"]
    assert v["outcome"] == {"0": "wrong_direction", "1": "wrong_direction", "2": "wrong_direction",
                            "3": "wrong_direction", "4": "auto_gains"}
    # without an auto arm there is nothing to judge
    assert sft_drift.auto_against_hand({k: r for k, r in runs.items() if k[0] == "actuator"}, 1.5) == {}
