"""A slow network: every answer of the service is delayed (a delaying proxy on loopback in front
of the real service). No training step may wait on a request: every HTTP call of the agent while
training steps run is made on the sender's thread, never on the training thread, and steps
complete while requests are in flight. Asserted by recording the thread of every call, which does
not depend on the machine's load. What the slow network costs a step in time is a benchmark
(benchmarks/overhead/slow_network.py), not a test."""

from __future__ import annotations

import pytest

from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from agent_helpers import HELD_OUT, NetworkCalls, SlowSteps, make_trainer
from actuator.testing import SlowProxy

DELAY = 0.5  # seconds added to every response chunk
POLICY = {"name": "slow-net", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}


@pytest.mark.timeout(300)
def test_no_training_step_waits_on_a_slow_network(tmp_path, char_tokenizer, sqlite_service, monkeypatch):
    steps = 120
    calls = NetworkCalls(monkeypatch, steps)
    with SlowProxy(sqlite_service.port, DELAY) as proxy:
        trainer = make_trainer(tmp_path, char_tokenizer, steps=steps, scheduler="constant")
        cb = ActuatorCallback(POLICY, connection=Connection(proxy.url, timeout=3.0, flush_timeout=30.0),
                              knobs={"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": 0.2}},
                              probes=[KLDrift(HELD_OUT, char_tokenizer, every=2, max_length=32)],
                              reporting=Reporting(budget_share=1.0)).attach(trainer)
        trainer.add_callback(SlowSteps(0.02))  # long enough a run for several slow round trips
        trainer.add_callback(calls)  # last: its step end follows the agent's
        trainer.train()
    assert trainer.state.global_step == steps
    assert proxy.connections >= 1

    # the proxy really was slow (each answer at least DELAY), and the loop still closed through it
    sender = cb.session.sender
    assert sender is not None and len(sender.stats.latencies) >= 2 and min(sender.stats.latencies) >= DELAY
    assert sender.stats.sent == cb.session.seq and sender.stats.dropped == 0
    assert cb.session.applied, "decisions came back through the slow network"

    # no request ran on the training thread while steps were under way: they all ran on the sender's
    during = calls.during_steps()
    print(f"\nslow network: {len(calls.calls)} requests, {len(during)} during the {steps} steps, "
          f"{len(calls.on_training_thread())} of them on the training thread; {calls.steps_overlapped} steps ended "
          "while a request was in flight")
    assert len(during) >= 2 and calls.on_training_thread() == []
    assert {c["name"] for c in during} == {"actuator-sender"}
    # and training went on while they were in flight: steps completed under a pending request
    assert calls.steps_overlapped >= 1
