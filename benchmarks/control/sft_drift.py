"""sft-drift: narrow-task SFT of the real SmolLM2-135M-Instruct with an aggressive learning rate.

The narrow task: spell a word backwards, letters separated by dashes ("apple" -> "e-l-p-p-a"),
from a 35-word vocabulary; held-out examples are other draws from the same vocabulary, so "task
gain" is learning the skill on these words, measured as held-out loss (start - end) and as
greedy exact-match accuracy on all 35 words. Capability drift is KL drift from the starting
model on 8 general chat prompts (the probe the controller sees, every ``--probe-every`` steps),
general-text perplexity increase and HotpotQA gold-answer log-prob change.

Arms (one invocation, same data, seed and probe sets):
- open loop at three learning rates (a sweep around the aggressive start: lr/3, lr, 3*lr),
- ``ReduceLROnPlateau`` (PyTorch semantics, pure re-implementation in ``actuator.controllers``)
  on the KL-drift probe, starting at the aggressive learning rate,
- Actuator: a PID on KL drift through the real controller service and ``ActuatorCallback``,
  starting at the aggressive learning rate (never above it: the user's lr is the ceiling).

Calibration that set the defaults (SmolLM2, batch 4, seed 0): at lr 1e-4 KL drift is 2.9 nats
after 3 steps and saturates near 7.6 by step 20 (held-out loss 4.39 -> 0.28 at step 30); at
3e-5 it passes 0.5 after 2 steps and 4.7 after 12. A probe-rate controller only has authority
where drift builds over several probes, so the default start is 3e-5 and probes run every 2 steps.
The PID's setpoint, 1.5 nats, is about a quarter of where the open loop at 3e-5 ends (6.4-6.6),
and its gains are strong (kp 4/setpoint, no filter: the probe reads fixed prompts, so it has no
sampling noise to smooth): drift rises ~0.5 nat per probe at the start, and with Adam's momentum
a cut takes effect a probe late. A trial at setpoint 1 / kp 2 / EMA 0.6 ended at drift 1.94
(2x the setpoint); setpoint 1.5 / kp 4 / no filter at 1.81.

    python -m benchmarks.control.sft_drift [--steps 40] [--seeds 0] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.control.harness import identify_and_tune as _identify_and_tune
from benchmarks.control.harness import (
    RESULTS, scenario_args, identification_args, tune_summary, start, judged, read_tagged, spread, arm_label,
    figure, arm_progress, command_line, console, save_results,
)
from benchmarks.control.contract import Arm, Declared, Metric
from benchmarks.control.word_task import Setup, make_trainer

from rich.table import Table  # noqa: E402

SCENARIO = "sft-drift"
OPEN, PID = "open loop 3.0e-05", "actuator PID"


def _peak(r: Any) -> float | None:
    return max((t["kl_drift"] for t in r.get("trace") or ()), default=None)


# The contract (benchmarks/control/contract.py): the task, the arms at the default --lr and the
# metrics with the claims made on them (the Actuator PID against the open loop at the same start).
SPEC = Declared(
    name=SCENARIO, task="SFT of SmolLM2-135M-Instruct on spelling words backwards, lr 3e-5, 40 steps; "
                        "the lr PID holds KL drift from the start model at 1.5 nats",
    arm_list=[Arm("open loop 1.0e-05", "open", {"lr": 1e-5}), Arm(OPEN, "open", {"lr": 3e-5}),
              Arm("open loop 9.0e-05", "open", {"lr": 9e-5}), Arm("ReduceLROnPlateau", "plateau", {"lr": 3e-5}),
              Arm(PID, "actuator", {"lr": 3e-5}), Arm("actuator PID (tuned)", "tuned", {"lr": 3e-5}),
              Arm("actuator PID (gains auto)", "auto", {"lr": 3e-5})],
    quick=(OPEN, "ReduceLROnPlateau", PID),
    metrics=[Metric("final_kl_drift", "min", "nats", target=1 / 3, relative_to=OPEN, judge=(PID,),
                    label="drift at most a third of the open loop's"),
             Metric("task_gain", "max", "nats (held-out loss start - end)", target=1.0, relative_to=OPEN,
                    judge=(PID,), label="task gain no worse than the open loop"),
             Metric("task_accuracy", "max", "share of 35 words", read=lambda r: r["final"]["task_accuracy"]),
             Metric("peak_kl_drift", "min", "nats", read=_peak)],
    plots=("kl_drift", "lr"))



def run_arm(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.knobs import LearningRateKnob
    from actuator.agents.probes import ProbeSuite
    from actuator.controllers import ReduceLROnPlateau

    setup.reset()
    steps = arm.get("steps", a.steps)
    trainer = make_trainer(setup, arm["name"].replace(" ", "_").replace("(", "").replace(")", ""), arm["lr"], steps,
                           seed, a.out)
    every = 1 if arm["kind"] == "identify" else a.probe_every
    drift = setup.KLDrift(setup.drift_prompts, setup.tok, every=every, max_length=96)
    trace: list[dict[str, float]] = []
    cb = None
    if arm["kind"] in ("actuator", "tuned", "identify", "auto"):
        policy = arm.get("policy") or (auto_policy(a) if arm["kind"] == "auto" else pid_policy(a))
        if arm["kind"] == "identify":
            policy["probes"] = [{"name": "kl_drift", "every": 1}]
        cb = ActuatorCallback(policy, connection=url, probes=[drift], reporting={"budget_share": 1.0},
                              run=f"bench-{SCENARIO}-{arm['kind']}-{seed}",
                              knobs={"learning_rate": {"min": arm["lr"] / 100, "max": arm["lr"],
                                                       "max_step": a.max_step}},
                              identify=arm.get("identify"))
        cb.attach(trainer)
        suite = None
    else:
        suite = ProbeSuite([drift], budget_share=1.0)
        suite.setup(setup.model)

    plateau = ReduceLROnPlateau(mode="min", factor=0.5, patience=2) if arm["kind"] == "plateau" else None
    pstate: Any = None

    class Trace(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            nonlocal pstate
            value = None
            if cb is not None:
                if cb.session.history and cb.session.history[-1]["step"] == state.global_step and "kl_drift" in cb.session.history[-1]["probes"]:
                    value = cb.session.history[-1]["probes"]["kl_drift"]
            else:
                rep = suite.run(model, state.global_step)
                value = rep.values["kl_drift"] if rep is not None else None
                if value is not None and plateau is not None:
                    knob = LearningRateKnob(trainer.optimizer, trainer.lr_scheduler)
                    new_lr, pstate = plateau.update(value, knob.read(), pstate)
                    knob.apply(new_lr)
            if value is not None:
                trace.append({"step": state.global_step, "kl_drift": value,
                              "lr": trainer.optimizer.param_groups[0]["lr"]})
            advance()

    with arm_progress(arm["name"], steps) as advance:
        trainer.add_callback(Trace())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    final = setup.final_metrics(trainer)
    decisions = len(cb.session.applied) if cb is not None else None
    tuning = auto_events(url, cb.session.run_id) if arm["kind"] == "auto" and cb is not None else None
    return {"auto_gains": tuning, "arm": arm["name"], "kind": arm["kind"], "start_lr": arm["lr"], "seed": seed, "trace": trace,
            "final": final, "final_lr": trainer.optimizer.param_groups[0]["lr"],
            "final_kl_drift": sum(t["kl_drift"] for t in trace[-3:]) / max(1, len(trace[-3:])),
            "seconds": seconds, "decisions": decisions, "run_id": cb.session.run_id if cb is not None else None,
            "steps_over_setpoint": sum(1 for t in trace if t["kl_drift"] > a.setpoint * 1.1)}


def pid_policy(a: argparse.Namespace) -> dict[str, Any]:
    """Gains per unit of relative error: an error the size of the setpoint moves ln(lr) by kp."""
    return {"name": "bench-sft-drift", "probes": [{"name": "kl_drift", "every": a.probe_every}], "controllers": [{
        "name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": a.setpoint,
        "kp": a.kp / a.setpoint, "ki": a.ki / a.setpoint, "direction": "direct",
        "filter": {"kind": "ema", "alpha": a.filter_alpha}}]}


def auto_policy(a: argparse.Namespace) -> dict[str, Any]:
    """The hand PID with ``gains: auto``: the agent steps the learning rate at the start of the run,
    the service fits the drift's answer and the controller runs on SIMC gains from the test's end;
    the hand gains (stated relative: the same kp 4, ki 0.2 per setpoint) are the fallback.
    ``--auto-window N`` sizes the step test to N steps (a quarter at the nominal rate, the rest
    moved), in place of the agent's own sizing (10% of the run: 4 steps of 40, too few readings at
    a probe every 2 steps for a fit, which needs 6)."""
    policy = pid_policy(a)
    c = policy["controllers"][0]
    c.update({"gains": "auto", "kp": a.kp, "ki": a.ki})
    if a.auto_window:
        hold = max(1, a.auto_window // 4)
        c["identify"] = {"hold": hold, "length": a.auto_window - hold}
    policy["name"] = "bench-sft-drift-auto"
    return policy


def auto_events(url: str, run_id: str | None) -> dict[str, Any] | None:
    """What the service did with the run's ``gains: auto``: its ``auto_gains`` (the fit, the
    gains, the replay) or ``auto_gains_fallback`` (the problem, the reason) event's payload."""
    import httpx

    if run_id is None:
        return None
    events = httpx.get(f"{url}/v1/runs/{run_id}/events", params={"limit": 500}, timeout=30).json()
    found = [{"kind": e["kind"], "step": e.get("step"), **e["payload"]} for e in events
             if e.get("kind") in ("auto_gains", "auto_gains_fallback")]
    return found[0] if found else None


def identify_and_tune(setup: Setup, a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    """The tuned arm's preparation: an identification pre-run of ``--ident-steps`` steps from the
    same start (the agent's identification mode steps the learning rate by ``--ident-size`` log
    units after ``--ident-hold`` steps; drift probed every step), then ``POST /v1/policies/tune``
    on its stored observations for the hand policy's controller (same setpoint, filter, probe
    interval, bounds and rate limit; only the gains are proposed)."""
    return _identify_and_tune(run_arm, setup, a, url, seed, controller="drift-lr", policy=lambda: pid_policy(a),
                              arm={"lr": a.lr, "steps": a.ident_steps})


def pareto(points: list[tuple[str, float, float]]) -> set[str]:
    """Names of points not dominated: higher gain and lower drift are both better."""
    front = set()
    for n, g, d in points:
        if not any((g2 >= g and d2 <= d) and (g2 > g or d2 < d) for _, g2, d2 in points):
            front.add(n)
    return front


def targets_of(pid: dict[str, Any], ref: dict[str, Any], front: set[str]) -> dict[str, Any]:
    """The targets of a PID arm against the open loop at the same start (one seed's runs, or their
    means over seeds): task gain no worse, drift at most a third, on the Pareto front."""
    return {
        "task_gain_no_worse_loss": pid["task_gain"] >= ref["task_gain"],
        "task_gain_no_worse_accuracy": pid["final"]["task_accuracy"] >= ref["final"]["task_accuracy"],
        "drift_at_most_one_third": pid["final_kl_drift"] <= ref["final_kl_drift"] / 3,
        "drift_ratio": pid["final_kl_drift"] / ref["final_kl_drift"],
        "on_or_beyond_pareto_front": pid["arm"] in front,
    }


def _arm_row(n: str, mine: dict[int, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One arm's row (mean ± sd and worst seed of each figure) and its means as one run. Files
    written before a field existed lack it: those seeds are left out of its spread."""
    any_run = next(iter(mine.values()))
    peak = {s: max(t["kl_drift"] for t in r["trace"]) for s, r in mine.items() if r.get("trace")}
    over = {s: float(r["steps_over_setpoint"]) for s, r in mine.items() if "steps_over_setpoint" in r}
    row = {"kind": any_run["kind"], "seeds": sorted(mine), "task_gain": spread({s: r["task_gain"] for s, r in mine.items()}),
           "task_accuracy": spread({s: r["final"]["task_accuracy"] for s, r in mine.items()}),
           "final_kl_drift": spread({s: r["final_kl_drift"] for s, r in mine.items()}, higher_is_better=False),
           "peak_kl_drift": spread(peak, higher_is_better=False),
           "probes_over_setpoint": spread(over, higher_is_better=False)}
    mean = {"arm": n, "kind": any_run["kind"], "start_lr": any_run["start_lr"],
            "task_gain": row["task_gain"]["mean"], "final_kl_drift": row["final_kl_drift"]["mean"],
            "final": {"task_accuracy": row["task_accuracy"]["mean"]}}
    return row, mean


def _front_of(arms: list[dict[str, Any]]) -> set[str]:
    return pareto([(r["arm"], r["task_gain"], r["final_kl_drift"]) for r in arms
                   if r["kind"] in ("open", "actuator", "tuned", "auto")])


def _pair(arms: list[dict[str, Any]], kind: str, lr: float) -> tuple[Any, Any]:
    """The arm of ``kind`` and the open loop at the same start ``lr`` among ``arms``."""
    ref = next((r for r in arms if r["kind"] == "open" and r["start_lr"] == lr), None)
    return next((r for r in arms if r["kind"] == kind), None), ref


def _targets(runs: dict[tuple[str, int], dict[str, Any]], means: dict[str, dict[str, Any]], seeds: list[int],
             lr: float) -> dict[str, Any]:
    """Each PID arm's targets on the means and per seed (harness rule)."""
    targets: dict[str, Any] = {}
    for kind in ("actuator", "tuned", "auto"):
        pid, ref = _pair(list(means.values()), kind, lr)
        if pid is None or ref is None:
            continue
        on_mean = targets_of(pid, ref, _front_of(list(means.values())))
        per_seed: dict[int, dict[str, Any]] = {}
        for seed in seeds:
            mine = [r for (_, s), r in runs.items() if s == seed]
            p, q = _pair(mine, kind, lr)
            if p is not None and q is not None:
                per_seed[seed] = targets_of(p, q, _front_of(mine))
        targets[kind] = {k: judged({"met": v}, {s: t[k] for s, t in per_seed.items()})
                         for k, v in on_mean.items() if isinstance(v, bool)}
        targets[kind]["drift_ratio_of_means"] = on_mean["drift_ratio"]
    return targets


def aggregate(tag: str = "", results: Path = RESULTS, tags: list[str] | None = None) -> dict[str, Any]:
    """Combine the result files of separate runs (``sft-drift.json``, ``sft-drift-TAG.json``, one
    seed or several each; with ``tag``, the files ``sft-drift-TAG*.json``; with ``tags``, those of
    every tag listed, ``-`` for the untagged file): each arm's mean ± sd and worst seed, each target judged by the harness rule
    (on the means and on >= 4 of 5 seeds), and the ``gains: auto`` arm against the hand gains
    (:func:`auto_against_hand`). Writes ``sft-drift-aggregate{-TAG}.json`` / ``.png``."""
    name = f"{SCENARIO}-aggregate" + (f"-{tag}" if tag else "")
    found = read_tagged(results, SCENARIO, tag, tags)
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for _, part in found:
        for r in part["arms"]:
            runs[(r["arm"], r["seed"])] = r  # a later file's run of the same arm and seed replaces it
    first = found[0][1]
    lr = first["lr"]
    seeds = sorted({s for _, s in runs})
    rows: dict[str, Any] = {}
    means: dict[str, dict[str, Any]] = {}
    for n in dict.fromkeys(n for n, _ in runs):
        rows[n], means[n] = _arm_row(n, {s: runs[(n, s)] for s in seeds if (n, s) in runs})
    targets = _targets(runs, means, seeds, lr)
    auto = auto_against_hand(runs, first["setpoint"])
    if auto:
        targets["auto_vs_hand"] = auto
    out = {"scenario": SCENARIO, "aggregate": True, "seeds": seeds, "lr": lr, "setpoint": first["setpoint"],
           "steps": first["steps"], "rows": rows, "targets": targets, "arms": list(runs.values()),
           "files": [f.name for f, _ in found]}
    console.print(json.dumps({"rows": rows, "targets": targets}, indent=1, default=str))
    save_results(name, out, plot, results=results)
    return out


def auto_against_hand(runs: dict[tuple[str, int], dict[str, Any]], setpoint: float) -> dict[str, Any]:
    """``gains: auto`` against the hand gains it falls back to, on the seeds both ran (issue 37's
    "at least as good as the fixed gains"): the final drift no further from the setpoint, and the
    peak no higher; each judged on the means and on the seeds (harness rule). What the service did
    with each seed's step test (tuned, or the fallback's problem) is listed beside."""
    hand = {s: r for (_, s), r in runs.items() if r["kind"] == "actuator"}
    auto = {s: r for (_, s), r in runs.items() if r["kind"] == "auto"}
    both = sorted(set(hand) & set(auto))
    if not both:
        return {}

    def err(r: dict[str, Any]) -> float:
        return abs(r["final_kl_drift"] - setpoint)

    def peak(r: dict[str, Any]) -> float:
        return max((t["kl_drift"] for t in r.get("trace") or ()), default=r["final_kl_drift"])

    def mean(f: Any, rs: dict[int, dict[str, Any]]) -> float:
        return sum(f(rs[s]) for s in both) / len(both)

    return {
        "seeds": both,
        "final_error_no_worse": judged({"met": mean(err, auto) <= mean(err, hand), "auto": mean(err, auto),
                                        "hand": mean(err, hand)}, {s: err(auto[s]) <= err(hand[s]) for s in both}),
        "peak_no_higher": judged({"met": mean(peak, auto) <= mean(peak, hand), "auto": mean(peak, auto),
                                  "hand": mean(peak, hand)}, {s: peak(auto[s]) <= peak(hand[s]) for s in both}),
        "outcome": {str(s): (auto[s].get("auto_gains") or {}).get("problem") or
                    (auto[s].get("auto_gains") or {}).get("kind") for s in both},
    }


def plot(result: dict[str, Any], path: Path) -> None:
    with figure(path, size=(15, 4)) as (fig, axes):
        ax1, ax2, ax3 = axes[0]
        for arm in result["arms"]:
            steps = [t["step"] for t in arm["trace"]]
            ax1.plot(steps, [t["kl_drift"] for t in arm["trace"]], marker=".", label=arm_label(arm, result))
            ax2.plot(steps, [t["lr"] for t in arm["trace"]], label=arm_label(arm, result))
            ax3.scatter([arm["final_kl_drift"]], [arm["task_gain"]], s=60)
            ax3.annotate(arm["arm"], (arm["final_kl_drift"], arm["task_gain"]), fontsize=8)
        ax1.axhline(result["setpoint"], ls="--", color="black", label="setpoint")
        ax1.set_title("KL drift from the start model")
        ax1.set_xlabel("step")
        ax1.legend(fontsize=7)
        ax2.set_yscale("log")
        ax2.set_title("learning rate")
        ax2.set_xlabel("step")
        ax3.set_xlabel("final KL drift (lower is better)")
        ax3.set_ylabel("task gain: held-out loss start − end (higher is better)")
        ax3.set_title("(task gain, drift)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=40, quick="16 steps, three arms, fewer HotpotQA records",
                  arms=["sweep", "open", "plateau", "actuator", "tuned", "auto"], arms_default=["sweep", "plateau", "actuator"],
                  arms_help="'open' runs only the open loop at --lr; 'sweep' runs lr/3, lr and 3*lr",
                  tag_help="results go to sft-drift-TAG.json (default sft-drift.json)",
                  aggregate="combine the result files of separate runs (one process per seed: --seeds N --tag "
                            "seedN) into sft-drift-aggregate.json; run nothing")
    ap.add_argument("--lr", type=float, default=3e-5, help="the aggressive starting learning rate")
    ap.add_argument("--setpoint", type=float, default=1.5, help="KL drift (nats/token) the Actuator arm holds")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--kp", type=float, default=4.0, help="PID kp x setpoint (log-lr units)")
    ap.add_argument("--ki", type=float, default=0.2, help="PID ki x setpoint, per step")
    ap.add_argument("--max-step", type=float, default=1.5, help="largest ln(lr) change per decision")
    ap.add_argument("--filter-alpha", type=float, default=1.0,
                    help="EMA weight of the newest drift reading (1 = no filter: the probe is deterministic)")
    identification_args(ap)
    ap.add_argument("--aggregate-tags", nargs="+", default=None, metavar="TAG",
                    help="with --aggregate: combine the files of several tags (sft-drift-TAG*.json for each; "
                         "'-': the untagged sft-drift.json)")
    ap.add_argument("--auto-window", type=int, default=0, metavar="STEPS",
                    help="auto arm: the warm-up step test's length (0: the agent sizes it, 10%% of the run)")
    a = ap.parse_args(argv)
    if a.auto_window < 0:
        ap.error(f"--auto-window must be >= 0, got {a.auto_window}")
    return a


KEEP = {"sweep": ("open",), "open": ("open",), "plateau": ("plateau",), "actuator": ("actuator",),
        "tuned": ("tuned",), "auto": ("auto",)}


def arms_for(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The arms ``--arms`` asks for (``--quick``: the open loop at --lr, plateau and the PID)."""
    arms = [
        {"name": f"open loop {a.lr / 3:.1e}", "kind": "open", "lr": a.lr / 3},
        {"name": f"open loop {a.lr:.1e}", "kind": "open", "lr": a.lr},
        {"name": f"open loop {a.lr * 3:.1e}", "kind": "open", "lr": a.lr * 3},
        {"name": "ReduceLROnPlateau", "kind": "plateau", "lr": a.lr},
        {"name": "actuator PID", "kind": "actuator", "lr": a.lr},
        {"name": "actuator PID (tuned)", "kind": "tuned", "lr": a.lr},
        {"name": "actuator PID (gains auto)", "kind": "auto", "lr": a.lr},
    ]
    if a.quick:
        arms = [arms[1], arms[3], arms[4]]
    arms = [arm for arm in arms if any(arm["kind"] in KEEP[k] for k in a.arms)]
    if "sweep" not in a.arms:
        arms = [arm for arm in arms if arm["kind"] != "open" or arm["lr"] == a.lr]
    return arms


def run_one(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int,
            base: dict[str, Any]) -> dict[str, Any]:
    """One arm on one seed (the tuned arm after its identification pre-run), with its gains over
    the start model ``base``."""
    prep = None
    if arm["kind"] == "tuned":
        prep = identify_and_tune(setup, a, url, seed)
        arm = {**arm, "policy": prep["tune"]["policy"]}
        console.print(tune_summary(seed, prep))
    r = run_arm(setup, arm, a, url, seed)
    if prep is not None:
        r["tuning"] = prep
    f = r["final"]
    r["task_gain"] = base["task_loss"] - f["task_loss"]
    r["accuracy_gain"] = f["task_accuracy"] - base["task_accuracy"]
    r["perplexity_increase_pct"] = 100 * (f["perplexity"] / base["perplexity"] - 1)
    r["gold_logprob_change"] = f["gold_logprob"] - base["gold_logprob"]
    return r


def report(out: dict[str, Any], results: list[dict[str, Any]], a: argparse.Namespace) -> None:
    """The table of every run, and per seed the Pareto front and each PID arm's targets (in ``out``)."""
    table = Table(title=f"{SCENARIO} — SmolLM2-135M-Instruct, {a.steps} steps, setpoint KL {a.setpoint}")
    for col in ("arm", "seed", "task gain (loss)", "task accuracy", "final KL drift", "ppl +%", "gold log-prob Δ",
                "steps > setpoint+10%", "final lr", "decisions", "Pareto", "s"):
        table.add_column(col, justify="right")
    for seed in a.seeds:
        _report_seed(table, out, [r for r in results if r["seed"] == seed], seed, a.lr)
    console.print(table)
    console.print(f"targets: {out['targets']}")


def _report_seed(table: Table, out: dict[str, Any], mine: list[dict[str, Any]], seed: int, lr: float) -> None:
    """One seed's rows, its Pareto front and each PID arm's targets against the open loop at ``lr``."""
    points = [(r["arm"], r["task_gain"], r["final_kl_drift"]) for r in mine
              if r["kind"] in ("open", "actuator", "tuned", "auto")]
    front = pareto(points)
    out["pareto_front"][f"seed {seed}"] = sorted(front)
    for r in mine:
        f = r["final"]
        table.add_row(r["arm"], str(seed), f"{r['task_gain']:.3f}", f"{f['task_accuracy']:.2f}",
                      f"{r['final_kl_drift']:.3f}", f"{r['perplexity_increase_pct']:+.1f}",
                      f"{r['gold_logprob_change']:+.3f}", str(r["steps_over_setpoint"]), f"{r['final_lr']:.1e}",
                      "-" if r["decisions"] is None else str(r["decisions"]), "yes" if r["arm"] in front else "",
                      f"{r['seconds']:.0f}")
    ref = next((r for r in mine if r["kind"] == "open" and r["start_lr"] == lr), None)
    for kind in ("actuator", "tuned", "auto"):
        pid = next((r for r in mine if r["kind"] == kind), None)
        if ref and pid:
            out["targets"][f"seed {seed}" + ("" if kind == "actuator" else f" {kind}")] = targets_of(pid, ref, front)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse(argv)
    if a.aggregate:
        return aggregate(a.tag, a.results, tags=a.aggregate_tags)
    if a.quick:
        a.steps = min(a.steps, 16)
    url = start(a)
    t_start = time.time()
    setup = Setup(a.seeds[0], hotpot_records=4 if a.quick else 8)
    base_trainer = make_trainer(setup, "base", a.lr, 1, a.seeds[0], a.out)
    base = setup.final_metrics(base_trainer)
    console.print(f"start: held-out task loss {base['task_loss']:.3f}, accuracy {base['task_accuracy']:.2f}, "
                  f"perplexity {base['perplexity']:.2f}, HotpotQA gold log-prob {base['gold_logprob']:.3f}")
    arms = arms_for(a)
    results = [run_one(setup, arm, a, url, seed, base) for seed in a.seeds for arm in arms]
    out: dict[str, Any] = {
        "scenario": SCENARIO, "steps": a.steps, "seeds": a.seeds, "setpoint": a.setpoint, "lr": a.lr,
        "probe_every": a.probe_every, "pid": pid_policy(a)["controllers"][0], "start": base, "arms": results,
        "command": command_line("sft_drift", argv), "targets": {}, "pareto_front": {},
    }
    report(out, results, a)
    save_results(f"{SCENARIO}-{a.tag}" if a.tag else SCENARIO, out, plot, t_start, a.results)
    return out


if __name__ == "__main__":
    main()
