"""compress-rank: make the real SmolLM2-135M-Instruct *smaller than dense* within a perplexity
budget, by per-layer ranks of its factorised MLPs, while it fine-tunes briefly on general text.

Every MLP projection (gate/up/down of the 30 layers, 90 matrices of 576×1536) becomes a
``LowRankLinear`` from an activation-aware SVD (SVD-LLM: ``factorize`` with calibration batches).
A rank-k factorisation keeps ``k·(576+1536)`` parameters, fewer than the dense matrix only below
k = 419 (the break-even); a layer at or above it is kept dense, and every parameter count below is
that of the model :func:`export_pretrained` writes (factors where smaller, dense elsewhere), so no
arm can end larger than the dense model.

All arms fine-tune with the same data order, seed, learning rate, steps and probe (``Perplexity``
on held-out text every ``--probe-every`` steps). Budget: the dense model's held-out perplexity
+ ``--budget`` (10%). Arms (``--arms``), with what each is matched on:

- ``uniform`` — uniform SVD-LLM, one shot: one rank for all 90 matrices, the smallest of an
  offline sweep (the factorised model before fine-tuning) within the budget; then the fine-tune.
  *Matched perplexity budget.*
- ``oneshot`` — one global threshold τ on the components' sensitivities (``ThresholdKnob``: the
  whitened σ², so every layer gets its own rank), the largest τ within the budget offline (log
  bisection); then the fine-tune. *Matched perplexity budget.*
- ``cubic`` — the same offline τ reached on AdaLoRA's cubic schedule (Zhu & Gupta 2017) in log τ,
  from the dense point at step ``--t-init`` to τ at ``--t-final`` of the run. *Matched perplexity
  budget* (and the same final size as ``oneshot``).
- ``actuator`` — a PID on perplexity moving log τ through the real controller service and
  ``ActuatorCallback`` (``preset:compress-threshold`` with gains in this run's units): setpoint
  ``+(budget − backoff)%`` of the first measurement (the dense model), direct acting (a higher τ
  cuts more), the sensitivities re-measured every ``--refresh-every`` steps, so the same τ cuts
  further in layers that fine-tuning made less sensitive. Guardrail at the budget halves τ.
  *Matched perplexity budget*; its size is the result.
- ``matched`` (``--match-arm``, after ``actuator``) — one-shot τ at the Actuator arm's final
  parameter count (known only afterwards). *Matched parameter count.*

Width arms (structured pruning of MLP channels, ``ChannelThresholdKnob``: one global τ on each
channel's ``‖h_j‖·‖W_down[:, j]‖``, masked while training, sliced by the export; on the dense,
unfactorised model, because a low-rank factorisation of SmolLM2 saves nothing above rank 419):

- ``width-oneshot`` — the largest channel τ within the budget offline (log bisection), set at
  step 0; then the fine-tune. *Matched perplexity budget.*
- ``width-actuator`` — a PID on perplexity moving log τ (``preset:compress-width`` with gains in
  this run's units, :func:`width_policy`), from the τ of 99% of the dense parameters.
  *Matched perplexity budget*; its size is the result.
- ``width-matched`` (``--match-arm``, after ``width-actuator``) — one-shot channel τ at that
  arm's final parameter count. *Matched parameter count.*

Reported per arm: final parameters (export) and share of dense, final perplexity and its rise,
steps over budget (probe intervals whose measurement exceeded the budget, in steps), layers kept
dense, HotpotQA EM and gold-answer log-prob of the final model, and the exported directory
re-loaded with plain ``AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)``: its
parameter count, weight-file size and perplexity measured again after the reload.

    python -m benchmarks.control.compress_rank [--steps 60] [--seeds 0] [--arms ...]   # one file per seed
    python -m benchmarks.control.compress_rank --arms width-actuator width-oneshot --match-arm --tag=-width
    python -m benchmarks.control.compress_rank --aggregate                            # tables, plot, targets
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.control.contract import Arm, Declared, Metric
from benchmarks.control.data import blocks, stdlib_text
from benchmarks.control.harness import (
    RESULTS, command_line, console, arm_progress, figure, fmt_ms, for_each_seed, judged, machine, read_seeds, scenario_args,
    seed_path, start, write_seed,
)

import torch  # noqa: E402
from rich.table import Table  # noqa: E402

SCENARIO = "compress-rank"
WIDTH_PID = "Actuator PID on channel τ"

# The contract (benchmarks/control/contract.py) of the width claim (README "compress"): the PID on
# the channel threshold against the budget of +10% perplexity over dense.
SPEC = Declared(
    name=SCENARIO, task="MLP-width pruning of SmolLM2-135M-Instruct with distillation, 100 steps; the PID on "
                        "the channel threshold holds perplexity within +10% of dense",
    arm_list=[Arm(WIDTH_PID, "width-actuator")], quick=(WIDTH_PID,),
    metrics=[Metric("size_pct", "min", "% of dense parameters", target=85.0, judge=(WIDTH_PID,),
                    read=lambda r: 100 * r["param_ratio"], label="at most 85% of dense"),
             Metric("within_budget", "max", "final perplexity within budget (1) or not (0)", target=1.0,
                    read=lambda r: float(r["final_within_budget"])),
             Metric("steps_over_budget", "min", "steps"), Metric("perplexity_increase_pct", "min", "%")],
    plots=("perplexity", "params"))
RANK_SWEEP = (576, 560, 544, 528, 512, 496, 480, 448, 419, 384, 320, 256)
SHARE_SWEEP = (1.0, 0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.92, 0.9, 0.875, 0.85, 0.8, 0.75)
WIDTH_SHARES = (0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.92, 0.9, 0.875, 0.85)
LOWRANK_ARMS = ("uniform", "oneshot", "cubic", "actuator")
WIDTH_ARMS = ("width-actuator", "width-oneshot", "width-cubic")
ARMS = LOWRANK_ARMS + WIDTH_ARMS
LABELS = {"uniform": "uniform SVD-LLM (one shot)", "oneshot": "global τ (one shot)", "cubic": "global τ, cubic",
          "actuator": "Actuator PID on τ", "matched": "global τ at Actuator's size",
          "width-oneshot": "channels, global τ (one shot)", "width-actuator": "Actuator PID on channel τ",
          "width-matched": "channels, global τ at Actuator's size", "width-cubic": "channels, global τ, cubic"}
KNOB = {"width": "mlp_channel_threshold", "lowrank": "compression_threshold"}


def is_width(kind: str) -> bool:
    return kind.startswith("width-")


class Setup:
    """The factorised model, data, probes and offline sweeps every arm shares."""

    def __init__(self, a: argparse.Namespace) -> None:
        from actuator.agents.compression import ThresholdKnob, factorize
        from actuator.agents.models import load_smollm2
        from actuator.agents.probes import HotpotQA

        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            model, self.tok = load_smollm2()
        data = blocks(self.tok, stdlib_text(), a.seq_len)
        self.heldout_texts = [self.tok.decode(b) for b in data[: a.heldout]]
        self.train = data[a.heldout:]
        self.ppl_probe_args = {"max_length": a.seq_len + 8, "batch_size": 8}
        self.hotpot = HotpotQA(None, self.tok, every=None, max_examples=a.hotpot, max_new_tokens=8)
        self.dense_params = sum(p.numel() for p in model.parameters())
        self.dense_ppl = self.perplexity(model)
        self.dense_hotpot = self.hotpot_values(model)
        self.calib = [torch.stack(self.train[i: i + 4]) for i in range(0, a.calibration, 4)]
        self.min_channels = a.min_channels
        # The width arms prune the dense model's MLP channels: a copy from before factorisation.
        self.dense_model = copy.deepcopy(model) if any(is_width(k) for k in a.arms) else None
        # --distill: the dense model as a frozen teacher of every arm's fine-tune (its own copy:
        # DistillationTrainer freezes it, and the width arms copy ``dense_model`` to train).
        self.teacher = copy.deepcopy(model) if a.distill > 0 else None
        self.names: list[str] = []
        self.factorize_seconds = 0.0
        self.model0 = model
        self.knobs: dict[str, Any] = {}
        if not any(k in LOWRANK_ARMS for k in a.arms):
            return
        t0 = time.time()
        with console.status("factorising the MLPs (activation-aware SVD)…"):
            self.names = factorize(model, calibration=self.calib)
        self.factorize_seconds = time.time() - t0
        # Both allocations on the same layers (each knob sets every layer's rank when applied).
        self.knobs = {kind: ThresholdKnob(model, self.calib, refresh_every=None, normalize=kind == "relative")
                      for kind in ("raw", "relative")}
        self.knob0 = self.knobs["raw"]

    def width_model(self) -> tuple[Any, Any]:
        """A fresh copy of the dense model with a ChannelThresholdKnob on its MLPs (every channel in)."""
        from actuator.agents.compression import ChannelThresholdKnob

        assert self.dense_model is not None
        model = copy.deepcopy(self.dense_model)
        return model, ChannelThresholdKnob(model, self.calib, min_channels=self.min_channels)

    def width_sweep(self, budget: float, iterations: int) -> dict[str, Any]:
        """Offline (no fine-tuning): perplexity at the channel τ giving each share of the dense
        parameter count, and the largest τ within ``budget`` (bisection in log τ)."""
        model, knob = self.width_model()
        sweep = []
        for share in WIDTH_SHARES:
            tau = knob.threshold_for_params(int(share * self.dense_params))
            knob.apply(tau)
            sweep.append({"tau": tau, "share": share, "perplexity": self.perplexity(model),
                          "params": int(knob.summary()["compression.params"]),
                          "width_min": min(knob.widths.values())})
            if sweep[-1]["perplexity"] > 3 * self.dense_ppl:
                break
        within = [w["tau"] for w in sweep if w["perplexity"] <= budget]
        beyond = [w["tau"] for w in sweep if w["perplexity"] > budget and (not within or w["tau"] > max(within))]
        lo = math.log(max(within) if within else knob.bounds[0])
        if beyond:
            hi = math.log(min(beyond))
            for _ in range(iterations):
                mid = (lo + hi) / 2
                knob.apply(math.exp(mid))
                if self.perplexity(model) <= budget:
                    lo = mid
                else:
                    hi = mid
        knob.apply(math.exp(lo))
        out = {"sweep": sweep, "tau_budget": math.exp(lo), "perplexity": self.perplexity(model),
               "params": int(knob.summary()["compression.params"]), "tau_bounds": list(knob.bounds),
               "tau_start": knob.threshold_for_params(int(0.99 * self.dense_params)),
               "tau_85": knob.threshold_for_params(int(0.85 * self.dense_params))}
        del model, knob
        return out

    def use(self, allocation: str) -> None:
        self.knob0 = self.knobs[allocation]
        self.knob0.apply(self.knob0.bounds[0])

    def ppl_probe(self, every: int | None) -> Any:
        from actuator.agents.probes import Perplexity

        return Perplexity(self.heldout_texts, self.tok, every=every, **self.ppl_probe_args)

    def perplexity(self, model: Any) -> float:
        return self.ppl_probe(None).measure(model, step=0)["perplexity"]

    def hotpot_values(self, model: Any) -> dict[str, float]:
        v = self.hotpot.measure(model, step=0)
        return {"em": v["hotpotqa.em"], "gold_logprob": v["hotpotqa.gold_logprob"]}

    @staticmethod
    def params_at(model: Any) -> int:
        from actuator.agents.compression import compression_stats

        return int(compression_stats(model)["model"]["export_params"])

    def rank_sweep(self) -> list[dict[str, float]]:
        from actuator.agents.compression import set_active_rank

        out = []
        for r in RANK_SWEEP:
            set_active_rank(self.model0, r)
            out.append({"rank": r, "perplexity": self.perplexity(self.model0), "params": self.params_at(self.model0)})
        self.knob0.apply(self.knob0.bounds[0])  # back to dense
        return out

    def tau_sweep(self, shares: tuple[float, ...]) -> list[dict[str, float]]:
        """Perplexity at the τ whose exported model has each share of the dense parameter count
        (``ThresholdKnob.threshold_for_params``): the same x axis as the uniform-rank sweep."""
        out = []
        for share in shares:
            tau = self.knob0.threshold_for_params(int(share * self.dense_params))
            self.knob0.apply(tau)
            out.append({"tau": tau, "share": share, "perplexity": self.perplexity(self.model0),
                        "params": self.params_at(self.model0), "dense_layers": self.dense_layers()})
            if out[-1]["perplexity"] > 3 * self.dense_ppl:
                break
        self.knob0.apply(self.knob0.bounds[0])
        return out

    def dense_layers(self) -> int:
        from actuator.agents.compression import compression_stats

        return sum(1 for s in compression_stats(self.model0)["layers"].values() if s["export_dense"])

    def tau_within(self, budget: float, sweep: list[dict[str, float]], iterations: int) -> float:
        """The largest τ whose perplexity (before fine-tuning) is within ``budget``: bisection in
        log τ between the last sweep point within and the first beyond."""
        within = [s["tau"] for s in sweep if s["perplexity"] <= budget]
        beyond = [s["tau"] for s in sweep if s["perplexity"] > budget and (not within or s["tau"] > max(within))]
        lo = math.log(max(within) if within else self.knob0.bounds[0])
        if not beyond:
            return math.exp(lo)
        hi = math.log(min(beyond))
        for _ in range(iterations):
            mid = (lo + hi) / 2
            self.knob0.apply(math.exp(mid))
            if self.perplexity(self.model0) <= budget:
                lo = mid
            else:
                hi = mid
        self.knob0.apply(self.knob0.bounds[0])
        return math.exp(lo)


def make_trainer(setup: Setup, model: Any, name: str, a: argparse.Namespace, seed: int) -> Any:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    torch.manual_seed(seed)
    train = [{"input_ids": ids, "labels": ids} for ids in setup.train]
    args = TrainingArguments(
        output_dir=str(a.out / f"{name}-{seed}"), max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0, weight_decay=0.0,
    )
    if a.distill > 0:
        from actuator.agents.distill import DistillationTrainer

        trainer = DistillationTrainer(model=model, args=args, train_dataset=train, teacher_model=setup.teacher,
                                      distill_lambda=a.distill, temperature=a.distill_temperature)
    else:
        trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def pid_policy(a: argparse.Namespace, start_ppl: float) -> dict[str, Any]:
    """``preset:compress-threshold`` with gains in this run's units. ``headroom`` = the perplexity
    room the setpoint leaves at the start; ``ki`` raises ln τ by ``--tau-per-step`` per step while
    the whole headroom is unused (less as it is used up); ``kp`` gives back ``--kp-ln`` of ln τ
    as the headroom is consumed."""
    setpoint = a.budget - a.backoff
    headroom = start_ppl * setpoint / 100
    return {
        "name": "bench-compress-threshold",
        "probes": [{"name": "perplexity", "every": a.probe_every}],
        "controllers": [{"name": "ppl-threshold", "probe": "perplexity", "knob": "compression_threshold",
                         "setpoint": f"+{setpoint:g}%", "kp": a.kp_ln / headroom, "ki": a.tau_per_step / headroom,
                         "direction": "direct", "filter": {"kind": "ema", "alpha": 0.6}}],
        "guardrails": [{"name": "ppl-budget", "probe": "perplexity", "bound": "upper", "threshold": f"+{a.budget:g}%",
                        "action": "adjust", "knob": "compression_threshold", "factor": 0.5, "consecutive": 1}],
    }


def width_policy(a: argparse.Namespace, dense_ppl: float, span: float) -> dict[str, Any]:
    """``preset:compress-width`` with gains in this run's units: ``span`` = ln τ from the start
    (99% of the dense parameters) to the τ of 85% offline (about 0.6 on SmolLM2: the parameter
    count is steep in τ). At full headroom the integral climbs ``span`` in ``--width-climb`` of
    the run; ``kp`` gives back ``--width-kp`` (a quarter) of ``span`` as the headroom is used up; a decision moves
    ln τ by at most ``span / --width-moves``; the guardrail steps back by one such move.

    Setpoint and guardrail are absolute, from the *dense* perplexity: the run starts at 99%, whose
    first measurement would otherwise become the baseline of "+8%" / "+10%" and loosen the budget.
    (Seed 0 with a 5th of the span per decision, half the run to climb and relative setpoints
    ended in a limit cycle between the PID and the guardrail at 92% / 95% of dense.)"""
    headroom = dense_ppl * (a.budget - a.backoff) / 100
    per_step = span / max(1.0, a.width_climb * a.steps)
    move = span / a.width_moves
    return {
        "name": "bench-compress-width",
        "probes": [{"name": "perplexity", "every": a.probe_every}],
        "controllers": [{"name": "ppl-width", "probe": "perplexity", "knob": KNOB["width"],
                         "setpoint": dense_ppl + headroom, "kp": a.width_kp * span / headroom, "ki": per_step / headroom,
                         "direction": "direct", "filter": {"kind": "ema", "alpha": 0.6}}],
        "guardrails": [{"name": "ppl-budget", "probe": "perplexity", "bound": "upper",
                        "threshold": dense_ppl * (1 + a.budget / 100), "action": "adjust", "knob": KNOB["width"],
                        "factor": math.exp(-move), "consecutive": 1}],
    }


def export_and_reload(setup: Setup, model: Any, path: Path) -> dict[str, Any]:
    """Export, reload in plain transformers (no Actuator code on the load path), re-measure."""
    from transformers import AutoModelForCausalLM

    from actuator.agents.compression import export_pretrained

    shutil.rmtree(path, ignore_errors=True)
    rep = export_pretrained(model, path)
    reloaded = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
    out = {"params": sum(p.numel() for p in reloaded.parameters()), "file_bytes": rep["file_bytes"],
           "perplexity": setup.perplexity(reloaded), "factored_layers": rep["factored_layers"],
           "dense_layers": rep["dense_layers"], "custom_code": rep["custom_code"], "class": type(reloaded).__name__}
    del reloaded
    shutil.rmtree(path, ignore_errors=True)
    return out


def _arm_knob(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, model: Any, width_knob: Any) -> tuple[Any, Any]:
    """The arm's knob set to its start (``width_knob``: the width arms' channel knob) and, for a
    cubic arm, its open-loop schedule (Zhu & Gupta's cubic in ln τ, to a size fixed before the run)."""
    from actuator.agents.compression import RankKnob, ThresholdKnob
    from actuator.controllers import FixedSchedule

    kind, knob, schedule = arm["kind"], width_knob, None
    t_final = max(a.t_init + 1, round(a.steps * a.t_final))
    if width_knob is not None:
        if "tau" not in arm:  # matched on parameter count: the threshold that leaves arm["params"]
            arm["tau"] = knob.threshold_for_params(arm["params"])
        knob.apply(arm["tau"])  # the one-shot τ, or the Actuator's / the cubic schedule's starting point
        if kind == "width-cubic":
            arm["tau_final"] = knob.threshold_for_params(arm["params"])
            schedule = FixedSchedule.cubic(math.log(arm["tau"]), math.log(arm["tau_final"]), a.t_init, t_final)
    elif kind == "uniform":
        knob = RankKnob(model)
        knob.apply(arm["rank"])
    else:
        knob = ThresholdKnob(model, setup.calib, refresh_every=a.refresh_every if kind == "actuator" else None,
                             normalize=a.allocation == "relative")
        if kind in ("oneshot", "matched"):
            knob.apply(arm["tau"])
        elif kind == "cubic":
            schedule = FixedSchedule.cubic(math.log(knob.bounds[0]), math.log(arm["tau"]), a.t_init, t_final)
    return knob, schedule


def _arm_callback(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int, probe: Any,
                  knob: Any, knob_name: str) -> Any:
    """The Actuator arms' callback: the PID on the rank threshold, or on the channel threshold."""
    from actuator.agents.callback import ActuatorCallback

    if arm["kind"] == "actuator":
        return ActuatorCallback(pid_policy(a, setup.dense_ppl), connection=url, probes=[probe],
                                reporting={"budget_share": 1.0}, run=f"bench-{SCENARIO}-{seed}", setters=[knob],
                                knobs={"compression_threshold": {"min": knob.bounds[0], "max": knob.bounds[1],
                                                                 "max_step": a.max_step}})
    span = arm["span"]
    return ActuatorCallback(width_policy(a, setup.dense_ppl, span), connection=url, probes=[probe],
                            reporting={"budget_share": 1.0}, run=f"bench-{SCENARIO}-width-{seed}", setters=[knob],
                            knobs={knob_name: {"min": arm["tau"], "max": knob.bounds[1],
                                               "max_step": span / a.width_moves}})


def _layers(knob: Any, model: Any, width: bool) -> tuple[dict[str, Any], int]:
    """Each layer's kept rank (width arms: MLP channels) and how many layers stayed dense."""
    from actuator.agents.compression import compression_stats

    if width:  # layers here are MLPs; "dense" ones kept every channel
        widths = knob.widths
        return widths, sum(1 for w in widths.values() if w == model.config.intermediate_size)
    stats = compression_stats(model)
    return ({n: s["active_rank"] for n, s in stats["layers"].items()},
            sum(1 for s in stats["layers"].values() if s["export_dense"]))


def run_arm(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from transformers import TrainerCallback

    from actuator.agents.probes import ProbeSuite

    kind = arm["kind"]
    width = is_width(kind)
    if width:
        model, knob = setup.width_model()
        model.train()
    else:
        model = copy.deepcopy(setup.model0).train()
    knob_name = KNOB["width" if width else "lowrank"]

    def size(model: Any) -> int:
        return int(knob.summary()["compression.params"]) if width else setup.params_at(model)

    trainer = make_trainer(setup, model, kind, a, seed)
    probe = setup.ppl_probe(a.probe_every)
    budget = setup.dense_ppl * (1 + a.budget / 100)
    trace: list[dict[str, Any]] = []
    cb = suite = None
    knob, schedule = _arm_knob(setup, arm, a, model, knob if width else None)
    if kind in ("actuator", "width-actuator"):
        cb = _arm_callback(setup, arm, a, url, seed, probe, knob, knob_name).attach(trainer)
    else:
        suite = ProbeSuite([probe], budget_share=1.0)

    def record(step: int, ppl: float, model: Any) -> None:
        trace.append({"step": step, "perplexity": ppl, "knob": knob.read(), "params": size(model)})

    class Trace(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):  # noqa: ANN001
            if suite is not None:
                suite.setup(model)
                record(0, suite.run(model, 0, force=True).values["perplexity"], model)

        def on_step_end(self, args, state, control, model=None, **kw):  # noqa: ANN001
            step = state.global_step
            if cb is not None:
                if not trace and cb.session.history and "perplexity" in cb.session.history[0]["probes"]:
                    h0 = cb.session.history[0]
                    trace.append({"step": 0, "perplexity": h0["probes"]["perplexity"],
                                  "knob": h0["knobs"][knob_name],
                                  "params": h0["metrics"].get("compression.params", setup.dense_params)})
                h = cb.session.history[-1] if cb.session.history else None
                if h is not None and h["step"] == step and step > 0 and "perplexity" in h["probes"]:
                    record(step, h["probes"]["perplexity"], model)
            else:
                # Measure first (what the last step trained with), then move along the schedule.
                rep = suite.run(model, step)
                if rep is not None and "perplexity" in rep.values:
                    record(step, rep.values["perplexity"], model)
                if schedule is not None:
                    knob.apply(math.exp(schedule.value_at(step)))
            advance()

    with arm_progress(arm["name"], a.steps, 30) as advance:
        trainer.add_callback(Trace())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    model.eval()
    final_ppl = setup.perplexity(model)
    hotpot = setup.hotpot_values(model)
    over = sum(int(cur["step"] - prev["step"]) for prev, cur in zip(trace, trace[1:]) if cur["perplexity"] > budget)
    layer_ranks, dense_layers = _layers(knob, model, width)
    export = export_and_reload(setup, model, a.out / f"export-{kind}-{seed}")
    final_params = size(model)
    r = {"arm": arm["name"], "kind": kind, "seed": seed, "matched_on": arm["matched_on"], "trace": trace,
         "final_knob": knob.read(), "final_params": final_params, "param_ratio": final_params / setup.dense_params,
         "final_perplexity": final_ppl, "perplexity_increase_pct": 100 * (final_ppl / setup.dense_ppl - 1),
         "final_within_budget": final_ppl <= budget, "steps_over_budget": over, "dense_layers": dense_layers,
         "layer_ranks": layer_ranks, "hotpotqa": hotpot, "export": export, "seconds": seconds,
         "refreshes": getattr(knob, "refreshes", None), "decisions": len(cb.session.applied) if cb is not None else None,
         "target": {k: v for k, v in arm.items() if k in ("rank", "tau", "params", "span", "tau_final")}}
    del trainer, model
    return r


def run_seed(a: argparse.Namespace, seed: int, setup: Setup, offline: dict[str, Any], url: str) -> dict[str, Any]:
    results = []
    arms = list(a.arms)
    for kind in arms:
        if kind == "uniform":
            arm = {"kind": kind, "rank": offline["uniform_rank"], "matched_on": "perplexity budget (offline sweep)"}
        elif kind == "width-oneshot":
            arm = {"kind": kind, "tau": offline["width"]["tau_budget"], "matched_on": "perplexity budget (offline bisection)"}
        elif kind == "width-cubic":
            share = a.width_target
            arm = {"kind": kind, "tau": offline["width"]["tau_start"], "params": int(share * setup.dense_params),
                   "matched_on": f"parameter count ({100 * share:g}% of dense, --width-target)"}
        elif kind == "width-actuator":
            w = offline["width"]
            arm = {"kind": kind, "tau": w["tau_start"], "span": math.log(w["tau_85"] / w["tau_start"]),
                   "matched_on": "perplexity budget (closed loop)"}
        elif kind in ("oneshot", "cubic"):
            arm = {"kind": kind, "tau": offline["tau_budget"], "matched_on": "perplexity budget (offline bisection)"}
        else:
            arm = {"kind": kind, "matched_on": "perplexity budget (closed loop)"}
        arm["name"] = LABELS[kind]
        results.append(run_arm(setup, arm, a, url, seed))
        console.print(_row_text(results[-1], setup.dense_params))
        if kind == "actuator" and a.match_arm:
            target = results[-1]["final_params"]
            tau = setup.knob0.threshold_for_params(target)
            results.append(run_arm(setup, {"kind": "matched", "name": LABELS["matched"], "tau": tau, "params": target,
                                           "matched_on": "parameter count (Actuator's final)"}, a, url, seed))
            console.print(_row_text(results[-1], setup.dense_params))
        if kind == "width-actuator" and a.match_arm:
            target = results[-1]["final_params"]
            results.append(run_arm(setup, {"kind": "width-matched", "name": LABELS["width-matched"],
                                           "params": target, "matched_on": "parameter count (Actuator's final)"},
                                   a, url, seed))
            console.print(_row_text(results[-1], setup.dense_params))
    return {"seed": seed, "arms": results}


def _row_text(r: dict[str, Any], dense: int) -> str:
    return (f"{r['arm']} seed {r['seed']}: {r['final_params'] / 1e6:.2f}M ({r['final_params'] / dense:.1%}), ppl "
            f"{r['final_perplexity']:.2f} ({r['perplexity_increase_pct']:+.1f}%), over budget {r['steps_over_budget']} "
            f"steps, dense layers {r['dense_layers']}, reload ppl {r['export']['perplexity']:.2f}, "
            f"{r['export']['file_bytes'] / 1e6:.0f} MB, {r['seconds']:.0f} s")


def _summary_of(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm kind's runs, a list per figure (one value a seed)."""
    return {
        "arm": rs[0]["arm"], "matched_on": rs[0]["matched_on"], "seeds": [r["seed"] for r in rs],
        "params": [r["final_params"] for r in rs], "param_ratio": [r["param_ratio"] for r in rs],
        "ppl_increase_pct": [r["perplexity_increase_pct"] for r in rs],
        "steps_over_budget": [r["steps_over_budget"] for r in rs], "dense_layers": [r["dense_layers"] for r in rs],
        "hotpot_em": [r["hotpotqa"]["em"] for r in rs], "gold_logprob": [r["hotpotqa"]["gold_logprob"] for r in rs],
        "reload_ppl": [r["export"]["perplexity"] for r in rs], "file_mb": [r["export"]["file_bytes"] / 1e6 for r in rs],
        "reload_params": [r["export"]["params"] for r in rs],
        "within_budget": [r["final_within_budget"] for r in rs],
    }


def _summary_table(head: dict[str, Any], summary: dict[str, Any]) -> Table:
    table = Table(title=f"{SCENARIO} — SmolLM2-135M-Instruct MLPs, {head['steps']} steps, budget +{head['budget_pct']:g}%"
                        f" ({head['budget_perplexity']:.2f}); mean ± sd over seeds")
    cols = ("arm", "matched on", "seeds", "params (M)", "vs dense", "final ppl Δ%", "steps over budget",
            "dense layers", "HotpotQA EM", "gold log-prob", "reload ppl", "file MB")
    for c in cols:
        table.add_column(c, justify="right")

    def ms(values: list[float], spec: str = ".2f") -> str:
        return fmt_ms(values, spec, bare_single=True)

    for s in summary.values():
        table.add_row(s["arm"], s["matched_on"], ",".join(map(str, s["seeds"])),
                      ms([p / 1e6 for p in s["params"]]), ms(s["param_ratio"], ".1%"),
                      ms(s["ppl_increase_pct"], "+.1f"), ms(s["steps_over_budget"], ".1f"),
                      ms(s["dense_layers"], ".1f"), ms(s["hotpot_em"], ".3f"), ms(s["gold_logprob"], ".3f"),
                      ms(s["reload_ppl"]), ms(s["file_mb"], ".0f"))
    return table


# Open-loop arms at the same perplexity budget (the matched-size arms are matched on size instead).
OPEN_LOOP_KINDS = ("uniform", "oneshot", "cubic", "width-oneshot")


def _size_targets(act_kind: str, act: dict[str, Any], run: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """At most 85% of dense (stretch: 75%) within the perplexity budget, on the means and the seeds."""
    mean = statistics.mean
    within = all(act["within_budget"])
    return {
        "params_le_85pct_within_budget": judged(
            {"met": within and mean(act["param_ratio"]) <= 0.85, "ratio": mean(act["param_ratio"]),
             "all_within_budget": within},
            {seed: r["final_within_budget"] and r["param_ratio"] <= 0.85 for seed, r in run.items()}),
        "stretch_params_le_75pct": judged(
            {"met": within and mean(act["param_ratio"]) <= 0.75},
            {seed: r["final_within_budget"] and r["param_ratio"] <= 0.75 for seed, r in run.items()})}


def _open_loop_targets(act_kind: str, act: dict[str, Any], run: dict[int, dict[str, Any]],
                       open_loop: dict[str, Any], loop_runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Fewer parameters than every open-loop arm and no more steps over budget than the best; per
    seed against the open-loop arms' runs on the same seed."""
    mean = statistics.mean
    both = [seed for seed in run if all(seed in runs for runs in loop_runs.values())]
    best_over = min(mean(s["steps_over_budget"]) for s in open_loop.values())
    return {
        "fewer_params_than_every_open_loop_arm": judged({
            "met": all(mean(act["params"]) < mean(s["params"]) for s in open_loop.values()),
            act_kind: mean(act["params"]), **{k: mean(s["params"]) for k, s in open_loop.items()}},
            {seed: all(run[seed]["final_params"] < runs[seed]["final_params"] for runs in loop_runs.values())
             for seed in both}),
        "no_more_steps_over_budget_than_best_open_loop": judged({
            "met": mean(act["steps_over_budget"]) <= best_over, act_kind: mean(act["steps_over_budget"]),
            "best_open_loop": best_over},
            {seed: run[seed]["steps_over_budget"] <= min(runs[seed]["steps_over_budget"]
                                                         for runs in loop_runs.values()) for seed in both})}


def _targets(summary: dict[str, Any], by_kind: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    targets: dict[str, Any] = {}
    open_loop = {k: s for k, s in summary.items() if k in OPEN_LOOP_KINDS}
    loop_runs = {k: {r["seed"]: r for r in by_kind[k]} for k in open_loop}
    for act_kind in ("actuator", "width-actuator"):
        act = summary.get(act_kind)
        if not act:
            continue
        run = {r["seed"]: r for r in by_kind[act_kind]}
        targets[act_kind] = _size_targets(act_kind, act, run)
        if open_loop:
            targets[act_kind].update(_open_loop_targets(act_kind, act, run, open_loop, loop_runs))
    return targets


def _read(results: Path, tag: str) -> tuple[list[Path], dict[str, Any], list[dict[str, Any]]]:
    """The per-seed files of ``tag``, the run settings (``head``) and every arm's run. The low-rank
    and the width arms may come from separate runs (tags): each sweep from a run that has it."""
    found = read_seeds(results, f"{SCENARIO}-seed*.json", keep=lambda f: f.stem.endswith(tag) or not tag)
    files, runs = [f for f, _ in found], [run for _, run in found]
    head = dict(next((r for r in runs if r.get("rank_sweep") or r.get("tau_sweep")), runs[0]))
    head["width_sweep"] = next((r["width_sweep"] for r in runs if r.get("width_sweep")), {})
    return files, head, [r for run in runs for r in run["arms"]]


def aggregate(tag: str = "", results: Path = RESULTS) -> dict[str, Any]:
    files, head, arms = _read(results, tag)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in arms:
        by_kind.setdefault(r["kind"], []).append(r)
    dense = head["dense_params"]
    summary = {kind: _summary_of(rs) for kind, rs in by_kind.items()}
    console.print(_summary_table(head, summary))
    console.print(f"dense: {dense / 1e6:.2f}M params, ppl {head['dense_perplexity']:.2f}, HotpotQA "
                  f"{head['dense_hotpotqa']}")
    targets = _targets(summary, by_kind)
    console.print(f"targets: {targets}")
    out = {**{k: v for k, v in head.items() if k not in ("arms", "seed", "machine")},
           "seeds": sorted({r["seed"] for r in arms}), "arms": arms, "summary": summary, "targets": targets,
           "files": [f.name for f in files], "machine": head.get("machine")}
    (results / f"{SCENARIO}{tag}.json").write_text(json.dumps(out, indent=2, default=str))
    plot(out, results / f"{SCENARIO}{tag}.png")
    console.print(f"wrote {results / (SCENARIO + tag + '.json')} and .png")
    return out


def _plot_arm(ax1: Any, ax2: Any, ax3: Any, arm: dict[str, Any], colors: dict[str, Any]) -> None:
    """One arm's perplexity, parameters and threshold (one colour a kind)."""
    label = arm["arm"] if arm["kind"] not in colors else None
    steps = [t["step"] for t in arm["trace"]]
    kw = {"color": colors.get(arm["kind"]), "alpha": 0.8}
    line, = ax1.plot(steps, [t["perplexity"] for t in arm["trace"]], marker=".", label=label, **kw)
    colors.setdefault(arm["kind"], line.get_color())
    kw["color"] = colors[arm["kind"]]
    ax2.plot(steps, [t["params"] / 1e6 for t in arm["trace"]], label=label, **kw)
    if arm["kind"] != "uniform" and all("knob" in t for t in arm["trace"]):
        ax3.plot(steps, [t["knob"] for t in arm["trace"]], label=label, **kw)


def _plot_sweeps(ax4: Any, result: dict[str, Any]) -> None:
    """Offline: perplexity against size before fine-tuning, uniform rank vs global threshold."""
    dense_pt = [(result["dense_params"] / 1e6, result["dense_perplexity"])]
    for sweep, marker, label in ((result.get("rank_sweep") or [], "o", "uniform rank"),
                                 (result.get("tau_sweep") or [], "s", "global τ (ranks)"),
                                 ((result.get("width_sweep") or {}).get("sweep") or [], "^", "global τ (channels)")):
        if sweep:
            pts = dense_pt + [(s["params"] / 1e6, s["perplexity"]) for s in sweep]
            ax4.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=label)
    ax4.axhline(result["budget_perplexity"], ls="--", color="black")
    ax4.set_ylim(result["dense_perplexity"] * 0.95, result["dense_perplexity"] * 2.0)
    ax4.set_xlabel("parameters (M)")
    ax4.set_title("before fine-tuning (offline sweep)")
    ax4.legend(fontsize=7)


def plot(result: dict[str, Any], path: Path) -> None:
    with figure(path, ncols=4, size=(20, 4.3)) as (fig, axes):
        ax1, ax2, ax3, ax4 = axes[0]
        colors: dict[str, Any] = {}
        for arm in result["arms"]:
            _plot_arm(ax1, ax2, ax3, arm, colors)
        ax1.axhline(result["budget_perplexity"], ls="--", color="black", label=f"budget (+{result['budget_pct']:g}%)")
        ax1.axhline(result["dense_perplexity"], ls=":", color="grey", label="dense")
        ax1.set_title("held-out perplexity")
        ax2.axhline(result["dense_params"] / 1e6, ls=":", color="grey", label="dense")
        ax2.axhline(0.85 * result["dense_params"] / 1e6, ls="--", color="tab:red", alpha=0.5, label="85% of dense")
        ax2.set_title("parameters of the exported model (M)")
        ax3.set_yscale("log")
        lowrank = "each layer's σ² shares" if result.get("allocation") == "relative" else "whitened σ²"
        ax3.set_title(f"threshold τ (low rank: on {lowrank}; width: on channel importance)", fontsize=9)
        for ax in (ax1, ax2, ax3):
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        _plot_sweeps(ax4, result)
        fig.suptitle(f"compress-rank — SmolLM2-135M-Instruct MLPs, {result['steps']} steps, lr {result['lr']:g}, "
                     f"seeds {result.get('seeds')}", fontsize=10)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=60, quick="12 steps, 2 arms", arms=ARMS, arms_default=ARMS,
                  tag_help="suffix of the per-seed result files", aggregate="combine the per-seed files; run nothing")
    ap.add_argument("--budget", type=float, default=10.0, help="perplexity budget, %% over the dense model")
    ap.add_argument("--backoff", type=float, default=2.0, help="PID setpoint = budget − backoff (%% points)")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--heldout", type=int, default=8, help="held-out blocks for perplexity")
    ap.add_argument("--calibration", type=int, default=16, help="blocks for the SVD and the sensitivities")
    ap.add_argument("--hotpot", type=int, default=8, help="HotpotQA records for the final model")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--refresh-every", type=int, default=10, help="Actuator: re-measure sensitivities every K steps")
    ap.add_argument("--t-init", type=int, default=1, help="cubic schedule: steps at the dense point first")
    ap.add_argument("--t-final", type=float, default=0.75, help="cubic schedule: end, as a share of the steps")
    ap.add_argument("--bisect", type=int, default=8, help="bisection steps for the offline τ within budget")
    ap.add_argument("--max-step", type=float, default=math.log(2.0), help="largest change of ln τ per decision")
    ap.add_argument("--tau-per-step", type=float, default=0.35, help="PID ki × headroom: ln τ per step")
    ap.add_argument("--kp-ln", type=float, default=1.0, help="PID kp × headroom: ln τ")
    ap.add_argument("--allocation", choices=("raw", "relative", "auto"), default="auto",
                    help="τ on absolute sensitivities or on each layer's shares; auto: the smaller model "
                         "within budget offline")
    ap.add_argument("--match-arm", action="store_true",
                    help="also run one-shot τ at the Actuator arm's final size (each Actuator arm: low rank, channels)")
    ap.add_argument("--min-channels", type=int, default=64, help="width arms: the fewest channels an MLP keeps")
    ap.add_argument("--width-climb", type=float, default=1.0,
                    help="width Actuator: at full headroom, ln τ climbs from 99%% to 85%% of dense in this share "
                         "of the run")
    ap.add_argument("--width-kp", type=float, default=0.25,
                    help="width Actuator: kp gives back this share of the 99%%→85%% span as the headroom is used up "
                         "(0.25 limit-cycles once pruning is steep; `policy tune` on a recorded run proposes ~0.01)")
    ap.add_argument("--width-moves", type=float, default=10.0,
                    help="width Actuator: a decision moves ln τ by at most (99%%→85%% span) / this")
    ap.add_argument("--width-target", type=float, default=0.85, metavar="SHARE",
                    help="width-cubic: the share of the dense parameter count the cubic schedule ends at "
                         "(from 99%%, over --t-init … --t-final of the run)")
    ap.add_argument("--distill", type=float, default=0.0, metavar="LAMBDA",
                    help="every arm's fine-tune distils from the dense model: loss = λ·T²·KL(dense ‖ pruned) + "
                         "(1−λ)·CE (DistillationTrainer; Minitron's recovery); 0 = cross-entropy alone")
    ap.add_argument("--distill-temperature", type=float, default=1.0, help="T of --distill")
    a = ap.parse_args(argv)
    if not 0.0 <= a.distill <= 1.0:
        ap.error(f"--distill must be in [0, 1], got {a.distill}")
    if not 0.0 < a.width_target < 1.0:
        ap.error(f"--width-target must be in (0, 1), got {a.width_target}")
    if a.distill_temperature <= 0:
        ap.error(f"--distill-temperature must be > 0, got {a.distill_temperature}")
    if a.aggregate:
        return aggregate(a.tag, a.results)
    if a.quick:
        a.steps = min(a.steps, 12)
        a.arms = ["oneshot", "actuator"]
    url = start(a, a.out / f"ctl-{'-'.join(map(str, a.seeds))}{a.tag}")
    t_start = time.time()
    setup = Setup(a)
    budget = setup.dense_ppl * (1 + a.budget / 100)
    console.print(f"dense: {setup.dense_params / 1e6:.1f}M params, held-out perplexity {setup.dense_ppl:.2f}, "
                  f"budget {budget:.2f} (+{a.budget:g}%)")
    width: dict[str, Any] = {}
    if setup.dense_model is not None:
        width = setup.width_sweep(budget, a.bisect)
        console.print("offline, channels: " + ", ".join(
            f"{w['params'] / 1e6:.1f}M: {w['perplexity']:.2f}" for w in width["sweep"])
            + f" → τ {width['tau_budget']:.3g} ({width['params'] / 1e6:.2f}M, ppl {width['perplexity']:.2f})")
    offline: dict[str, Any] = {"width": width}
    head = {
        "scenario": SCENARIO, "steps": a.steps, "budget_pct": a.budget, "budget_perplexity": budget,
        "dense_perplexity": setup.dense_ppl, "dense_params": setup.dense_params, "dense_hotpotqa": setup.dense_hotpot,
        "lr": a.lr, "backoff_pct": a.backoff, "param_break_even_rank": 576 * 1536 / (576 + 1536),
        "batch_size": a.batch_size, "seq_len": a.seq_len, "probe_every": a.probe_every,
        "distill": a.distill, "distill_temperature": a.distill_temperature,
        "refresh_every": a.refresh_every, "width_sweep": width, "min_channels": a.min_channels,
        "width_pid": width_policy(a, setup.dense_ppl, math.log(width["tau_85"] / width["tau_start"])) if width else None,
        "command": command_line("compress_rank", argv),
    }
    if setup.knobs:
        lowrank_offline(a, setup, budget, head, offline)

    def one_seed(seed: int) -> dict[str, Any]:
        res = run_seed(a, seed, setup, offline, url)
        out = {**head, "seed": seed, "arms": res["arms"], "machine": machine(), "wall_seconds": time.time() - t_start}
        write_seed(seed_path(a.results, SCENARIO, seed, a.tag), out)
        return out

    return for_each_seed(a, one_seed) or {}


def lowrank_offline(a: argparse.Namespace, setup: Setup, budget: float, head: dict[str, Any],
                    offline: dict[str, Any]) -> None:
    """The low-rank arms' offline sweeps (uniform rank, global τ on both allocations); fills
    ``head`` and ``offline``."""
    console.print(f"factorised {len(setup.names)} MLP projections in {setup.factorize_seconds:.0f} s; "
                  f"τ range {setup.knob0.bounds[0]:.3g} … {setup.knob0.bounds[1]:.3g}")
    rank_sweep = setup.rank_sweep() if "uniform" in a.arms else []
    within = [s for s in rank_sweep if s["perplexity"] <= budget]
    uniform_rank = int(min(s["rank"] for s in within)) if within else 576
    console.print("offline, uniform: " + ", ".join(f"r{s['rank']}: {s['perplexity']:.2f}" for s in rank_sweep)
                  + f" → rank {uniform_rank}")
    sweeps: dict[str, Any] = {}
    for allocation in (("raw", "relative") if a.allocation == "auto" else (a.allocation,)):
        setup.use(allocation)
        tau_sweep = setup.tau_sweep(SHARE_SWEEP)
        tau_budget = setup.tau_within(budget, tau_sweep, a.bisect)
        setup.knob0.apply(tau_budget)
        sweeps[allocation] = {"sweep": tau_sweep, "tau_budget": tau_budget, "perplexity": setup.perplexity(setup.model0),
                              "params": setup.params_at(setup.model0), "tau_bounds": list(setup.knob0.bounds)}
        setup.knob0.apply(setup.knob0.bounds[0])
        console.print(f"offline, global τ ({allocation}): " + ", ".join(
            f"{s['params'] / 1e6:.1f}M: {s['perplexity']:.2f}" for s in tau_sweep)
            + f" → τ {tau_budget:.3g} ({sweeps[allocation]['params'] / 1e6:.2f}M, ppl {sweeps[allocation]['perplexity']:.2f})")
    # auto: the allocation that reaches the smaller model within budget offline (before any fine-tuning).
    a.allocation = min(sweeps, key=lambda k: sweeps[k]["params"])
    setup.use(a.allocation)
    tau_budget, tau_sweep = sweeps[a.allocation]["tau_budget"], sweeps[a.allocation]["sweep"]
    oneshot_params, oneshot_ppl = sweeps[a.allocation]["params"], sweeps[a.allocation]["perplexity"]
    console.print(f"allocation: {a.allocation}")
    offline.update({"uniform_rank": uniform_rank, "tau_budget": tau_budget})
    head.update({
        "tau_bounds": list(setup.knob0.bounds),
        "cubic": {"t_init": a.t_init, "t_final": max(a.t_init + 1, round(a.steps * a.t_final))},
        "pid": pid_policy(a, setup.dense_ppl), "rank_sweep": rank_sweep, "tau_sweep": tau_sweep,
        "allocation": a.allocation, "allocation_sweeps": sweeps,
        "offline": {"uniform_rank": uniform_rank, "tau_budget": tau_budget, "tau_budget_params": oneshot_params,
                    "tau_budget_perplexity": oneshot_ppl},
    })


if __name__ == "__main__":
    main()
