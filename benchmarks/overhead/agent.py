"""Agent overhead: what ActuatorCallback costs a real ``Trainer`` run, measured in one process.

    python -m benchmarks.overhead.agent [--model tiny|small|smollm2] [--steps 60] [--rounds 5]
                                        [--probe-steps 120] [--report-every 1]

1. Probes off. Three arms, rotated round by round so machine noise hits all alike: the same
   Trainer run without the callback; with it and nothing to send (probes off, the default
   ``report_every=0``); with it sending training metrics every ``--report-every`` steps (1: the
   most it ever sends without probes). The controller service runs as its own process (SQLite).
   Reported: the ratio of median step times (with / without - 1), per round and its median;
   and, with less noise, the time spent inside the callback's hooks per step over the step time.
2. Probes on (KL drift every 5 steps, perplexity every 10, ``budget_share`` 10%): the wall-time
   share the probes took against the budget, as the ProbeSuite measured it and as the step clock
   saw it.

Results: a table, and benchmarks/results/overhead_agent.json.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from ..load._harness import machine, start_service, table, write_results  # noqa: E402

POLICY = {"name": "overhead", "controllers": [{"name": "loss-lr", "probe": "train.loss", "knob": "learning_rate",
                                               "setpoint": 0.5, "kp": 0.2, "ki": 0.05, "deadband": 0.05}]}
PROBE_POLICY = {"name": "overhead-probes", "controllers": [{"name": "drift-lr", "probe": "kl_drift",
                                                            "knob": "learning_rate", "setpoint": 0.05, "kp": 0.5}]}


def _trainer(model_kind: str, tokenizer: Any, steps: int, out: str, data: Any) -> Any:
    import torch
    from transformers import Trainer, TrainingArguments

    from actuator.agents.models import load_smollm2, tiny_llama

    if model_kind == "smollm2":
        model, _ = load_smollm2()
    elif model_kind == "small":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=688,
                                             num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                             max_position_embeddings=128))
    else:
        model = tiny_llama(seed=0)
    args = TrainingArguments(output_dir=out, max_steps=steps, per_device_train_batch_size=4, learning_rate=1e-3,
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    from transformers.trainer_callback import PrinterCallback

    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.remove_callback(PrinterCallback)  # logging every step feeds the callback, printing is noise
    return trainer


class Clock:
    """Step boundary times (a callback present in every arm, so its own cost cancels out)."""

    def __new__(cls):  # type: ignore[no-untyped-def]
        from transformers import TrainerCallback

        class _Clock(TrainerCallback):
            def __init__(self) -> None:
                self.times: list[float] = []

            def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
                if not self.times:
                    self.times.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
                self.times.append(time.perf_counter())

        return _Clock()


def _timed_hooks(cb: Any) -> dict[str, float]:
    """Wrap the callback's per-step hooks to add up the time training spends inside them."""
    spent = {"seconds": 0.0}
    for name in ("on_step_begin", "on_step_end", "on_log", "on_substep_end", "on_pre_optimizer_step",
                 "on_optimizer_step"):
        original = getattr(cb, name)
        spent[name] = 0.0

        @functools.wraps(original)
        def timed(*a: Any, __original: Any = original, __name: str = name, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __original(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                spent["seconds"] += dt
                spent[__name] += dt

        setattr(cb, name, timed)
    return spent


def _round_row(r: int, res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One round: each callback arm's median step against the arm without the callback."""
    base = res["without"]["median_step_s"]
    row: dict[str, Any] = {"round": r + 1, "step_ms_without": round(base * 1e3, 3)}
    for name in ("with", "with_every_step"):
        x = res[name]
        tag = "" if name == "with" else "_every_step"
        row[f"step_ms{tag}"] = round(x["median_step_s"] * 1e3, 3)
        row[f"overhead_pct{tag}"] = round(100 * (x["median_step_s"] / base - 1), 2)
        row[f"hooks_us{tag}"] = round(x["hook_s_per_step"] * 1e6, 1)
        row[f"hooks_pct{tag}"] = round(100 * x["hook_s_per_step"] / base, 3)
        row[f"by_hook{tag}"] = x["hook_us_per_step_by_hook"]
        row[f"observations{tag}"] = x["observations"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny", "small", "smollm2"], default="small")
    ap.add_argument("--steps", type=int, default=60, help="steps per arm per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--probe-steps", type=int, default=120, help="steps of the probes-on phase (0: skip it)")
    ap.add_argument("--report-every", type=int, default=1,
                    help="third arm: the callback sends training metrics every N steps (1: the most it sends)")
    ap.add_argument("--name", default="overhead_agent")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)  # one core for training, one for the service and the sender thread
    from actuator.agents.testing import HELD_OUT, NARROW_TASK, char_tokenizer, lm_dataset
    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.probes import KLDrift, Perplexity

    if args.model == "smollm2":
        from actuator.agents.models import load_smollm2

        _, tokenizer = load_smollm2()
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    else:
        tokenizer = char_tokenizer()
    data = lm_dataset(tokenizer, NARROW_TASK * 4, length=64)
    info = machine()
    svc = start_service(f"sqlite:///{tempfile.mkdtemp(prefix='actuator-overhead-')}/actuator.db")
    tmp = tempfile.mkdtemp(prefix="actuator-overhead-")
    rounds: list[dict[str, Any]] = []
    try:
        def arm(with_callback: bool, steps: int, probes: bool = False, report_every: int = 0) -> dict[str, Any]:
            trainer = _trainer(args.model, tokenizer, steps, tmp, data)
            clock = Clock()
            cb = spent = None
            if with_callback:
                cb = ActuatorCallback(
                    PROBE_POLICY if probes else POLICY, connection=svc.url,
                    knobs={"learning_rate": {"min": 1e-5, "max": 1e-2, "max_step": 0.3}},
                    probes=[KLDrift(HELD_OUT, tokenizer, every=5, max_length=32),
                            Perplexity(HELD_OUT, tokenizer, every=10, max_length=32)] if probes else None,
                    reporting={"budget_share": 0.10, "report_every": report_every}).attach(trainer)
                spent = _timed_hooks(cb)
            trainer.add_callback(clock)
            t0 = time.perf_counter()
            trainer.train()
            wall = time.perf_counter() - t0
            steps_dt = [b - a for a, b in zip(clock.times, clock.times[1:])][2:]  # drop warm-up steps
            out = {"median_step_s": statistics.median(steps_dt), "mean_step_s": statistics.fmean(steps_dt),
                   "wall_s": wall, "steps": steps}
            if cb is not None:
                out["hook_s_per_step"] = spent["seconds"] / steps
                out["hook_us_per_step_by_hook"] = {k: round(1e6 * v / steps, 1) for k, v in spent.items()
                                                   if k != "seconds" and v}
                out["observations"] = cb.session.seq
                out["delivered"] = cb.session.sender.stats.sent if cb.session.sender else 0
                if probes and cb.session.suite is not None:
                    out["probe_share_suite"] = cb.session.suite.probe_share
                    out["probe_runs"] = sum(1 for h in cb.session.history if h["probes"])
            return out

        arm(False, 5)
        arm(True, 5, report_every=1)  # warm-up: imports, allocator, the service's first requests
        arms = {"without": dict(with_callback=False), "with": dict(with_callback=True, report_every=0),
                "with_every_step": dict(with_callback=True, report_every=args.report_every)}
        names = list(arms)
        for r in range(args.rounds):
            order = names[r % 3:] + names[:r % 3]  # rotate, so drift in machine load hits every arm
            row = _round_row(r, {name: arm(steps=args.steps, **arms[name]) for name in order})
            rounds.append(row)
            print(f"round {r + 1}: {row}", flush=True)
        base_probe = with_probe = None
        if args.probe_steps > 0:
            base_probe = arm(False, args.probe_steps)
            with_probe = arm(True, args.probe_steps, probes=True)
    finally:
        svc.stop()

    summary = {f"{key}{tag}": statistics.median(x[f"{key}{tag}"] for x in rounds)
               for tag in ("", "_every_step") for key in ("overhead_pct", "hooks_pct", "hooks_us")}
    probe_wall_share = 1 - base_probe["wall_s"] / with_probe["wall_s"] if with_probe else None
    print()
    print(table(rounds, ["round", "step_ms_without", "step_ms", "overhead_pct", "hooks_us", "step_ms_every_step",
                         "overhead_pct_every_step", "hooks_us_every_step"]))
    median_step = statistics.median(x["step_ms_without"] for x in rounds)
    print(f"\nprobes off, {args.model} model, median step {median_step:.1f} ms, "
          f"{args.steps} steps x {args.rounds} rounds (medians of rounds; target <= 1%):")
    print(f"  callback, nothing to send (report_every=0): step time {summary['overhead_pct']:+.2f}%, "
          f"inside its hooks {summary['hooks_us']:.0f} us/step = {summary['hooks_pct']:.3f}% of a step")
    print(f"  callback sending training metrics every {args.report_every} step(s): "
          f"step time {summary['overhead_pct_every_step']:+.2f}%, "
          f"inside its hooks {summary['hooks_us_every_step']:.0f} us/step = {summary['hooks_pct_every_step']:.3f}%")
    print(f"  per hook (us/step, reporting arm, last round): {rounds[-1]['by_hook_every_step']}")
    if with_probe:
        print(f"probes on ({args.probe_steps} steps, KL drift every 5, perplexity every 10, budget 10%): probe share "
              f"{100 * with_probe['probe_share_suite']:.1f}% as measured by the ProbeSuite; the run took "
              f"{100 * probe_wall_share:.1f}% longer than without the callback; "
              f"probes ran {with_probe['probe_runs']} times")
    cmd = "python -m benchmarks.overhead.agent " + " ".join(sys.argv[1:])
    path = write_results(args.name, {
        "command": cmd.strip(), "machine": info, "model": args.model, "report_every": args.report_every,
        "rounds": rounds, "summary": summary,
        "probes_on": None if with_probe is None else {
            "budget_share": 0.10, "probe_share_suite": with_probe["probe_share_suite"],
            "wall_increase_vs_no_callback": probe_wall_share, "probe_runs": with_probe["probe_runs"],
            "wall_s_with": with_probe["wall_s"], "wall_s_without": base_probe["wall_s"]},
    })
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
