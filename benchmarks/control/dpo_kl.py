"""dpo-kl: DPO of the real SmolLM2-135M-Instruct, holding the KL to the reference at a target
by moving DPO's beta (``kl_beta``) mid-run.

The preference set is built here: short factual questions whose *chosen* answer is concise and
whose *rejected* one is the same answer buried in filler (``--n-sums`` adds hard pairs: right vs
wrong sums). KL(reference ‖ policy) is measured by ``KLDrift`` on held-out conversations
(questions not trained on, teacher-forced with both answer styles), with the reference = the
starting weights, every ``--probe-every`` steps, identically in every arm.

Arms (one invocation, same data, seed, learning rate and probe set; all start at the same beta):
- fixed beta (open loop),
- the adaptive KL controller of Ziegler et al. 2019 (``actuator.controllers.AdaptiveKLController``:
  ``beta *= 1 + clip(KL/target - 1, ±0.2) * n/horizon``) applied to ``trainer.beta`` from a
  ``TrainerCallback`` at every KL measurement (n = samples since the last update),
- TorchRL's ``KLAdaptiveLR`` rule (``actuator.controllers.KLAdaptiveLR``, ``--arms kl-adaptive-lr``):
  the learning rate divided by ``--kl-lr-factor`` (1.5) when the KL is above 2× the target,
  multiplied by it when below half the target, left alone in between, within ``--kl-lr-bounds`` ×
  ``--lr`` (default [0.01, 1]: never above the configured rate), fed the same probe at every KL
  measurement, beta fixed: the open-loop-style learning-rate baseline of RL libraries;
- Actuator on beta: a reverse-acting PID on the KL through the real controller service,
  ``ActuatorCallback`` and ``KLBetaKnob`` (``--arms actuator``);
- Actuator on the knobs that *do* have authority over DPO's KL (``--arms lr anchor lr+anchor``,
  see :func:`restoring_policy`): the learning rate (a PID: the KL integrates it, so it can stop the
  drift), the KL-anchor weight (``actuator.agents.anchor``, w·KL(start ‖ policy) on the training
  pairs' own texts, under the PID-Lagrangian: the restoring force DPO's loss lacks), or both.
  ``actuator/presets/dpo-kl.yaml`` is the one the measurement picked (BENCHMARKS.md "dpo-kl").

How much authority beta has over the KL in DPO (what shaped this scenario). The sigmoid loss
``-log σ(β·m)`` (m = the policy-vs-reference log-ratio margin) has no restoring force: nothing
pulls the policy back towards the reference, and under Adam the step size is set by the learning
rate, not by the gradient's scale. Beta acts only by re-weighting the pairs (``β·σ(-β·m)``): once
``β·m`` is large for *every* pair the gradients vanish, Adam's momentum decays, and the drift
stops; a larger beta makes that happen at a smaller margin, i.e. a smaller KL. A pair that cannot
saturate keeps driving full-size Adam steps at any beta. Measured while building this (24 steps,
lr 2e-5, batch 2): with 30 hard pairs (sums) in the set, beta fixed at 0.1 ended at KL 0.44 and a
PID that had raised beta 50x (to 5) by step 16 ended at 0.39, the KL growing ~0.014/step in both;
with IPO on the same set (``--loss-type ipo``: ``(h − 1/(2β))²``, whose optimum moves towards the reference
as beta grows) fixed beta 0.5 ended at 0.28, Ziegler at 0.31, a PID at 0.32 (beta 0.5 → 3.5):
over a short run the optimum moves but Adam's noise-driven drift does not stop. With separable
pairs only (the default set) at lr 2e-5, every arm's loss was 0.000 from step 5-8 on (all pairs
saturated), yet the KL kept rising for the rest of the run (beta 0.1: 0.17 at saturation → 0.80
at step 24; PID, beta 5: 0.11 → 0.56): Adam's first moment (β1 = 0.9) carries the parameters
about ten steps' worth past the moment the gradients vanish. So beta decides *when* the drift
starts to die out, not where the KL ends; a target is met only by saturating early, at a KL well
below it. Hence the default set of separable pairs and the sigmoid loss (the regime in which beta
is a KL actuator at all), a lower learning rate (1e-5), and a PID tuned to act early and hard: a
proportional gain that multiplies beta ~e^8 between KL 0 and the target, bounded by a rate limit
of e^1.5 per decision. A KL overshoot cannot be taken back, only stopped.

Reported per arm: settling step (first step from which every KL measurement stays within ±10% of
the target), overshoot (% above target at the peak), steady-state error (mean |KL − target| /
target over the last three measurements), DPO's logged reward margin (mean over the last five
steps), capability drift (general-text perplexity increase %).

    python -m benchmarks.control.dpo_kl [--steps 40] [--seeds 0] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from pathlib import Path
from typing import Any

from benchmarks.control.contract import Arm, Declared, Metric, Pick
from benchmarks.control.data import prompt_text
from benchmarks.control.harness import identify_and_tune as _identify_and_tune
from benchmarks.control.harness import (
    RESULTS, scenario_args, add_flags, identification_args, tune_summary, start, control_quality, judged, mean_sd,
    pick_on_seed0, read_tagged, settles_against_ziegler, spread, variant_label,
    arm_label, figure, record_targets,
    command_line, console, arm_progress, save_results, KLBaselines, kl_adaptive_lr, kl_trace,
)

import torch  # noqa: E402
from rich.table import Table  # noqa: E402

from actuator.agents.general import PROBE_TEXTS as GENERAL_TEXT  # noqa: E402
from actuator.agents.precision import native_precision, precision_args  # noqa: E402

SCENARIO = "dpo-kl"
PRESET, BEFORE_RAMP = "Actuator lr + anchor (ramp 8)", "Actuator lr + anchor"
FIXED_LRS = ("fixed lr 1e-06", "fixed lr 1.5e-06", "fixed lr 2e-06")


def _with_variant(part: Any, r: dict[str, Any]) -> dict[str, Any]:
    """An older file's restoring arm, named with its issue-40 variant from the policy its file
    records (as :func:`aggregate` names it)."""
    restoring = part.get("configs", {}).get(r.get("loss_type"), {}).get("restoring", {})
    suffix = variant(restoring[r["kind"]][0]) if r["kind"] in restoring else ""
    return {**r, "arm": r["arm"] + suffix} if not r["arm"].endswith(suffix) else r


def _settled(r: Any) -> float:
    return float(r.get("settling_step") is not None)


# The contract (benchmarks/control/contract.py): the arms of the claims (the preset, the preset
# before the ramp, the fixed-lr sweep whose pick on seed 0 it is compared with, the published
# baselines) and the metrics with the targets issue 40 set (target KL 0.1).
SPEC = Declared(
    name=SCENARIO, task="DPO of SmolLM2-135M-Instruct on 72 preference pairs, lr 1e-5, beta 0.1, 40 steps; "
                        "KL to the reference held at 0.1",
    arm_list=[Arm(PRESET, "lr+anchor", {"ramp": 8}), Arm(BEFORE_RAMP, "lr+anchor"),
              *(Arm(n, "fixed-lr", {"lr": float(n.split()[-1])}) for n in FIXED_LRS),
              Arm("TorchRL KLAdaptiveLR", "kl-adaptive-lr"), Arm("Ziegler adaptive KL", "ziegler"),
              Arm("fixed beta 0.1", "fixed")],
    quick=(PRESET, "fixed beta 0.1"),
    metrics=[Metric("overshoot_pct", "min", "%", target=15.0, judge=(PRESET,), label="overshoot at most 15%"),
             Metric("settled", "max", "settled (1) or not (0) by the run's end", target=1.0, judge=(PRESET,),
                    read=_settled, label="settled within the run"),
             Metric("abs_error", "min", "KL", target=1.0, relative_to="pick:fixed lr", judge=(PRESET,),
                    read=lambda r: abs(r["final_kl"] - 0.1), label="|final KL - target| at most the fixed lr pick's"),
             Metric("final_kl", "min", "KL"), Metric("settling_step", "min", "step"),
             Metric("reward_margin", "max", "nats")],
    picks=[Pick("fixed lr", "abs_error", FIXED_LRS)], plots=("kl_drift",), normalize=_with_variant)

FACTS = [
    ("What is the capital of France?", "Paris."),
    ("How many legs does a spider have?", "Eight."),
    ("What is the boiling point of water at sea level in Celsius?", "100 °C."),
    ("Which planet is known as the Red Planet?", "Mars."),
    ("What gas do plants absorb from the air?", "Carbon dioxide."),
    ("How many days are in a leap year?", "366."),
    ("Who wrote Romeo and Juliet?", "William Shakespeare."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean."),
    ("What is the chemical symbol for gold?", "Au."),
    ("How many continents are there?", "Seven."),
    ("What is the freezing point of water in Fahrenheit?", "32 °F."),
    ("Which organ pumps blood through the body?", "The heart."),
    ("What language is spoken in Brazil?", "Portuguese."),
    ("How many sides does a hexagon have?", "Six."),
    ("What is the tallest mountain in the world?", "Mount Everest."),
    ("Which metal is liquid at room temperature?", "Mercury."),
    ("How many minutes are in an hour?", "Sixty."),
    ("What is the capital of Japan?", "Tokyo."),
    ("What is the square root of 81?", "9."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci."),
    ("What is the largest planet in the solar system?", "Jupiter."),
    ("How many hours are in a day?", "Twenty-four."),
    ("What is the capital of Canada?", "Ottawa."),
    ("Which gas do humans need to breathe?", "Oxygen."),
    # held out (KL probe only)
    ("What do bees make?", "Honey."),
    ("Which animal is known as the king of the jungle?", "The lion."),
    ("What color do you get by mixing blue and yellow?", "Green."),
    ("What is the capital of Italy?", "Rome."),
    ("How many wheels does a bicycle have?", "Two."),
    ("What is the opposite of hot?", "Cold."),
]
N_TRAIN_FACTS = 24
OPENERS = ["Great question! Let me think about this carefully.", "That is a really interesting thing to ask.",
           "Thanks for asking! There is a lot to say here."]
CLOSERS = ["I hope this helps, feel free to ask more!", "Let me know if you would like more detail.",
           "There is always more to learn about this."]


def preference_rows(seed: int, n_sums: int) -> tuple[dict[str, list], list[tuple[str, str, str]]]:
    """Training rows (prompt/chosen/rejected strings; TRL appends EOS) and held-out (question,
    chosen, rejected) triples: concise vs rambling answers, and (``n_sums`` > 0) right vs wrong sums.

    The sums are *hard* pairs (chosen and rejected differ in one token, and a 135M model is
    unsure of two-digit sums): their margins stay small at any beta, so they keep producing
    full-size Adam steps and the KL keeps growing whatever beta does (measured: see the module
    docstring). The default set has none: every pair can saturate, which is the regime where
    beta is a KL actuator at all."""
    rng = random.Random(seed)
    rows: dict[str, list] = {"prompt": [], "chosen": [], "rejected": []}
    held: list[tuple[str, str, str]] = []

    def rambling(a: str, k: int) -> str:
        return f"{OPENERS[k % 3]} The answer is {a} {CLOSERS[k % 3]}"

    for i, (q, a) in enumerate(FACTS):
        if i >= N_TRAIN_FACTS:
            held.append((q, a, rambling(a, i)))
            continue
        for r in range(3):
            rows["prompt"].append(prompt_text(q))
            rows["chosen"].append(a)
            rows["rejected"].append(f"{OPENERS[(i + r) % 3]} The answer is {a} {CLOSERS[(i + 2 * r) % 3]}")
    sums = set()
    while n_sums and len(sums) < n_sums + 4:
        sums.add((rng.randint(2, 49), rng.randint(2, 49)))
    for j, (x, y) in enumerate(sorted(sums, key=lambda _: rng.random())):
        q = f"What is {x} + {y}?"
        right, wrong = f"{x} + {y} = {x + y}.", f"{x} + {y} = {x + y + rng.choice([-10, -2, -1, 1, 2, 10])}."
        if j >= n_sums:
            held.append((q, right, wrong))
            continue
        rows["prompt"].append(prompt_text(q))
        rows["chosen"].append(right)
        rows["rejected"].append(wrong)
    order = list(range(len(rows["prompt"])))
    rng.shuffle(order)
    return {k: [v[i] for i in order] for k, v in rows.items()}, held


def chat_text(tok: Any, q: str, a: str) -> str:
    return f"{prompt_text(q)}{a}{tok.eos_token}"


class Setup:
    """The model, reference, data and probes every arm shares."""

    def __init__(self, a: argparse.Namespace) -> None:
        from datasets import Dataset, disable_progress_bars

        from actuator.agents.models import load_smollm2
        from actuator.agents.probes import Perplexity

        disable_progress_bars()
        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            self.model, self.tok = load_smollm2()
        # The reference for the DPO loss and for the KL probe: a frozen copy of the starting
        # weights, taken before any trainer touches the model (DPOTrainer patches forward).
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        rows, held = preference_rows(a.seeds[0], n_sums=a.n_sums)
        self.train = Dataset.from_dict(rows)
        self.kl_texts = [chat_text(self.tok, q, c) for q, c, _ in held] + [chat_text(self.tok, q, r) for q, _, r in held]
        # The KL anchor's texts: the *training* pairs, both answers (never the held-out ones the
        # probe measures, so the anchor cannot pass the probe by anchoring on it).
        self.anchor_texts = sorted({p + c + self.tok.eos_token for p, c in zip(rows["prompt"], rows["chosen"])}
                                   | {p + r + self.tok.eos_token for p, r in zip(rows["prompt"], rows["rejected"])})
        self.ppl = Perplexity(GENERAL_TEXT, self.tok, every=None, batch_size=4)

    def fresh_model(self) -> Any:
        return copy.deepcopy(self.model).train()

    def kl_probe(self, every: int) -> Any:
        from actuator.agents.probes import KLDrift

        return KLDrift(self.kl_texts, self.tok, reference=self.ref, every=every, max_length=64, batch_size=8)

    def perplexity(self, model: Any) -> float:
        from actuator.agents.probes import ProbeSuite

        suite = ProbeSuite([self.ppl], budget_share=1.0)
        suite.setup(model)
        return suite.run(model, 0, force=True).values["perplexity"]


def make_trainer(setup: Setup, model: Any, name: str, a: argparse.Namespace, seed: int, anchor: Any = None) -> Any:
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import DPOConfig, DPOTrainer

    from actuator.agents.anchor import anchor_trainer

    torch.manual_seed(seed)
    config = DPOConfig(
        output_dir=str(a.out / name), max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        learning_rate=a.lr, lr_scheduler_type="constant", beta=a.beta, loss_type=[a.loss_type], max_length=80,
        use_cpu=True, report_to=[], **precision_args(a.precision),
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=seed, dataloader_num_workers=0,
        weight_decay=0.0, gradient_checkpointing=False,  # TRL defaults it on: memory is not short here, time is
    )
    extra = {"kl_anchor": anchor} if anchor is not None else {}
    cls = anchor_trainer(DPOTrainer) if anchor is not None else DPOTrainer
    trainer = cls(model=model, ref_model=setup.ref, args=config, train_dataset=setup.train,
                  processing_class=setup.tok, **extra)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def pid_policy(a: argparse.Namespace) -> dict[str, Any]:
    """preset:dpo-kl with gains scaled to the target and a probe interval for a short run.

    Gains are in log(beta) per unit of KL: kp = 8/target would move beta by a factor e^8 between
    KL = 0 and KL = target (the bounds stop it at 50x); the derivative on the measurement raises
    beta while the KL is still climbing, before it reaches the target, since DPO has no force
    that brings KL back down."""
    sp = a.target
    return {
        "name": "bench-dpo-kl",
        "probes": [{"name": "kl_drift", "every": a.probe_every}],
        "controllers": [{"name": "kl-beta", "probe": "kl_drift", "knob": "kl_beta", "setpoint": sp,
                         "kp": a.kp / sp, "ki": a.ki / sp, "kd": a.kd / sp, "direction": "reverse",
                         "filter": {"kind": "ema", "alpha": 0.8}}],
        "guardrails": [{"name": "kl-cap", "probe": "kl_drift", "bound": "upper", "threshold": 10 * sp,
                        "action": "alert", "consecutive": 3}],
    }


def restoring_policy(a: argparse.Namespace, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arms that give DPO an actuator with authority over the KL (policy, knob bounds).

    * ``lr``: a direct-acting PID on the learning rate (a higher rate drifts faster) (log scale, bounds [lr·``--lr-floor``, lr]),
      sft-drift's rule (kp 4, ki 0.2 per step, × 1/target). Without a restoring force the KL
      integrates the learning rate, so the rate can *stop* the drift (Adam's step, momentum
      included, is proportional to it), though not take it back.
    * ``anchor``: the KL-anchor weight ``kl_weight`` (``actuator.agents.anchor``: w·KL(start ‖
      policy) on the training pairs' own texts) under the PID-Lagrangian (``kind: constraint``,
      KL ≤ target), the restoring force DPO's loss lacks; gains ``--w-kp``/``--w-ki`` × 1/target.
    * ``lr+anchor``: both, each on the same probe; the anchor has the higher priority.
    * ``split``: one split-range PID (``kind: split_range``) on the same probe: its output u in
      [0, 1] moves the learning rate from its floor to ``--lr`` (KL too low: train at the full rate,
      never above it), u in [-1, 0] the anchor weight from ``--w-max`` to 0 (KL too high: restore);
      gains ``--split-kp``/``--split-ki`` × 1/target on u.

    ``--predict H`` (probe intervals) gives every controller of these arms the projected
    measurement y + H·Δy (issue 40's predictive term), ``--ramp N`` a setpoint ramp over N
    intervals; 0 (the default) is today's preset.
    """
    sp = a.target
    controllers: list[dict[str, Any]] = []
    knobs: dict[str, Any] = {}
    anchor_bounds = {"min": 0.0, "max": a.w_max, "max_step": a.w_step}
    lr_bounds = {"min": a.lr * a.lr_floor, "max": a.lr, "max_step": a.max_step}
    if kind in ("anchor", "lr+anchor"):
        controllers.append({"name": "kl-anchor", "kind": "constraint", "bound": "upper", "probe": "kl_drift",
                            "knob": "kl_weight", "setpoint": sp, "kp": a.w_kp / sp, "ki": a.w_ki / sp, "priority": 10})
        knobs["kl_weight"] = anchor_bounds
    if kind in ("lr", "lr+anchor"):
        controllers.append({"name": "kl-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": sp,
                            "kp": a.lr_kp / sp, "ki": a.lr_ki / sp, "direction": "direct", "priority": 5})
        knobs["learning_rate"] = lr_bounds
    if kind == "split":
        controllers.append({"name": "kl-split", "kind": "split_range", "probe": "kl_drift", "setpoint": sp,
                            "kp": a.split_kp / sp, "ki": a.split_ki / sp, "legs": [
                                {"knob": "learning_rate", "range": [0.0, 1.0], "values": [lr_bounds["min"], lr_bounds["max"]],
                                 "acts": "direct"},
                                {"knob": "kl_weight", "range": [-1.0, 0.0], "values": [a.w_max, 0.0],
                                 "acts": "reverse"}]})
        knobs["kl_weight"] = anchor_bounds
        knobs["learning_rate"] = lr_bounds
    for c in controllers:
        if a.predict:
            c["horizon"] = a.predict
        if a.ramp and c.get("kind") != "constraint":  # the PID-Lagrangian takes no ramp
            c["setpoint_ramp"] = a.ramp
    policy = {"name": f"bench-dpo-kl-{kind.replace('+', '-')}", "probes": [{"name": "kl_drift", "every": a.probe_every}],
              "controllers": controllers}
    return policy, knobs


RESTORING = ("lr", "anchor", "lr+anchor", "split")


def variant(policy: dict[str, Any]) -> str:
    """A restoring arm's issue-40 variant from its policy (``harness.variant_label``)."""
    return variant_label(policy.get("controllers", []))


def run_arm(setup: Setup, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.probes import ProbeSuite
    from actuator.agents.trl_knobs import KLBetaKnob

    from actuator.agents.anchor import KLAnchor, KLAnchorKnob

    model = setup.fresh_model()
    anchor = (KLAnchor(setup.anchor_texts, setup.tok, weight=0.0, batch_size=a.anchor_batch, max_length=64, seed=seed)
              if arm["kind"] in ("anchor", "lr+anchor", "split", "tuned", "identify") else None)
    trainer = make_trainer(setup, model, f"{a.loss_type}-{arm['kind'].replace('+', '-')}", a, seed, anchor)
    knob = KLBetaKnob(trainer)
    probe = setup.kl_probe(1 if arm["kind"] == "identify" else a.probe_every)
    trace: list[dict[str, float]] = []
    margins: list[dict[str, float]] = []
    cb = None
    if arm["kind"] == "actuator":
        cb = ActuatorCallback(
            pid_policy(a), connection=url, probes=[probe], reporting={"budget_share": 1.0}, run=f"bench-{SCENARIO}-{a.loss_type}-{seed}",
            setters=[knob], knobs={"kl_beta": {"min": a.beta / 4, "max": a.beta * a.beta_cap, "max_step": a.max_step}})
        cb.attach(trainer)
        suite = None
    elif arm["kind"] in RESTORING or arm["kind"] in ("tuned", "identify"):
        policy, knobs = restoring_policy(a, "lr+anchor") if arm["kind"] in ("tuned", "identify") else \
            restoring_policy(a, arm["kind"])
        if arm["kind"] == "tuned":
            policy = arm["policy"]
        elif arm["kind"] == "identify":
            policy["probes"][0]["every"] = 1
        cb = ActuatorCallback(
            policy, connection=url, probes=[probe], reporting={"budget_share": 1.0},
            run=f"bench-{SCENARIO}-{a.loss_type}-{arm['kind'].replace('+', '-')}-{seed}", knobs=knobs,
            setters=[KLAnchorKnob(anchor)] if anchor is not None else None,
            identify=arm.get("identify"))
        cb.attach(trainer)
        suite = None
    else:
        suite = ProbeSuite([probe], budget_share=1.0)
    baselines = KLBaselines(arm["kind"], a, samples_per_step=a.batch_size)  # preference pairs per step

    def on_value(step: int, value: float, kw: dict[str, Any]) -> None:
        trace.append({"step": step, "kl_drift": value, "beta": knob.read(), "lr": kw["optimizer"].param_groups[0]["lr"],
                      "w": anchor.weight if anchor is not None else 0.0})
        if not console.is_terminal:  # a log file gets one line per measurement
            console.print(f"  {arm['name']} seed {seed} step {step}: kl {value:.4f} beta {knob.read():.3g} "
                          f"lr {trace[-1]['lr']:.3g} w {trace[-1]['w']:.3g}")
        baselines.update(value, step, knob, kw["optimizer"], kw.get("lr_scheduler"))

    def on_log(step: int, logs: dict[str, Any]) -> None:
        if "rewards/margins" in logs:
            margins.append({"step": step, "margin": float(logs["rewards/margins"]),
                            "loss": float(logs.get("loss", float("nan"))), "beta": knob.read()})

    with arm_progress(arm["name"], a.steps, 18) as advance:
        trainer.add_callback(kl_trace("kl_drift", knob, a.beta, trace, cb=cb, suite=suite, on_value=on_value,
                                      on_log=on_log, advance=advance))
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    ppl = setup.perplexity(model)
    r = {"arm": arm["name"], "kind": arm["kind"], "loss_type": a.loss_type, "start_beta": a.beta, "seed": seed,
         "trace": trace, "margins": margins,
         "final_perplexity": ppl, "final_beta": knob.read(), "seconds": seconds,
         "decisions": len(cb.session.applied) if cb is not None else None,
         "run_id": cb.session.run_id if cb is not None else None}
    r.update(control_quality(trace, a.target, a.band))
    tail = margins[-5:]
    r["reward_margin"] = sum(m["margin"] for m in tail) / max(1, len(tail))
    del trainer, model
    return r


def identify_and_tune(setup: Setup, a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    """The tuned arm's preparation: an identification pre-run of ``--ident-steps`` steps (the agent's
    identification mode steps the learning rate by ``--ident-size`` log units after
    ``--ident-hold`` steps, KL probed every step), then ``POST /v1/policies/tune`` on its stored
    observations for the lr controller of the lr + anchor policy (the anchor keeps its hand gains:
    tune handles setpoint controllers). Returns the tune response and the pre-run's trace."""
    ia = copy.copy(a)
    ia.steps = a.ident_steps
    return _identify_and_tune(run_arm, setup, a, url, seed, controller="kl-lr",
                              policy=lambda: restoring_policy(a, "lr+anchor")[0], run_args=ia)


def targets_of(pid: dict[str, Any], zie: dict[str, Any], steps: int) -> dict[str, Any]:
    """The PID arm against Ziegler's (one seed's runs, or their means over seeds): settles in half
    Ziegler's steps, overshoot at most 15%."""
    settle = math.inf if pid["settling_step"] is None else float(pid["settling_step"])
    # A controller that never settles within the run "needs" more than the run's steps.
    zsteps = float(zie["settling_step"]) if zie["settling_step"] is not None else float(steps + 1)
    return {
        "settles_in_half_ziegler_steps": settle <= zsteps / 2,
        "overshoot_at_most_15pct": pid["overshoot_pct"] <= 15.0,
        "pid_settling_step": pid["settling_step"], "ziegler_settling_step": zie["settling_step"],
        "pid_overshoot_pct": pid["overshoot_pct"], "ziegler_overshoot_pct": zie["overshoot_pct"],
    }


def aggregate(tag: str = "", results: Path = RESULTS, tags: list[str] | None = None) -> dict[str, Any]:
    """Combine the result files of separate runs (``dpo-kl.json``, ``dpo-kl-TAG.json``; with
    ``tag``, the files ``dpo-kl-TAG*.json``; with ``tags``, those of every tag listed): per loss and
    arm the mean ± sd and worst seed of the settling step (not settled: the run's steps + 1),
    overshoot and final KL; the PID's targets against Ziegler judged on the means and on the seeds
    (harness rule); and issue 40's targets for every closed-loop arm (:func:`law_targets`). A
    restoring arm is named with its variant (:func:`variant`) from the policy its file records.
    Writes ``dpo-kl-aggregate{-TAG}.json`` / ``.png``."""
    name = f"{SCENARIO}-aggregate" + (f"-{tag}" if tag else "")
    found = read_tagged(results, SCENARIO, tag, tags)
    runs: dict[tuple[str, str, int], dict[str, Any]] = {}
    configs: dict[str, Any] = {}
    for _, part in found:
        configs.update(part.get("configs", {}))
        for r in part["arms"]:
            r = _with_variant(part, r)
            runs[(r["loss_type"], r["arm"], r["seed"])] = r  # a later file's run replaces it
    first = found[0][1]
    steps = first["steps"]
    seeds = sorted({s for *_, s in runs})
    rows: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    laws: dict[str, Any] = {}
    for loss in sorted({lo for lo, *_ in runs}):
        by_arm: dict[str, dict[int, dict[str, Any]]] = {}
        by_kind: dict[str, dict[int, dict[str, Any]]] = {}
        for (lo, arm, seed), r in runs.items():
            if lo == loss:
                by_arm.setdefault(arm, {})[seed] = r
                by_kind.setdefault(r["kind"], {})[seed] = r
        rows[loss] = {arm: _row(mine, steps) for arm, mine in by_arm.items()}
        laws[loss] = law_targets(by_arm, steps, first["target"])
        judged_pid = _pid_against_ziegler(by_kind, seeds, steps)
        if judged_pid is not None:
            targets[loss] = judged_pid
    out = {"scenario": SCENARIO, "aggregate": True, "seeds": seeds, "steps": steps, "target": first["target"],
           "band": first["band"], "lr": first["lr"], "configs": configs, "rows": rows, "targets": targets,
           "law_targets": laws, "arms": list(runs.values()), "files": [f.name for f, _ in found]}
    console.print(json.dumps({"rows": rows, "targets": targets}, indent=1, default=str))
    for loss, judged_laws in laws.items():
        print_law_targets(loss, judged_laws)
    save_results(name, out, plot, results=results)
    return out


def _row(mine: dict[int, dict[str, Any]], steps: int) -> dict[str, Any]:
    """One arm's row: its kind, seeds, how many settled, and the spread of the settling step (not
    settled: the run's steps + 1), overshoot and final KL."""
    kind = next(iter(mine.values()))["kind"]
    return {"kind": kind, "seeds": sorted(mine), "settled": sum(r["settling_step"] is not None for r in mine.values()),
            "settling_step": spread({s: r["settling_step"] if r["settling_step"] is not None else steps + 1
                                     for s, r in mine.items()}, higher_is_better=False),
            "overshoot_pct": spread({s: r["overshoot_pct"] for s, r in mine.items()}, higher_is_better=False),
            "final_kl": spread({s: r["final_kl"] for s, r in mine.items()})}


def _pid_against_ziegler(by_kind: dict[str, dict[int, dict[str, Any]]], seeds: list[int],
                         steps: int) -> dict[str, Any] | None:
    """The PID on beta against Ziegler, on the means and per seed (None without both)."""
    pids, zies = by_kind.get("actuator", {}), by_kind.get("ziegler", {})
    both = [s for s in seeds if s in pids and s in zies]
    if not both:
        return None

    def mean_run(kind_runs: dict[int, dict[str, Any]], pid: bool) -> dict[str, Any]:
        settles = [r["settling_step"] for s, r in kind_runs.items() if s in both]
        unsettled = math.inf if pid else float(steps + 1)  # as targets_of reads one run
        settling = [float(x) if x is not None else unsettled for x in settles]
        return {"settling_step": sum(settling) / len(settling),
                "overshoot_pct": mean_sd([r["overshoot_pct"] for s, r in kind_runs.items() if s in both])[0]}

    on_mean = targets_of(mean_run(pids, True), mean_run(zies, False), steps)
    per_seed = {s: targets_of(pids[s], zies[s], steps) for s in both}
    return {k: judged({"met": v}, {s: t[k] for s, t in per_seed.items()}) for k, v in on_mean.items()
            if isinstance(v, bool)}


LAW_KINDS = (*RESTORING, "actuator", "tuned", "kl-adaptive-lr")


def law_targets(by_arm: dict[str, dict[int, dict[str, Any]]], steps: int, target: float) -> dict[str, Any]:
    """Issue 40's targets for every closed-loop arm (``LAW_KINDS``), each judged per seed and on the
    mean under the harness rule (4 of 5 seeds and the mean; with fewer seeds, every one):

    * ``overshoot_at_most_15pct``;
    * ``settles_in_half_ziegler_steps``: settled (±band) in at most half Ziegler's settling steps
      on that seed, or within the run where Ziegler never settles (on the mean: the mean settling
      step, a run that never settles counting ``steps`` + 1, against half Ziegler's mean, or
      ``steps`` where Ziegler never settles on any seed);
    * ``final_error_no_worse_than_fixed_pick``: |final KL − target| at most the fixed pick's;
    * ``reward_margin_within_one_sd_of_fixed_pick``: the reward margin at least the pick's minus
      the sd of the pick's margins over the judged seeds.

    The fixed pick is the ``fixed-lr`` rate nearest the target on seed 0 (``pick_on_seed0``),
    judged on the other seeds, with the best in hindsight beside it. Returns ``{"fixed_pick": …,
    "arms": {arm: {target: verdict}}}`` (the pick's targets are left out without fixed-lr runs,
    Ziegler's without Ziegler runs)."""
    kinds = {arm: next(iter(rs.values()))["kind"] for arm, rs in by_arm.items() if rs}
    seeds = sorted({s for rs in by_arm.values() for s in rs})
    law = _Law(steps, target)
    pick, picked, judged_on = law.pick(by_arm, [arm for arm, k in kinds.items() if k == "fixed-lr"], seeds)
    margin_sd = mean_sd([picked[s]["reward_margin"] for s in judged_on])[1] if len(judged_on) > 1 else 0.0
    zie = next((by_arm[arm] for arm, k in kinds.items() if k == "ziegler"), {})
    out: dict[str, Any] = {}
    for arm, rs in by_arm.items():
        if kinds.get(arm) in LAW_KINDS:
            out[arm] = {**law.overshoot(rs), **law.against_ziegler(rs, zie),
                        **law.against_pick(rs, picked, [s for s in judged_on if s in rs], margin_sd)}
    return {"fixed_pick": pick, "arms": out}


class _Law:
    """Issue 40's targets of one closed-loop arm's runs (``rs``: seed -> run), each judged per seed
    and on the mean (:func:`law_targets`)."""

    def __init__(self, steps: int, target: float) -> None:
        self.steps, self.target = steps, target

    def err(self, r: dict[str, Any]) -> float:
        return abs(r["final_kl"] - self.target)

    def pick(self, by_arm: dict[str, dict[int, dict[str, Any]]], fixed: list[str],
             seeds: list[int]) -> tuple[dict[str, Any], dict[int, dict[str, Any]], list[int]]:
        """The fixed-lr rate nearest the target on seed 0, its runs and the later seeds it ran."""
        if not fixed:
            return {}, {}, []
        pick = pick_on_seed0(fixed, lambda c, s: -self.err(by_arm[c][s]) if s in by_arm[c] else None, seeds)
        picked = by_arm.get(pick.get("picked_on_seed0") or "", {})
        return pick, picked, [s for s in pick.get("judged_on", []) if s in picked]

    def settle(self, r: dict[str, Any]) -> float:
        return float(self.steps + 1) if r["settling_step"] is None else float(r["settling_step"])

    def overshoot(self, rs: dict[int, dict[str, Any]]) -> dict[str, Any]:
        over = {s: r["overshoot_pct"] for s, r in rs.items()}
        return {"overshoot_at_most_15pct": judged({"met": mean_sd(list(over.values()))[0] <= 15.0},
                                                  {s: v <= 15.0 for s, v in over.items()})}

    def against_ziegler(self, rs: dict[int, dict[str, Any]], zie: dict[int, dict[str, Any]]) -> dict[str, Any]:
        zs = [s for s in rs if s in zie]
        if not zs:
            return {}
        per_seed = {s: settles_against_ziegler(rs[s]["settling_step"], zie[s]["settling_step"]) for s in zs}
        never = all(zie[s]["settling_step"] is None for s in zs)
        limit = float(self.steps) if never else mean_sd([self.settle(zie[s]) for s in zs])[0] / 2
        return {"settles_in_half_ziegler_steps": judged(
            {"met": mean_sd([self.settle(rs[s]) for s in zs])[0] <= limit, "limit_on_mean": limit}, per_seed)}

    def against_pick(self, rs: dict[int, dict[str, Any]], picked: dict[int, dict[str, Any]], js: list[int],
                     margin_sd: float) -> dict[str, Any]:
        if not js:
            return {}

        def mean_of(runs: dict[int, dict[str, Any]], f: Any) -> float:
            return mean_sd([f(runs[s]) for s in js])[0]

        def margin(r: dict[str, Any]) -> float:
            return float(r["reward_margin"])

        return {
            "final_error_no_worse_than_fixed_pick": judged(
                {"met": mean_of(rs, self.err) <= mean_of(picked, self.err)},
                {s: self.err(rs[s]) <= self.err(picked[s]) for s in js}),
            "reward_margin_within_one_sd_of_fixed_pick": judged(
                {"met": mean_of(rs, margin) >= mean_of(picked, margin) - margin_sd, "pick_margin_sd": margin_sd},
                {s: rs[s]["reward_margin"] >= picked[s]["reward_margin"] - margin_sd for s in js})}


def print_law_targets(loss: str, laws: dict[str, Any]) -> None:
    """Issue 40's targets, an arm a row: met / missed with the seeds that held."""
    pick = laws["fixed_pick"]
    title = f"{SCENARIO} \\[{loss}]: issue 40's targets"
    if pick:
        title += f"; fixed pick on seed 0: {pick['picked_on_seed0']}, best in hindsight: {pick['best_in_hindsight']}"
    table = Table(title=title)
    names = ["overshoot_at_most_15pct", "settles_in_half_ziegler_steps", "final_error_no_worse_than_fixed_pick",
             "reward_margin_within_one_sd_of_fixed_pick"]
    table.add_column("arm")
    for n in names:
        table.add_column(n.replace("_", " "), justify="center")
    for arm, verdicts in laws["arms"].items():
        table.add_row(arm, *(("met" if v["met"] else "missed") + f" ({v['seeds_held']}/{len(v['held_per_seed'])})"
                             if (v := verdicts.get(n)) else "-" for n in names))
    console.print(table)


def _plot_arm(ax1: Any, ax2: Any, ax3: Any, arm: dict[str, Any], result: dict[str, Any]) -> None:
    """One arm: its KL, the knob in effect (beta; or the knobs that moved: lr / lr0 dashed, w
    dotted) and its reward margin."""
    steps = [t["step"] for t in arm["trace"]]
    label = arm_label(arm, result)
    line, = ax1.plot(steps, [t["kl_drift"] for t in arm["trace"]], marker=".", label=label)
    color = line.get_color()
    if arm["kind"] in (*RESTORING, "tuned", "kl-adaptive-lr"):
        lr0 = arm["trace"][0].get("lr") or result["lr"]
        if arm["kind"] != "anchor":
            ax2.step(steps, [t.get("lr", lr0) / lr0 for t in arm["trace"]], where="post", ls="--",
                     label=f"{label}: lr / lr0", color=color)
        if arm["kind"] not in ("lr", "kl-adaptive-lr"):
            ax2.step(steps, [t.get("w", 0.0) for t in arm["trace"]], where="post", ls=":", label=f"{label}: w",
                     color=color)
    else:
        ax2.step(steps, [t["beta"] for t in arm["trace"]], where="post", label=label, color=color)
    ax3.plot([m["step"] for m in arm["margins"]], [m["margin"] for m in arm["margins"]], label=label, color=color,
             alpha=0.8)


def plot(result: dict[str, Any], path: Path) -> None:
    target, band = result["target"], result["band"]
    losses = list(result["configs"])
    with figure(path, nrows=len(losses)) as (fig, axes):
        for row, loss in zip(axes, losses):
            ax1, ax2, ax3 = row
            arms = [r for r in result["arms"] if r["loss_type"] == loss]
            if len(arms) > 8:  # an aggregate: one seed per panel keeps it readable (the tables have all)
                shown = 1 if any(r["seed"] == 1 for r in arms) else min(r["seed"] for r in arms)
                arms = [r for r in arms if r["seed"] == shown]
            for arm in arms:
                _plot_arm(ax1, ax2, ax3, arm, result)
            ax1.axhline(target, ls="--", color="black", label="target")
            ax1.axhspan(target * (1 - band), target * (1 + band), color="grey", alpha=0.15, label=f"±{band:.0%}")
            ax1.set_title(f"[{loss}] KL(reference ‖ policy), held-out conversations")
            ax1.set_xlabel("step")
            ax1.legend(fontsize=7)
            ax2.set_yscale("symlog", linthresh=0.01)
            ax2.set_title(f"[{loss}] knob in effect: beta, lr / lr0 (--), anchor w (:)")
            ax2.set_xlabel("step")
            ax2.legend(fontsize=7)
            ax3.set_yscale("symlog", linthresh=1.0)
            ax3.set_title(f"[{loss}] reward margin (rewards/margins)")
            ax3.set_xlabel("step")
        fig.suptitle(f"dpo-kl — SmolLM2-135M-Instruct, DPOTrainer, {result['steps']} steps, lr {result['lr']:g}",
                     fontsize=10)


# Per-loss defaults (CLI values override them for every loss type). Gains are × 1/target.
LOSS_DEFAULTS = {
    "sigmoid": {"beta": 0.1, "kp": 8.0, "ki": 0.1, "kd": 4.0},
    "ipo": {"beta": 0.5, "kp": 2.0, "ki": 0.3, "kd": 2.0},
}


def parser() -> argparse.ArgumentParser:
    """The scenario's flags (``parser().parse_args([])``: the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=40, quick="24 steps", arms=["fixed", "fixed-lr", "ziegler", "kl-adaptive-lr", "actuator",
                                                            *RESTORING, "tuned"],
                  arms_default=["fixed", "ziegler", "actuator"],
                  arms_help="actuator = the PID on beta; lr, anchor, lr+anchor, split = the actuators with "
                            "authority over DPO's KL (see restoring_policy); kl-adaptive-lr = TorchRL's KLAdaptiveLR "
                            "rule on the learning rate; fixed = beta and lr fixed at --beta, --lr; fixed-lr = a fixed "
                            "learning rate from --fixed-lrs (the open-loop setting that can hold DPO's KL)",
                  tag_help="results go to dpo-kl-TAG.json (default dpo-kl.json)",
                  aggregate="combine the result files of separate runs (one process per seed: --seeds N --tag "
                            "seedN) into dpo-kl-aggregate.json; run nothing")
    ap.add_argument("--loss-type", nargs="+", choices=sorted(LOSS_DEFAULTS), default=["sigmoid"],
                    help="DPOTrainer loss(es), each with all arms (default: sigmoid)")
    ap.add_argument("--beta", type=float, default=None, help="starting beta, all arms (default per loss)")
    ap.add_argument("--beta-cap", type=float, default=50.0, help="the PID's beta ceiling, × the starting beta")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--batch-size", type=int, default=2, help="preference pairs per step")
    ap.add_argument("--target", type=float, default=0.1, help="KL target (held-out KLDrift; preset: 0.1)")
    ap.add_argument("--band", type=float, default=0.10, help="settling band, relative to the target")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--horizon", type=float, default=None,
                    help="Ziegler horizon in samples (default: samples per probe interval, so one update "
                         "moves beta by at most ±20%%, the clip of the paper)")
    ap.add_argument("--kp", type=float, default=None, help="PID kp × target (log-beta units; default per loss)")
    ap.add_argument("--ki", type=float, default=None, help="PID ki × target, per step")
    ap.add_argument("--kd", type=float, default=None, help="PID kd × target, steps")
    ap.add_argument("--max-step", type=float, default=1.5, help="PID rate limit, log-beta units per decision")
    ap.add_argument("--n-sums", type=int, default=0, help="hard pairs: right vs wrong sums (default none)")
    add_flags(ap, {  # the restoring arms (lr, anchor, lr+anchor)
        "--lr-kp": (4.0, "lr arm: PID kp × 1/target (log-lr units)"),
        "--lr-ki": (0.2, "lr arm: PID ki × 1/target, per step"),
        "--lr-floor": (0.01, "lr arm: lowest learning rate, × --lr"),
        "--w-kp": (2.0, "anchor arm: constraint kp × 1/target"),
        "--w-ki": (0.2, "anchor arm: constraint ki × 1/target, per step"),
        "--w-max": (5.0, "anchor arm: largest KL-anchor weight"),
        "--w-step": (0.5, "anchor arm: largest change of w per decision"),
        "--anchor-batch": (2, "anchor texts per step"),
        "--kl-lr-factor": (1.5, "kl-adaptive-lr arm: the factor (TorchRL's default 1.5)"),
        "--split-kp": (0.5, "split arm: PID kp on u in [-1, 1] × 1/target"),
        "--split-ki": (0.1, "split arm: PID ki on u × 1/target, per step"),
        "--predict": (0.0, "lr, anchor, lr+anchor, split arms: prediction horizon in probe intervals (0: none)"),
        "--ramp": (0, "lr, anchor, lr+anchor, split arms: setpoint ramp in probe intervals (0: none)"),
    })
    ap.add_argument("--fixed-lrs", type=float, nargs="+", default=[2e-6, 3e-6, 4e-6, 6e-6],
                    help="fixed-lr arm: the learning rates swept, beta at --beta (pick on seed 0, judge on the rest)")
    ap.add_argument("--aggregate-tags", nargs="+", default=None, metavar="TAG",
                    help="with --aggregate: combine the files of several tags (dpo-kl-TAG*.json for each) into "
                         "dpo-kl-aggregate-<--tag>.json")
    ap.add_argument("--kl-lr-bounds", type=float, nargs=2, default=[0.01, 1.0], metavar=("LO", "HI"),
                    help="kl-adaptive-lr arm: min_lr and max_lr as multiples of --lr (default 0.01 1: never above "
                         "the configured rate)")
    identification_args(ap)
    ap.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                    help="training precision (auto: bf16 where the machine has it natively, else fp32)")
    return ap


def loss_configs(a: argparse.Namespace) -> dict[str, argparse.Namespace]:
    """Per loss type of ``--loss-type``: the arguments with that loss's defaults where a flag was
    not given."""
    configs: dict[str, argparse.Namespace] = {}
    for loss in a.loss_type:
        la = copy.copy(a)
        la.loss_type = loss
        for key, value in LOSS_DEFAULTS[loss].items():
            if getattr(a, key) is None:
                setattr(la, key, value)
        configs[loss] = la
    return configs


def arm_names(la: argparse.Namespace) -> dict[str, str]:
    """Each arm kind's name (a restoring arm's with its issue-40 variant)."""
    names = {"fixed": f"fixed beta {la.beta:g}", "ziegler": "Ziegler adaptive KL",
             "kl-adaptive-lr": "TorchRL KLAdaptiveLR", "actuator": "actuator PID",
             "lr": "Actuator lr PID", "anchor": "Actuator KL anchor (w)", "lr+anchor": "Actuator lr + anchor",
             "split": "Actuator split range (lr | anchor)"}
    names["tuned"] = "Actuator lr (tuned) + anchor"
    for kind in RESTORING:
        names[kind] += variant(restoring_policy(la, kind)[0])
    return names


def run_fixed_lr(setup: Setup, la: argparse.Namespace, lr: float, url: str, seed: int,
                 base_ppl: float) -> dict[str, Any]:
    """One rate of the fixed-lr sweep."""
    fa = copy.copy(la)
    fa.lr = lr
    r = run_arm(setup, {"name": f"fixed lr {lr:g}", "kind": "fixed-lr"}, fa, url, seed)
    r.update(lr=lr, perplexity_increase_pct=100 * (r["final_perplexity"] / base_ppl - 1))
    return r


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser()
    a = ap.parse_args(argv)
    if a.aggregate:
        return aggregate(a.tag, a.results, tags=a.aggregate_tags)
    if a.precision == "auto":
        a.precision = native_precision()
    if a.quick:
        a.steps = min(a.steps, 24)
    if a.horizon is None:
        a.horizon = float(a.probe_every * a.batch_size)
    url = start(a)
    t_start = time.time()
    setup = Setup(a)
    base_ppl = setup.perplexity(setup.model)
    console.print(f"start: general-text perplexity {base_ppl:.2f}; {len(setup.train)} preference pairs, "
                  f"{len(setup.kl_texts)} held-out KL texts; KL target {a.target}, lr {a.lr:g}, "
                  f"Ziegler horizon {a.horizon:g} samples")
    configs = loss_configs(a)

    def report(results: list[dict[str, Any]]) -> dict[str, Any]:
        """Table, targets and the results file with the arms so far (written after every arm)."""
        table = Table(title=f"{SCENARIO} — SmolLM2-135M-Instruct, DPOTrainer, {a.steps} steps, KL target {a.target} "
                            f"(±{a.band:.0%} band), lr {a.lr:g}")
        for col in ("loss", "arm", "seed", "settling step", "overshoot %", "steady-state err %", "final KL", "final beta",
                    "reward margin", "ppl +%", "decisions", "s"):
            table.add_column(col, justify="right")
        for r in results:
            table.add_row(r["loss_type"], r["arm"], str(r["seed"]),
                          "not settled" if r["settling_step"] is None else str(r["settling_step"]),
                          f"{r['overshoot_pct']:.0f}", f"{r['steady_state_error_pct']:.0f}", f"{r['final_kl']:.4f}",
                          f"{r['final_beta']:.3g}", f"{r['reward_margin']:+.2f}", f"{r['perplexity_increase_pct']:+.1f}",
                          "-" if r["decisions"] is None else str(r["decisions"]), f"{r['seconds']:.0f}")
        console.print(table)

        out: dict[str, Any] = {
            "scenario": SCENARIO, "steps": a.steps, "seeds": a.seeds, "target": a.target, "band": a.band,
            "lr": a.lr, "batch_size": a.batch_size, "probe_every": a.probe_every, "ziegler_horizon": a.horizon,
            "precision": a.precision,
            "configs": {loss: {"beta": la.beta, "pid": pid_policy(la)["controllers"][0],
                               "kl_beta_bounds": [la.beta / 4, la.beta * la.beta_cap], "max_step": la.max_step,
                               "restoring": {k: restoring_policy(la, k) for k in RESTORING if k in a.arms},
                               "kl_adaptive_lr": vars(kl_adaptive_lr(la)) if "kl-adaptive-lr" in a.arms else None}
                        for loss, la in configs.items()},
            "start_perplexity": base_ppl, "arms": results, "tune_refusals": refusals,
            "command": command_line("dpo_kl", argv),
        }

        targets = {}
        for loss in configs:
            for seed in a.seeds:
                pick = [r for r in results if r["loss_type"] == loss and r["seed"] == seed]
                pid = next((r for r in pick if r["kind"] == "actuator"), None)
                zie = next((r for r in pick if r["kind"] == "ziegler"), None)
                if pid and zie:
                    targets[f"{loss} seed {seed}"] = targets_of(pid, zie, a.steps)
        record_targets(out, targets)
        save_results(f"{SCENARIO}-{a.tag}" if a.tag else SCENARIO, out, plot, t_start, a.results)
        return out

    results: list[dict[str, Any]] = []
    refusals: list[dict[str, Any]] = []
    out: dict[str, Any] = {}
    for la in configs.values():
        names = arm_names(la)
        for seed in a.seeds:
            for kind in a.arms:
                if kind == "fixed-lr":  # the sweep: one run per rate
                    for lr in a.fixed_lrs:
                        results.append(run_fixed_lr(setup, la, lr, url, seed, base_ppl))
                        out = report(results)
                    continue
                arm: dict[str, Any] = {"name": names[kind], "kind": kind}
                prep = None
                if kind == "tuned":
                    from actuator import ActuatorError

                    try:
                        prep = identify_and_tune(setup, la, url, seed)
                    except ActuatorError as exc:  # tune refused (409: not identifiable): no loop to run
                        refusals.append({"seed": seed, "refused": str(exc)})
                        console.print(f"  tuned seed {seed}: tune refused: {exc}")
                        out = report(results)
                        continue
                    arm["policy"] = prep["tune"]["policy"]
                    console.print(tune_summary(seed, prep))
                r = run_arm(setup, arm, la, url, seed)
                if prep is not None:
                    r["tuning"] = prep
                r["perplexity_increase_pct"] = 100 * (r["final_perplexity"] / base_ppl - 1)
                results.append(r)
                out = report(results)  # each arm as it ends: a stopped run keeps what it measured
    return out


if __name__ == "__main__":
    main()
