"""What the KL anchor costs a training step, measured in one process on SmolLM2-135M.

    python -m benchmarks.overhead.anchor [--steps 8] [--rounds 3] [--threads 1]

The forgetting scenario's run (narrow task, batch 4, lr 9e-5) three ways, rotated round by round
so machine noise hits all alike: the open loop; ``kl_weight`` = 1 with the benchmark's anchor
(batch 2 × 64 tokens, every position); the same at anchor batch 1; with ``--topics`` also 96 tokens over the 200 topic
prompts too. Each round runs ``--steps`` steps per arm from the same start; the first step
of each arm-round is dropped (warm-up). Reported: median CPU seconds (this process; with one
torch thread it ignores other processes' load) and wall seconds per step per arm, and each
anchored arm's ratio to the open loop (issue 12's target: at most 1.35). The 272-text arm only
with ``--topics``.

Results: a table, and benchmarks/results/overhead_anchor.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.control.harness import RESULTS, console, machine, pick_threads
from benchmarks.control.sft_drift import Setup, make_trainer

import torch  # noqa: E402


class _StepClock:
    """Wall and CPU seconds of each step (CPU time of this process: with one torch thread it does
    not count what other processes on the machine take, so ratios hold under load)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self._t = self._c = 0.0

    def make(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock._t, clock._c = time.perf_counter(), time.process_time()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.times.append(time.perf_counter() - clock._t)
                clock.cpu.append(time.process_time() - clock._c)

        return Clock()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--lr", type=float, default=9e-5)
    ap.add_argument("--topics", action="store_true", help="also the anchor over 272 texts at 96 tokens")
    a = ap.parse_args(argv)
    torch.set_num_threads(pick_threads(a.threads))
    from transformers import Trainer

    from actuator.agents.anchor import KLAnchor, anchor_trainer
    from actuator.agents.general import anchor_set

    out = Path(tempfile.mkdtemp(prefix="actuator-anchor-overhead-"))
    setup = Setup(0, hotpot_records=1)
    with console.status("anchor sets (the starting model's own answers)…"):
        shipped = anchor_set(setup.model, setup.tok, close_cut=True)  # as the forgetting benchmark
        arms: dict[str, Any] = {"open loop": None, "anchor w=1 (72 texts, 64 tokens)": (shipped, 64, 2),
                                "anchor w=1, batch 1": (shipped, 64, 1)}
        if a.topics:
            arms["anchor w=1 (272 texts, 96 tokens)"] = (anchor_set(setup.model, setup.tok, topics=200), 96, 2)
    times: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    for rnd in range(a.rounds):
        for name, spec in arms.items():
            setup.reset()
            trainer = make_trainer(setup, "overhead", a.lr, a.steps, rnd, out)
            if spec is not None:
                texts, length, batch = spec
                anchor = KLAnchor(texts, setup.tok, weight=1.0, batch_size=batch, max_length=length, top_k=64, seed=rnd)
                trainer = anchor_trainer(Trainer)(model=setup.model, args=trainer.args, train_dataset=setup.train,
                                                  data_collator=trainer.data_collator, kl_anchor=anchor)
            clock = _StepClock()
            trainer.add_callback(clock.make())
            trainer.train()
            times[name] += clock.times[1:]
            cpu[name] += clock.cpu[1:]
            console.print(f"round {rnd + 1}/{a.rounds} {name}: {statistics.median(clock.times[1:]):.2f} s/step, "
                          f"{statistics.median(clock.cpu[1:]):.2f} CPU-s/step")
    base, base_cpu = statistics.median(times["open loop"]), statistics.median(cpu["open loop"])
    rows = {name: {"median_s_per_step": statistics.median(times[name]), "ratio": statistics.median(times[name]) / base,
                   "median_cpu_s_per_step": statistics.median(cpu[name]),
                   "cpu_ratio": statistics.median(cpu[name]) / base_cpu, "steps": len(times[name])}
            for name in arms}
    for name, r in rows.items():
        console.print(f"{name:36s} {r['median_cpu_s_per_step']:.2f} CPU-s/step x{r['cpu_ratio']:.2f}; "
                      f"{r['median_s_per_step']:.2f} s/step x{r['ratio']:.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead_anchor.json").write_text(json.dumps(
        {"arms": rows, "steps": a.steps, "rounds": a.rounds, "machine": machine(),
         "command": " ".join(["python -m benchmarks.overhead.anchor", *(argv if argv is not None else sys.argv[1:])])}, indent=2))


if __name__ == "__main__":
    main()
