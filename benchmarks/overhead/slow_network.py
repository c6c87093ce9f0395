"""Agent overhead behind a slow network: what a delayed controller costs a training step in time.

    python -m benchmarks.overhead.slow_network [--delay 0.5] [--steps 200] [--rounds 3]

The same tiny ``Trainer`` run (``tiny_llama``, KL drift probe every 2 steps, a 20 ms pause per
step so that several slow round trips happen mid-run) under ActuatorCallback, talking to the
controller service (SQLite, its own process) directly and through a proxy on loopback that delays
every response chunk by ``--delay`` seconds (actuator.testing.SlowProxy). The two arms are
rotated round by round so machine noise hits both alike. Reported per arm: median and worst step
time (the first step of each run left out: warm-up), the median request latency the sender saw,
and what training paid to hand an observation over (``BackgroundSender.submit``: median and
worst). tests/hardening/test_slow_network.py asserts the behaviour (no request on the training
thread while steps run); the times are measured here, where the machine's load is reported with
them.

Results: a table, and benchmarks/results/overhead_slow_network.json. Figures quoted in
benchmarks/README.md ("Agent overhead") were measured on the machine named in the JSON's
``machine`` (2 cores, shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ..load._harness import machine, start_service, table, write_results  # noqa: E402
from .agent import Clock, _trainer  # noqa: E402

POLICY = {"name": "slow-net", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}
KNOBS = {"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": 0.2}}


def _slow_proxy() -> Any:
    """The tests' delaying proxy (one implementation of it: actuator.testing.SlowProxy)."""
    from actuator.testing import SlowProxy

    return SlowProxy


def _run(url: str, steps: int, tokenizer: Any, data: Any, out: str) -> dict[str, Any]:
    from transformers import TrainerCallback

    import actuator.agents.session as session_module
    from actuator.agents.callback import ActuatorCallback, Connection, Reporting
    from actuator.agents.probes import KLDrift
    from actuator.agents.sender import BackgroundSender
    from actuator.agents.testing import HELD_OUT

    handoffs: list[float] = []

    class TimedSender(BackgroundSender):
        def submit(self, obs: Any) -> None:
            t0 = time.perf_counter()
            super().submit(obs)
            handoffs.append(time.perf_counter() - t0)

    class Pause(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            time.sleep(0.02)

    original, session_module.BackgroundSender = session_module.BackgroundSender, TimedSender  # type: ignore[misc]
    try:
        trainer = _trainer("tiny", tokenizer, steps, out, data)
        cb = ActuatorCallback(POLICY, connection=Connection(url, timeout=3.0, flush_timeout=30.0), knobs=KNOBS,
                              probes=[KLDrift(HELD_OUT, tokenizer, every=2, max_length=32)],
                              reporting=Reporting(budget_share=1.0)).attach(trainer)
        trainer.add_callback(Pause())
        clock = Clock()
        trainer.add_callback(clock)
        trainer.train()
    finally:
        session_module.BackgroundSender = original  # type: ignore[misc]
    steps_s = [b - a for a, b in zip(clock.times, clock.times[1:])][1:]  # the first step carries the warm-up
    latencies = list(cb.session.sender.stats.latencies) if cb.session.sender is not None else []
    return {"median_step_ms": statistics.median(steps_s) * 1e3, "worst_step_ms": max(steps_s) * 1e3,
            "median_request_s": statistics.median(latencies) if latencies else None,
            "median_handoff_us": statistics.median(handoffs) * 1e6, "worst_handoff_us": max(handoffs) * 1e6,
            "decisions": len(cb.session.applied)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delay", type=float, default=0.5, help="seconds added to every response chunk")
    ap.add_argument("--steps", type=int, default=200, help="steps per arm per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="overhead_slow_network")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)  # one core for training, one for the service and the sender thread
    from actuator.agents.testing import NARROW_TASK, char_tokenizer, lm_dataset

    tokenizer = char_tokenizer()
    data = lm_dataset(tokenizer, NARROW_TASK)
    info = machine()
    svc = start_service(f"sqlite:///{tempfile.mkdtemp(prefix='actuator-slow-net-')}/actuator.db")
    slow_proxy = _slow_proxy()
    rows: list[dict[str, Any]] = []
    try:
        _run(svc.url, 10, tokenizer, data, tempfile.mkdtemp())  # imports, allocator, caches
        with slow_proxy(svc.port, args.delay) as proxy:
            for r in range(args.rounds):
                arms = [("direct", svc.url), (f"behind {args.delay:g} s", proxy.url)]
                for arm, url in arms if r % 2 == 0 else arms[::-1]:
                    rows.append({"round": r, "arm": arm, **_run(url, args.steps, tokenizer, data, tempfile.mkdtemp())})
                    print(rows[-1], flush=True)
    finally:
        svc.stop()
    summary = []
    for arm in dict.fromkeys(row["arm"] for row in rows):
        mine = [row for row in rows if row["arm"] == arm]
        summary.append({"arm": arm, **{k: round(statistics.median(row[k] for row in mine), 3)
                                       for k in ("median_step_ms", "median_handoff_us")},
                        "worst_step_ms": round(max(row["worst_step_ms"] for row in mine), 1),
                        "worst_handoff_us": round(max(row["worst_handoff_us"] for row in mine), 1),
                        "median_request_s": round(statistics.median(row["median_request_s"] for row in mine), 3)})
    ratio = summary[1]["median_step_ms"] / summary[0]["median_step_ms"]
    print(table(summary, ["arm", "median_step_ms", "worst_step_ms", "median_request_s", "median_handoff_us",
                          "worst_handoff_us"]))
    print(f"median step behind the slow network / direct: {ratio:.3f}; load average at start "
          f"{info['load_avg_at_start']:.1f}, at end {os.getloadavg()[0]:.1f}")
    path = write_results(args.name, {"machine": info, "args": vars(args), "rounds": rows, "summary": summary,
                                     "median_step_ratio": ratio, "load_avg_at_end": os.getloadavg()[0]})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
