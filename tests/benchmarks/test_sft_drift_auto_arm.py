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
