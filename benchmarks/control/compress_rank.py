"""compress-rank: shrink the MLPs of the real SmolLM2-135M-Instruct to a low rank while it
fine-tunes briefly on general text, within a perplexity budget.

Every MLP projection (gate/up/down of the 30 layers) becomes a ``LowRankLinear`` from an
activation-aware SVD (``actuator.agents.compression.factorize`` with calibration batches); its
*active rank* is the ``rank`` knob (``RankKnob``), changed mid-run without rebuilding the
optimizer. All arms start at full rank (576: exact) and fine-tune with the same data order,
seed, learning rate and probe (``Perplexity`` on held-out text every ``--probe-every`` steps).
The budget is the dense model's held-out perplexity + ``--budget`` (8%).

Arms:
- cubic (open loop): AdaLoRA's cubic rank-budget schedule (``FixedSchedule.cubic``) from 576 to
  a final rank chosen the way one would without a controller: the smallest rank of an offline
  sweep of the factorised, not yet fine-tuned model whose perplexity meets the budget.
- Actuator: a PID on perplexity through the real controller service and ``ActuatorCallback``
  (policy shaped like ``actuator/presets/compress-ppl.yaml``): a relative setpoint, "+6%" of the
  first measurement (the run starts at full rank, so that is the dense perplexity), i.e. the
  budget less a ``--backoff`` of 2 points: a controller that holds perplexity *at* the budget is
  over it every other measurement from probe noise alone (measured: ±1-1.5% between probes),
  so it aims inside the constraint, as process control does. Direction ``reverse``.
  Reverse acting is what makes it *shrink*: with perplexity below the setpoint the error
  ``setpoint − ppl`` is positive and a reverse-acting PID answers with a lower knob, so the
  integral keeps lowering the rank for as long as perplexity is within budget, at a pace
  proportional to the headroom left (the proportional term gives rank back as the headroom is
  used up, which damps the approach); above the setpoint the same law grows the rank back. The
  preset's guardrail (+10%: ``adjust`` rank × 1.25) is kept as a backstop for a sharp breach.
  Gains are set in units of the run (ranks per unit of perplexity headroom), from the measured
  start perplexity, so the same policy works on another model.
- cubic to the Actuator arm's final rank (run after it; ``--no-match-arm`` skips it): the open
  loop reaching the *same* size, to separate "smaller" from "closed loop".

Reported: final rank and parameter count (of the exported model: ``compression_stats``), final
perplexity and its increase over the dense model, steps over budget (probe intervals whose
measurement exceeded the budget, in steps).

Parameter break-even: a rank-k factorisation of a 576×1536 projection keeps k·(576 + 1536)
parameters, fewer than the dense 576·1536 only for k < 419. SmolLM2-135M's MLP spectra are flat
(the offline sweep: +8% perplexity is spent by rank ~530 before fine-tuning), so in a short run
every arm stays above the break-even and the "compressed" model is *larger* than the dense one
(the table's "vs dense" column); the comparison between arms (which one gets smaller within the
budget) is what this scenario measures. Fine-tuning heals the truncation and adapts to the
text, which is the headroom a closed loop can spend and an open-loop schedule cannot see.

    python -m benchmarks.control.compress_rank [--steps 60] [--seeds 0] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path
from typing import Any

from benchmarks.control._common import (
    scenario_args,
    arm_label, figure, record_targets,
    command_line, console, arm_progress, pick_threads, save_results, start_controller,
)

import torch  # noqa: E402
from rich.table import Table  # noqa: E402

from benchmarks.control.draft_distill import blocks, stdlib_text  # noqa: E402

SCENARIO = "compress-rank"
SWEEP = (576, 560, 544, 528, 512, 496, 480, 448, 416, 384, 320, 256)


class Setup:
    """The factorised model, data and probe every arm shares."""

    def __init__(self, a: argparse.Namespace) -> None:
        from actuator.agents.compression import compression_stats, factorize
        from actuator.agents.models import load_smollm2

        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            model, self.tok = load_smollm2()
        data = blocks(self.tok, stdlib_text(), a.seq_len)
        self.heldout_texts = [self.tok.decode(b) for b in data[: a.heldout]]
        self.train = data[a.heldout:]
        self.ppl_probe_args = {"max_length": a.seq_len + 8, "batch_size": 8}
        self.dense_params = sum(p.numel() for p in model.parameters())
        self.dense_ppl = self.perplexity(model)
        calib = [torch.stack(self.train[i: i + 4]) for i in range(0, a.calibration, 4)]
        t0 = time.time()
        with console.status("factorising the MLPs (activation-aware SVD)…"):
            self.names = factorize(model, calibration=calib)
        self.factorize_seconds = time.time() - t0
        self.model0 = model
        self.stats = compression_stats

    def ppl_probe(self, every: int | None) -> Any:
        from actuator.agents.probes import Perplexity

        return Perplexity(self.heldout_texts, self.tok, every=every, **self.ppl_probe_args)

    def perplexity(self, model: Any) -> float:
        return self.ppl_probe(None).measure(model, step=0)["perplexity"]

    def params_at(self, model: Any) -> int:
        return int(self.stats(model)["model"]["params"])

    def sweep(self, ranks: tuple[int, ...]) -> list[dict[str, float]]:
        from actuator.agents.compression import set_active_rank

        out = []
        for r in ranks:
            set_active_rank(self.model0, r)
            out.append({"rank": r, "perplexity": self.perplexity(self.model0), "params": self.params_at(self.model0)})
        set_active_rank(self.model0, 576)
        return out


def make_trainer(setup: Setup, model: Any, name: str, a: argparse.Namespace, seed: int) -> Any:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    torch.manual_seed(seed)
    train = [{"input_ids": ids, "labels": ids} for ids in setup.train]
    args = TrainingArguments(
        output_dir=str(a.out / name), max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0, weight_decay=0.0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def pid_policy(a: argparse.Namespace, start_ppl: float, full_rank: int) -> dict[str, Any]:
    """preset:compress-ppl with gains in the run's units. ``headroom`` = the perplexity room
    the budget leaves at the start; ``ki`` shrinks the rank by ``--shrink-per-step`` ranks per
    step while the whole headroom is unused (less as it is used up), ``kp`` gives back
    ``--kp-share`` of the full rank as the headroom is consumed."""
    setpoint = a.budget - a.backoff
    headroom = start_ppl * setpoint / 100
    return {
        "name": "bench-compress-ppl",
        "probes": [{"name": "perplexity", "every": a.probe_every}],
        "controllers": [{"name": "ppl-rank", "probe": "perplexity", "knob": "rank", "setpoint": f"+{setpoint:g}%",
                         "kp": a.kp_share * full_rank / headroom, "ki": a.shrink_per_step / headroom,
                         "direction": "reverse", "filter": {"kind": "ema", "alpha": 0.6}}],
        "guardrails": [{"name": "ppl-budget", "probe": "perplexity", "bound": "upper",
                        "threshold": f"+{a.budget + 2:g}%", "action": "adjust", "knob": "rank", "factor": 1.25,
                        "consecutive": 1}],
    }


def run_arm(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.compression import RankKnob
    from actuator.agents.probes import ProbeSuite
    from actuator.controllers import FixedSchedule

    model = copy.deepcopy(setup.model0).train()
    trainer = make_trainer(setup, model, arm["kind"], a, seed)
    knob = RankKnob(model)
    full = int(knob.bounds[1])
    knob.apply(full)
    probe = setup.ppl_probe(a.probe_every)
    budget = setup.dense_ppl * (1 + a.budget / 100)
    trace: list[dict[str, float]] = []
    cb = None
    schedule = None
    if arm["kind"] == "actuator":
        cb = ActuatorCallback(pid_policy(a, setup.dense_ppl, full), url=url, probes=[probe], budget_share=1.0,
                              run_name=f"bench-{SCENARIO}-{seed}", setters=[knob],
                              knobs={"rank": {"min": a.min_rank, "max": full, "max_step": a.max_step}})
        cb.attach(trainer)
        suite = None
    else:
        suite = ProbeSuite([probe], budget_share=1.0)
        t_final = max(2, round(a.steps * a.t_final))
        schedule = FixedSchedule.cubic(full, arm["final_rank"], a.t_init, t_final, integer=True)

    def record(step: int, ppl: float, model: Any) -> None:
        trace.append({"step": step, "perplexity": ppl, "rank": knob.read(), "params": setup.params_at(model)})

    class Trace(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            if suite is not None:
                suite.setup(model)
                record(0, suite.run(model, 0, force=True).values["perplexity"], model)

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            step = state.global_step
            if cb is not None:
                if not trace and cb.history and "perplexity" in cb.history[0]["probes"]:
                    trace.append({"step": 0, "perplexity": cb.history[0]["probes"]["perplexity"], "rank": float(full),
                                  "params": setup.params_at(model)})
                h = cb.history[-1] if cb.history else None
                if h is not None and h["step"] == step and step > 0 and "perplexity" in h["probes"]:
                    record(step, h["probes"]["perplexity"], model)
            else:
                # Measure first (the rank the last step trained with), then move to the schedule.
                rep = suite.run(model, step)
                if rep is not None and "perplexity" in rep.values:
                    record(step, rep.values["perplexity"], model)
                knob.apply(schedule.value_at(step))
            advance()

    with arm_progress(arm["name"], a.steps, 22) as advance:
        trainer.add_callback(Trace())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    final_ppl = setup.perplexity(model)
    over = 0
    for prev, cur in zip(trace, trace[1:]):
        if cur["perplexity"] > budget:
            over += int(cur["step"] - prev["step"])
    r = {"arm": arm["name"], "kind": arm["kind"], "seed": seed, "trace": trace, "final_rank": int(knob.read()),
         "final_params": setup.params_at(model), "final_perplexity": final_ppl,
         "perplexity_increase_pct": 100 * (final_ppl / setup.dense_ppl - 1), "final_within_budget": final_ppl <= budget,
         "steps_over_budget": over, "seconds": seconds, "decisions": len(cb.applied) if cb is not None else None,
         "schedule_final_rank": arm.get("final_rank")}
    del trainer, model
    return r


def plot(result: dict[str, Any], path: Path) -> None:
    with figure(path) as (fig, axes):
        ax1, ax2, ax3 = axes[0]
        for arm in result["arms"]:
            label = arm_label(arm, result)
            steps = [t["step"] for t in arm["trace"]]
            line, = ax1.plot(steps, [t["perplexity"] for t in arm["trace"]], marker=".", label=label)
            ax2.step(steps, [t["rank"] for t in arm["trace"]], where="post", label=label, color=line.get_color())
            ax3.plot(steps, [t["params"] / 1e6 for t in arm["trace"]], label=label, color=line.get_color())
        ax1.axhline(result["budget_perplexity"], ls="--", color="black", label=f"budget (+{result['budget_pct']:g}%)")
        ax1.axhline(result["pid_setpoint_perplexity"], ls="-.", color="tab:orange", alpha=0.6,
                    label=f"actuator setpoint (+{result['budget_pct'] - result['backoff_pct']:g}%)")
        ax1.axhline(result["dense_perplexity"], ls=":", color="grey", label="dense")
        ax1.set_title("held-out perplexity")
        ax1.set_xlabel("step")
        ax1.legend(fontsize=7)
        ax2.set_title("active MLP rank (rank knob)")
        ax2.set_xlabel("step")
        ax2.legend(fontsize=7)
        ax3.axhline(result["dense_params"] / 1e6, ls=":", color="grey", label="dense")
        ax3.set_title("parameters of the exported model (M)")
        ax3.set_xlabel("step")
        ax3.legend(fontsize=7)
        fig.suptitle(f"compress-rank — SmolLM2-135M-Instruct MLPs, {result['steps']} steps, lr {result['lr']:g}",
                     fontsize=10)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=60, quick="24 steps")
    ap.add_argument("--budget", type=float, default=8.0, help="perplexity budget, %% over the dense model")
    ap.add_argument("--backoff", type=float, default=2.0, help="PID setpoint = budget − backoff (%% points)")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--heldout", type=int, default=8, help="held-out blocks for perplexity")
    ap.add_argument("--calibration", type=int, default=16, help="blocks for the activation-aware SVD")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--t-init", type=int, default=1, help="cubic schedule: steps at full rank first")
    ap.add_argument("--t-final", type=float, default=0.75, help="cubic schedule: end, as a share of the steps")
    ap.add_argument("--min-rank", type=int, default=32)
    ap.add_argument("--max-step", type=float, default=24, help="largest rank change per decision")
    ap.add_argument("--shrink-per-step", type=float, default=8.0, help="PID ki × headroom: ranks per step")
    ap.add_argument("--kp-share", type=float, default=0.04, help="PID kp × headroom / full rank")
    ap.add_argument("--no-match-arm", dest="match_arm", action="store_false",
                    help="skip the cubic arm to the Actuator arm's final rank")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps = min(a.steps, 24)
    a.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(pick_threads(a.threads))

    url = start_controller(a.out)
    t_start = time.time()
    setup = Setup(a)
    budget = setup.dense_ppl * (1 + a.budget / 100)
    sweep = setup.sweep(SWEEP)
    within = [s for s in sweep if s["perplexity"] <= budget]
    sweep_rank = int(min(s["rank"] for s in within)) if within else 576
    console.print(f"dense: {setup.dense_params / 1e6:.1f}M params, held-out perplexity {setup.dense_ppl:.2f}, "
                  f"budget {budget:.2f} (+{a.budget:g}%); factorised {len(setup.names)} MLP projections in "
                  f"{setup.factorize_seconds:.0f} s")
    console.print("offline sweep (factorised, not fine-tuned): " + ", ".join(
        f"r{s['rank']}: {s['perplexity']:.2f}" for s in sweep) + f" → cubic target rank {sweep_rank}")

    results = []
    for seed in a.seeds:
        results.append(run_arm(setup, {"name": f"cubic → {sweep_rank} (sweep)", "kind": "cubic",
                                       "final_rank": sweep_rank}, a, url, seed))
        pid = run_arm(setup, {"name": "actuator PID", "kind": "actuator"}, a, url, seed)
        results.append(pid)
        if a.match_arm and pid["final_rank"] != sweep_rank:
            results.append(run_arm(setup, {"name": f"cubic → {pid['final_rank']} (= actuator)", "kind": "cubic-matched",
                                           "final_rank": pid["final_rank"]}, a, url, seed))

    table = Table(title=f"{SCENARIO} — SmolLM2-135M-Instruct MLPs, {a.steps} steps, budget +{a.budget:g}% perplexity "
                        f"({budget:.2f})")
    for col in ("arm", "seed", "final rank", "params (M)", "vs dense", "final ppl", "ppl +%", "within budget",
                "steps over budget", "decisions", "s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["arm"], str(r["seed"]), str(r["final_rank"]), f"{r['final_params'] / 1e6:.2f}",
                      f"{r['final_params'] / setup.dense_params:.1%}", f"{r['final_perplexity']:.2f}",
                      f"{r['perplexity_increase_pct']:+.1f}", "yes" if r["final_within_budget"] else "NO",
                      str(r["steps_over_budget"]), "-" if r["decisions"] is None else str(r["decisions"]),
                      f"{r['seconds']:.0f}")
    console.print(table)
    out: dict[str, Any] = {
        "scenario": SCENARIO, "steps": a.steps, "seeds": a.seeds, "budget_pct": a.budget, "budget_perplexity": budget,
        "dense_perplexity": setup.dense_ppl, "dense_params": setup.dense_params, "lr": a.lr,
        "backoff_pct": a.backoff, "pid_setpoint_perplexity": setup.dense_ppl * (1 + (a.budget - a.backoff) / 100),
        "param_break_even_rank": 576 * 1536 / (576 + 1536),
        "batch_size": a.batch_size, "seq_len": a.seq_len, "probe_every": a.probe_every,
        "cubic": {"t_init": a.t_init, "t_final": max(2, round(a.steps * a.t_final)), "final_rank": sweep_rank},
        "pid": pid_policy(a, setup.dense_ppl, 576)["controllers"][0], "sweep": sweep, "arms": results,
        "command": command_line("compress_rank", argv),
    }
    targets = {}
    for seed in a.seeds:
        pid = next((r for r in results if r["kind"] == "actuator" and r["seed"] == seed), None)
        cub = next((r for r in results if r["kind"] == "cubic" and r["seed"] == seed), None)
        if pid and cub:
            targets[f"seed {seed}"] = {
                "smaller_than_cubic": pid["final_params"] < cub["final_params"],
                "final_within_budget": pid["final_within_budget"],
                "fewer_steps_over_budget": pid["steps_over_budget"] < cub["steps_over_budget"],
                "no_more_steps_over_budget": pid["steps_over_budget"] <= cub["steps_over_budget"],
                "pid_params": pid["final_params"], "cubic_params": cub["final_params"],
                "pid_steps_over": pid["steps_over_budget"], "cubic_steps_over": cub["steps_over_budget"],
            }
            matched = next((r for r in results if r["kind"] == "cubic-matched" and r["seed"] == seed), None)
            if matched:
                # Same final size, open loop: what closing the loop buys at equal compression.
                targets[f"seed {seed}"]["vs_cubic_same_rank"] = {
                    "rank": matched["final_rank"], "cubic_steps_over": matched["steps_over_budget"],
                    "pid_steps_over": pid["steps_over_budget"],
                    "cubic_final_within_budget": matched["final_within_budget"],
                    "fewer_steps_over_budget": pid["steps_over_budget"] < matched["steps_over_budget"],
                }
    record_targets(out, targets)
    save_results(SCENARIO, out, plot, t_start)
    return out


if __name__ == "__main__":
    main()
