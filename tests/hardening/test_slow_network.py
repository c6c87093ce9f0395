"""A slow network: every answer of the service is delayed (a delaying proxy on loopback in front
of the real service). Training step time must not change beyond the queue handoff: the same tiny
Trainer run, direct and through the proxy, in one process."""

from __future__ import annotations

import statistics
import time

import actuator.agents.session as session_module  # the session builds the sender and client
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from actuator.agents.sender import BackgroundSender
from agent_helpers import HELD_OUT, SlowSteps, make_trainer
from harden import StepClock
from slowproxy import SlowProxy

DELAY = 0.5  # seconds added to every response chunk
POLICY = {"name": "slow-net", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}


class TimedSender(BackgroundSender):
    """The callback's sender, timing the one call training makes into it."""

    handoffs: list[float] = []

    def submit(self, obs):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        super().submit(obs)
        TimedSender.handoffs.append(time.perf_counter() - t0)


def run(tmp_path, tokenizer, url: str, steps: int) -> tuple[list[float], ActuatorCallback]:
    trainer = make_trainer(tmp_path, tokenizer, steps=steps, scheduler="constant")
    cb = ActuatorCallback(POLICY, connection=Connection(url, timeout=3.0, flush_timeout=30.0),
                          knobs={"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": 0.2}},
                          probes=[KLDrift(HELD_OUT, tokenizer, every=2, max_length=32)],
                          reporting=Reporting(budget_share=1.0)).attach(trainer)
    trainer.add_callback(SlowSteps(0.02))  # long enough a run for several slow round trips
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    assert trainer.state.global_step == steps
    return clock.intervals[1:], cb  # the first step carries the warm-up


def test_slow_responses_do_not_slow_training(tmp_path, char_tokenizer, sqlite_service, monkeypatch):
    monkeypatch.setattr(session_module, "BackgroundSender", TimedSender)
    steps = 200  # >= 4 s of training: registration and several posts make their slow round trips
    run(tmp_path / "warm", char_tokenizer, sqlite_service.url, 10)  # imports, allocator, caches
    direct, cb_direct = run(tmp_path / "direct", char_tokenizer, sqlite_service.url, steps)
    TimedSender.handoffs.clear()
    with SlowProxy(sqlite_service.port, DELAY) as proxy:
        slow, cb_slow = run(tmp_path / "slow", char_tokenizer, proxy.url, steps)
    assert proxy.connections >= 1

    # the proxy really was slow, and the loop still closed through it
    latencies = list(cb_slow.sender.stats.latencies)
    assert latencies and statistics.median(latencies) >= DELAY
    assert cb_slow.sender.stats.sent == cb_slow.seq and cb_slow.sender.stats.dropped == 0
    assert cb_slow.applied, "decisions came back through the slow network"

    # no step waited for an answer
    assert max(slow) < DELAY / 2, f"a step took {max(slow):.3f}s behind a {DELAY}s network"
    # and typical step time is the same as direct (noise on shared cores allowed)
    med_direct, med_slow = statistics.median(direct), statistics.median(slow)
    assert med_slow <= med_direct * 1.5 + 0.005, (med_direct, med_slow)
    # what training pays for talking to the service: a queue put (microseconds; the worst case is
    # a wait for the GIL held by the sender thread, bounded by the 5 ms switch interval, never by
    # the network)
    assert statistics.median(TimedSender.handoffs) < 0.001, statistics.median(TimedSender.handoffs)
    assert max(TimedSender.handoffs) < 0.05, max(TimedSender.handoffs)
    print(f"\nslow network: median step {med_direct * 1e3:.2f} ms direct, {med_slow * 1e3:.2f} ms behind "
          f"{DELAY}s responses (median request {statistics.median(latencies):.2f}s); worst step "
          f"{max(slow) * 1e3:.1f} ms; worst handoff {max(TimedSender.handoffs) * 1e6:.0f} us")
