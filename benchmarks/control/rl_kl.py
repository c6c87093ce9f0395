"""rl-kl: online RL (TRL ``RLOOTrainer``, ``GRPOTrainer``) of the real SmolLM2-135M-Instruct, holding
the policy's KL to the starting model at a target by moving the KL coefficient beta (``kl_beta``).

Why here and not in DPO (see ``benchmarks/control/dpo_kl.py``): with a KL penalty in an RL
objective the optimum is π* ∝ π_ref·exp(r/β), whose KL falls monotonically as β grows, so β is a
restoring force and integral action can settle. RLOO folds ``-β·KL`` into each sequence's
reward when it generates; GRPO adds ``β·KL`` (Schulman's k3 estimate) to its per-token loss.

Task (no reward model, nothing downloaded): short factual and arithmetic questions; the reward
is +1 when the gold answer appears in the completion, minus ``--length-cost`` per completion
token. The starting model rambles, so the reward pulls towards short exact answers: the policy
moves away from the reference, and the KL grows until β holds it.

The KL is the probe ``PolicyKL`` (``policy_kl``): KL(policy ‖ starting model) computed exactly
over the full vocabulary at every token of the policy's own sampled answers (T = 1, a fixed
seed per measurement) to held-out questions never trained on, every ``--probe-every`` steps, the
same in every arm. It is not the trainer's one-sample estimate.

Arms (one invocation per seed, same data, learning rate, probe and starting β):
- fixed β over a sweep (``--betas``; open loop);
- Ziegler et al. 2019's adaptive KL controller (``actuator.controllers.AdaptiveKLController``:
  ``β *= 1 + clip(KL/target − 1, ±0.2)·n/horizon``, n = samples since the last update) fed the
  same probe. Its horizon (10 000 samples in the paper, for runs of millions of episodes) is
  rescaled to this run: ``--horizon`` defaults to the samples of one probe interval, so every
  update moves β by up to the paper's ±20 % clip — the fastest the rule allows;
- TorchRL's ``KLAdaptiveLR`` rule (``actuator.controllers.KLAdaptiveLR``, ``--arms kl-adaptive-lr``)
  fed the same probe, β fixed at the starting β: the learning rate divided by ``--kl-lr-factor``
  (1.5) above 2× the target, multiplied by it below half the target, within ``--kl-lr-bounds`` ×
  ``--lr`` (default [0.01, 1]: never above the configured rate);
- early stopping: the fixed-β run at the starting β (or ``--early-stop-beta``), stopped at the
  first measurement at or above the target (derived from that arm's trace: the same seed gives
  the same run up to there);
- **Actuator**: a reverse-acting PID on log β through the real controller service
  (``ActuatorCallback`` + ``KLBetaKnob`` + the ``policy_kl`` probe), gains from the rule below;
- **Actuator on the free signal** (``--arms free``, ``preset:rl-kl-fast``): the same law on the KL
  GRPO logs at every optimizer step (``train.kl``, TRL's k3 estimate on the step's own completions:
  no probe run), EMA-filtered, acting every step. ``policy_kl`` is still measured every
  ``--probe-every`` steps, as in the fixed arms, to judge it on the same figure as the others; the
  probe's seconds are what this arm's control no longer needs (``probe_seconds``).

Gain rule (no per-seed tuning). At the optimum, for small β changes, KL ≈ Var_π(r)/(2β²), so
d log KL / d log β ≈ −2 (static gain g = −2 in log-log). Measured in relative error
e = (KL − target)/target ≈ Δ log KL, a proportional move of Δ log β = e/|g| would close the
error in one step of a static plant. The policy follows β with a lag of τ steps (Adam at a
fixed learning rate) plus a dead time of one probe interval θ, so with SIMC (Skogestad 2003,
τc = θ): kp = τ / (|g|·(τc + θ)) = τ/(4θ) per relative error, and the integral time
τI = min(τ, 8θ). τ is read off the fixed-β traces (the steps the KL takes to cover 63 % of its
move), here ≈ 2 probe intervals, which gives kp ≈ 0.5 and ki = kp/τI ≈ 0.5/(2θ) per step,
both per unit of target (``--kp``, ``--ki``; divided by the target in the policy). The rate limit
(``--max-step``, log-β units per decision) and the bounds [β0/10, β0·100] are the knob's.

Reported per arm and seed: settling step (first step from which every measurement stays within
±``--band`` of the target), overshoot (% above target at the peak), steady-state error (mean
|KL − target|/target over the last three measurements), the final KL, the task reward at the end
(mean over the last ``--tail`` steps, without the KL penalty) and general-text perplexity.

    python -m benchmarks.control.rl_kl [--trainer rloo grpo] [--steps 40] [--seeds 0 1 2] [--quick]
    python -m benchmarks.control.rl_kl --aggregate      # the per-seed files → rl-kl.json/png
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.control.contract import Arm, Declared, Metric, Pick
from benchmarks.control.data import prompt_text
from benchmarks.control.harness import (
    arm_progress, command_line, console, control_quality, figure, judged, mean_sd, record_targets, save_results,
    scenario_args, settles_against_ziegler, start, KLBaselines, kl_adaptive_lr, kl_trace, variant_label,
)

import torch  # noqa: E402
from rich.table import Table  # noqa: E402

from actuator.agents.general import PROBE_TEXTS as GENERAL_TEXT  # noqa: E402

SCENARIO = "rl-kl"
PREDICT = "actuator PID (predict 2)"
FIXED_BETAS = ("fixed β 0.1", "fixed β 0.5", "fixed β 1", "fixed β 2")
FREE = "actuator PID on train.kl"

def _named(part: Any, r: dict[str, Any]) -> dict[str, Any]:
    """An older file's run, a PID arm named with the variant its file's policy records."""
    return _with_variant({**part, "arms": [r]})[0]


# The contract (benchmarks/control/contract.py) of the GRPO claim (README "rl-kl", `preset:rl-kl`):
# the PID with prediction against the fixed β picked on seed 0 and the published baselines.
SPEC = Declared(
    name=SCENARIO, task="GRPO of SmolLM2-135M-Instruct, 24 steps; the β PID holds KL(policy || start) at "
                        "its target",
    arm_list=[Arm(PREDICT, "actuator", {"horizon": 2}), Arm("actuator PID", "actuator"), Arm(FREE, "free"),
              *(Arm(n, "fixed", {"beta": float(n.split()[-1])}) for n in FIXED_BETAS),
              Arm("Ziegler adaptive KL", "ziegler"), Arm("TorchRL KLAdaptiveLR", "kl-adaptive-lr")],
    quick=(PREDICT, "fixed β 0.1"),
    metrics=[Metric("overshoot_pct", "min", "%", target=15.0, judge=(PREDICT, FREE), label="overshoot at most 15%"),
             Metric("abs_error", "min", "KL", target=1.0, relative_to="pick:fixed β", judge=(PREDICT,),
                    label="|final KL - target| at most the fixed β pick's"),
             Metric("final_kl", "min", "KL"), Metric("reward", "max", "reward")],
    picks=[Pick("fixed β", "abs_error", FIXED_BETAS)], plots=("policy_kl", "beta"), normalize=_named)

FACTS = [
    ("What is the capital of France?", "Paris"), ("How many legs does a spider have?", "8|eight"),
    ("Which planet is known as the Red Planet?", "Mars"), ("What gas do plants absorb from the air?", "carbon dioxide|CO2"),
    ("How many days are in a leap year?", "366"), ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the largest ocean on Earth?", "Pacific"), ("What is the chemical symbol for gold?", "Au"),
    ("How many continents are there?", "7|seven"), ("Which organ pumps blood through the body?", "heart"),
    ("What language is spoken in Brazil?", "Portuguese"), ("How many sides does a hexagon have?", "6|six"),
    ("What is the tallest mountain in the world?", "Everest"), ("What is the capital of Japan?", "Tokyo"),
    ("Who painted the Mona Lisa?", "Leonardo|da Vinci"), ("What is the largest planet in the solar system?", "Jupiter"),
    ("How many hours are in a day?", "24|twenty-four"), ("What is the capital of Canada?", "Ottawa"),
    ("Which gas do humans need to breathe?", "oxygen"), ("What is the freezing point of water in Celsius?", "0|zero"),
]
HELD_OUT = [  # KL probe only, never trained on
    "What do bees make?", "Which animal is known as the king of the jungle?",
    "What color do you get by mixing blue and yellow?", "What is the capital of Italy?",
    "What is 12 + 9?", "What is 7 times 6?", "How many wheels does a bicycle have?", "What is the opposite of hot?",
    # --probe-prompts 16 adds these (the first 8 are the original probe)
    "What is the capital of Spain?", "How many legs does a cat have?", "What is 15 + 27?",
    "Which animal says moo?", "What is the boiling point of water in Celsius?", "What is 9 times 8?",
    "What color is the sky on a clear day?", "Who was the first person to walk on the Moon?",
]


def task_rows(seed: int, n_sums: int) -> dict[str, list[str]]:
    """Prompts (SmolLM2's chat format without the system prompt) and gold answers ("a|b": any)."""
    rng = random.Random(1000 + seed)
    rows: dict[str, list[str]] = {"prompt": [], "gold": []}
    for q, a in FACTS:
        rows["prompt"].append(prompt_text(q))
        rows["gold"].append(a)
    for _ in range(n_sums):
        x, y = rng.randint(2, 49), rng.randint(2, 49)
        rows["prompt"].append(prompt_text(f"What is {x} + {y}?"))
        rows["gold"].append(str(x + y))
    order = list(range(len(rows["prompt"])))
    rng.shuffle(order)
    return {k: [v[i] for i in order] for k, v in rows.items()}


def is_correct(completion: str, gold: str) -> bool:
    text = completion.lower()
    return any(g.lower() in text for g in gold.split("|"))


class TaskReward:
    """The reward function (TRL's ``reward_funcs`` signature): +1 for the gold answer anywhere in
    the completion, minus ``length_cost`` per completion token. Records the mean task reward and
    accuracy of every generation batch by step (what the arms report: no KL penalty in it)."""

    __name__ = "task_reward"

    def __init__(self, length_cost: float) -> None:
        self.length_cost = length_cost
        self.log: list[dict[str, float]] = []

    def __call__(self, prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                 gold: list[str], trainer_state: Any = None, **_: Any) -> list[float]:
        hits = [is_correct(c, g) for c, g in zip(completions, gold)]
        rewards = [float(h) - self.length_cost * len(ids) for h, ids in zip(hits, completion_ids)]
        step = getattr(trainer_state, "global_step", 0) if trainer_state is not None else 0
        self.log.append({"step": step, "reward": statistics.fmean(rewards), "accuracy": statistics.fmean(hits),
                         "length": statistics.fmean(len(i) for i in completion_ids)})
        return rewards


class Setup:
    """The model (saved once as a plain transformers checkpoint: TRL's RL trainers build their
    reference from the policy's path), the probes' reference and data every arm shares."""

    def __init__(self, a: argparse.Namespace) -> None:
        from datasets import disable_progress_bars

        from actuator.agents.models import load_smollm2
        from actuator.agents.probes import Perplexity

        disable_progress_bars()
        with console.status("loading SmolLM2-135M-Instruct (offline)…"):
            model, self.tok = load_smollm2()
        self.path = a.out / "smollm2-135m-instruct"
        if not (self.path / "config.json").is_file():
            model.save_pretrained(self.path)
            self.tok.save_pretrained(self.path)
        self.ref = model.eval().requires_grad_(False)
        if not 2 <= a.probe_prompts <= len(HELD_OUT):
            raise SystemExit(f"--probe-prompts must be in 2..{len(HELD_OUT)}, got {a.probe_prompts}")
        self.kl_prompts = [prompt_text(q) for q in HELD_OUT[: a.probe_prompts]]
        self.ppl = Perplexity(GENERAL_TEXT, self.tok, every=None, batch_size=4)

    def kl_probe(self, a: argparse.Namespace, seed: int) -> Any:
        from actuator.agents.probes import PolicyKL

        return PolicyKL(self.kl_prompts, self.tok, reference=self.ref, every=a.probe_every,
                        max_new_tokens=a.max_new_tokens, samples=a.probe_samples, seed=seed,
                        use_chat_template=False, batch_size=8)

    def start_beta(self, a: argparse.Namespace, seed: int, kind: str) -> dict[str, Any]:
        """The feedforward β (``--beta auto``): the starting model samples ``--auto-samples``
        answers to each training prompt of this seed; the within-prompt variance of what β is
        weighed against (RLOO: the task reward; GRPO: its group-normalised advantage, TRL's
        default ``scale_rewards="group"``) and their mean length give the β at which the
        KL-regularised optimum sits at the target (``actuator.agents.trl_knobs.feedforward_kl_beta``,
        second order). No sweep, no training step."""
        from actuator.agents.trl_knobs import feedforward_kl_beta

        rows = task_rows(seed, a.n_sums)
        start = feedforward_kl_beta(self.ref, self.tok, rows["prompt"], TaskReward(a.length_cost), a.target,
                                    samples=a.auto_samples, max_new_tokens=a.max_new_tokens, seed=10_000 + seed,
                                    columns={"gold": rows["gold"]},
                                    scale_rewards="group" if kind == "grpo" else "none")
        return {**start.as_dict(), "samples_per_prompt": a.auto_samples, "prompts": start.groups}

    def perplexity(self, model: Any) -> float:
        from actuator.agents.probes import ProbeSuite

        suite = ProbeSuite([self.ppl], budget_share=1.0)
        suite.setup(model)
        return suite.run(model, 0, force=True).values["perplexity"]


def make_trainer(setup: Setup, kind: str, name: str, beta: float, reward: TaskReward, a: argparse.Namespace,
                 seed: int, **extra: Any) -> Any:
    """The arm's TRL trainer (``extra``: further config fields, e.g. rl-entropy's ``entropy_coef``)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config_cls, trainer_cls = {"rloo": (RLOOConfig, RLOOTrainer), "grpo": (GRPOConfig, GRPOTrainer)}[kind]
    torch.manual_seed(seed)
    config = config_cls(
        output_dir=str(a.out / f"{kind}-{name}-{seed}"), max_steps=a.steps, learning_rate=a.lr,
        lr_scheduler_type="constant", per_device_train_batch_size=a.prompts * a.samples, num_generations=a.samples,
        max_completion_length=a.max_new_tokens, temperature=1.0, beta=beta, use_cpu=True, bf16=False,
        report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True, seed=seed, dataloader_num_workers=0,
        weight_decay=0.0, gradient_checkpointing=False, model_init_kwargs={"dtype": torch.float32}, **extra,
    )
    train = Dataset.from_dict(task_rows(seed, a.n_sums))
    trainer = trainer_cls(model=str(setup.path), reward_funcs=reward, args=config, train_dataset=train,
                          processing_class=setup.tok)
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def pid_policy(a: argparse.Namespace) -> dict[str, Any]:
    """The Actuator arm's policy: reverse-acting PID on log β (gains per unit of target, see the
    module docstring for the rule)."""
    sp = a.target
    controller: dict[str, Any] = {"name": "kl-beta", "probe": "policy_kl", "knob": "kl_beta", "setpoint": sp,
                                  "kp": a.kp / sp, "ki": a.ki / sp, "kd": 0.0, "direction": "reverse"}
    if getattr(a, "predict", 0):  # issue 40: act on y + H·Δy (H in probe intervals)
        controller["horizon"] = a.predict
    if getattr(a, "ramp", 0):  # issue 40: approach the target on a ramp of N probe intervals
        controller["setpoint_ramp"] = a.ramp
    return {
        "name": "bench-rl-kl",
        "probes": [{"name": "policy_kl", "every": a.probe_every}],
        "controllers": [controller],
        "guardrails": [{"name": "kl-cap", "probe": "policy_kl", "bound": "upper", "threshold": 10 * sp,
                        "action": "alert", "consecutive": 3}],
    }


def shipped_preset(name: str, setpoint: float, *, kp: float | None = None, ki: float | None = None,
                   horizon: float | None = None, alpha: float | None = None,
                   scale_guardrails: bool = True) -> dict[str, Any]:
    """A shipped preset's document (``actuator/presets/NAME.yaml``) as a benchmark arm runs it: its
    one controller's setpoint at ``setpoint``, the gains, horizon and EMA alpha given in place of the
    preset's (seed-0 tuning), the guardrails' thresholds scaled from the preset's setpoint to this
    one (``scale_guardrails``; else as shipped)."""
    import yaml

    from actuator.policy import _PRESETS

    doc = yaml.safe_load((_PRESETS / f"{name}.yaml").read_text())
    c = doc["controllers"][0]
    scale = setpoint / c["setpoint"] if scale_guardrails else 1.0
    c["setpoint"] = setpoint
    c.update({k: v for k, v in (("kp", kp), ("ki", ki), ("horizon", horizon)) if v is not None})
    if alpha is not None:
        c["filter"] = {"kind": "ema", "alpha": alpha}
    doc["name"] = f"bench-{name}"
    doc["guardrails"] = [{**g, "threshold": g["threshold"] * scale} for g in doc.get("guardrails", [])]
    return doc


def free_policy(a: argparse.Namespace) -> dict[str, Any]:
    """The free-signal arm's policy: ``preset:rl-kl-fast`` as shipped (PID on log β on ``train.kl``,
    relative gains, EMA, horizon), its setpoint at ``--free-setpoint`` (default ``--target``) and
    any ``--free-*`` gain given on the command line in place of the preset's."""
    return shipped_preset("rl-kl-fast", a.free_setpoint if a.free_setpoint is not None else a.target,
                          kp=a.free_kp, ki=a.free_ki, horizon=a.free_horizon, alpha=a.free_alpha)


def variant(controller: dict[str, Any] | None) -> str:
    """The PID arm's issue-40 variant from its controller (``harness.variant_label``)."""
    return variant_label([controller] if controller else [])


def run_arm(setup: Setup, kind: str, arm: dict[str, Any], a: argparse.Namespace, url: str, seed: int) -> dict[str, Any]:
    from actuator.agents.callback import ActuatorCallback
    from actuator.agents.knobs import LearningRateKnob
    from actuator.agents.probes import ProbeSuite
    from actuator.agents.trl_knobs import KLBetaKnob

    reward = TaskReward(a.length_cost)
    trainer = make_trainer(setup, kind, arm["kind"] + (f"-{arm['beta']:g}" if "beta" in arm else ""),
                           arm.get("beta", a.beta), reward, a, seed)
    knob = KLBetaKnob(trainer)
    probe = setup.kl_probe(a, seed)
    trace: list[dict[str, float]] = []
    cb = None
    suite = None
    bounds = {"kl_beta": {"min": a.beta * a.beta_bounds[0], "max": a.beta * a.beta_bounds[1], "max_step": a.max_step}}
    if arm["kind"] == "actuator":
        cb = ActuatorCallback(
            pid_policy(a), connection=url, probes=[probe], reporting={"budget_share": 1.0}, run=f"bench-{SCENARIO}-{kind}-{seed}",
            setters=[knob], knobs=bounds)
        cb.attach(trainer)
    else:
        suite = ProbeSuite([probe], budget_share=1.0)
    free = ActuatorCallback(free_policy(a), connection=url, reporting={"budget_share": 1.0}, setters=[knob],
                            knobs=bounds, run=f"bench-{SCENARIO}-free-{kind}-{seed}").attach(trainer) \
        if arm["kind"] == "free" else None
    logged: list[dict[str, float | None]] = []

    def on_log(step: int, logs: dict[str, Any]) -> None:  # the trainer's own kl / entropy, every step
        if "kl" in logs or "entropy" in logs:
            logged.append({"step": step, "train_kl": logs.get("kl"), "entropy": logs.get("entropy"),
                           "beta": knob.read()})
    baselines = KLBaselines(arm["kind"], a, samples_per_step=a.prompts * a.samples)

    def on_value(step: int, value: float, kw: dict[str, Any]) -> None:
        baselines.update(value, step, knob, kw["optimizer"], kw.get("lr_scheduler"))
        lr_knob = LearningRateKnob(kw["optimizer"], kw.get("lr_scheduler"))
        trace.append({"step": step, "policy_kl": value, "beta": knob.read(), "lr": lr_knob.read()})
        if not console.is_terminal:  # a log file gets one line per measurement
            last = reward.log[-1] if reward.log else {"reward": math.nan, "accuracy": math.nan}
            console.print(f"  {kind} {arm['name']} seed {seed} step {step}: policy_kl {value:.4f} "
                          f"beta {knob.read():.4g} reward {last['reward']:+.3f} acc {last['accuracy']:.2f}")

    with arm_progress(f"{kind} {arm['name']}", a.steps, 26) as advance:
        trainer.add_callback(kl_trace("policy_kl", knob, a.beta, trace, cb=cb, suite=suite, on_value=on_value,
                                      advance=advance, on_log=on_log))
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
    ppl = setup.perplexity(trainer.model)
    tail = reward.log[-a.tail:]
    r = {"arm": arm["name"], "kind": arm["kind"], "trainer": kind, "seed": seed, "start_beta": arm.get("beta", a.beta),
         "trace": trace, "rewards": reward.log, "final_beta": knob.read(), "final_perplexity": ppl,
         "reward": statistics.fmean(t["reward"] for t in tail), "accuracy": statistics.fmean(t["accuracy"] for t in tail),
         "length": statistics.fmean(t["length"] for t in tail), "seconds": seconds,
         "decisions": len(ctl.session.applied) if (ctl := cb or free) is not None else None, "train_log": logged,
         "probe_seconds": getattr(cb.session.suite if cb is not None else suite, "probe_seconds", None)}
    r.update(quality(trace, a))
    del trainer
    return r


def quality(trace: list[dict[str, float]], a: argparse.Namespace) -> dict[str, Any]:
    """Control quality on the raw probe trace, and (``*_ma3``) on its trailing 3-measurement mean:
    the probe's sampling noise alone puts single measurements outside a ±10 % band (sd ≈ 18 % of
    the target with 16 answers per measurement), so the smoothed figures say whether the *policy's*
    KL settled. The targets are judged on the raw ones."""
    q = control_quality([{"step": t["step"], "kl_drift": t["policy_kl"]} for t in trace], a.target, a.band)
    q["abs_error"] = abs(q["final_kl"] - a.target)
    q.update(smoothed_quality(trace, a))
    return q


def smoothed_quality(trace: list[dict[str, float]], a: argparse.Namespace) -> dict[str, Any]:
    """Settling step and overshoot of the trailing 3-measurement mean of the probe trace."""
    kl = [t["policy_kl"] for t in trace]
    smooth = [{"step": t["step"], "kl_drift": statistics.fmean(kl[max(0, i - 2): i + 1])} for i, t in enumerate(trace)]
    qs = control_quality(smooth, a.target, a.band)
    return {"settling_step_ma3": qs["settling_step"], "overshoot_pct_ma3": qs["overshoot_pct"]}


def early_stop(fixed: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """The fixed-β run at the starting β, stopped at the first measurement at or above the target."""
    trace = fixed["trace"]
    stop = next((i for i, t in enumerate(trace) if t["policy_kl"] >= a.target), len(trace) - 1)
    kept = trace[: stop + 1]
    step = kept[-1]["step"]
    log = [t for t in fixed["rewards"] if t["step"] <= step] or fixed["rewards"][:1]
    tail = log[-a.tail:]
    r = {"arm": "early stopping", "kind": "early_stop", "trainer": fixed["trainer"], "seed": fixed["seed"],
         "start_beta": fixed["start_beta"], "trace": kept, "rewards": log, "final_beta": fixed["start_beta"],
         "final_perplexity": None, "stopped_at": step,
         "reward": statistics.fmean(t["reward"] for t in tail), "accuracy": statistics.fmean(t["accuracy"] for t in tail),
         "length": statistics.fmean(t["length"] for t in tail), "seconds": None, "decisions": None}
    q = control_quality([{"step": t["step"], "kl_drift": t["policy_kl"]} for t in kept], a.target, a.band)
    q["final_kl"] = kept[-1]["policy_kl"]  # the model it stops with
    q["abs_error"] = abs(q["final_kl"] - a.target)
    r.update(q)
    return r


def plot(result: dict[str, Any], path: Path) -> None:
    target, band = result["target"], result["band"]
    trainers = sorted({r["trainer"] for r in result["arms"]})
    with figure(path, nrows=len(trainers)) as (fig, axes):
        for row, kind in zip(axes, trainers):
            ax1, ax2, ax3 = row
            for arm in (r for r in result["arms"] if r["trainer"] == kind and r["kind"] != "early_stop"):
                if len(result["seeds"]) > 1 and arm["seed"] != result["seeds"][0]:
                    continue  # one seed per panel keeps it readable; the table has all
                steps = [t["step"] for t in arm["trace"]]
                label = arm["arm"]
                line, = ax1.plot(steps, [t["policy_kl"] for t in arm["trace"]], marker=".", label=label)
                ax2.step(steps, [t["beta"] for t in arm["trace"]], where="post", color=line.get_color(), label=label)
                ax3.plot([t["step"] for t in arm["rewards"]], [t["reward"] for t in arm["rewards"]],
                         color=line.get_color(), alpha=0.8, label=label)
            ax1.axhline(target, ls="--", color="black", label="target")
            ax1.axhspan(target * (1 - band), target * (1 + band), color="grey", alpha=0.15)
            ax1.set_title(f"[{kind}] KL(policy ‖ start), held-out, exact per token (seed {result['seeds'][0]})")
            ax1.set_xlabel("step")
            ax1.legend(fontsize=7)
            ax2.set_yscale("log")
            ax2.set_title(f"[{kind}] beta in effect")
            ax2.set_xlabel("step")
            ax3.set_title(f"[{kind}] task reward (no KL penalty)")
            ax3.set_xlabel("step")
        fig.suptitle(f"rl-kl — SmolLM2-135M-Instruct, {result['steps']} steps, lr {result['lr']:g}, "
                     f"target {target}", fontsize=10)


def _arm_row(sel: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """One arm's runs on the seeds: mean ± sd of each figure (settling: a run that never settles
    counts the run's steps + 1). The smoothed figures are derived from the stored trace (also for
    files written before them)."""
    def settled_at(step: Any) -> Any:
        return step if step is not None else a.steps + 1

    settle = [settled_at(r["settling_step"]) for r in sel]
    settle3 = [settled_at(r.get("settling_step_ma3")) for r in sel if r["kind"] != "early_stop"]
    return {
        "settling_step_ma3": mean_sd(settle3), "settled_ma3": sum(r.get("settling_step_ma3") is not None for r in sel),
        "overshoot_pct_ma3": mean_sd([r.get("overshoot_pct_ma3") for r in sel]),
        "seeds": [r["seed"] for r in sel], "settling_step": mean_sd(settle),
        "settled": sum(r["settling_step"] is not None for r in sel),
        "overshoot_pct": mean_sd([r["overshoot_pct"] for r in sel]),
        "abs_error": mean_sd([r["abs_error"] for r in sel]), "final_kl": mean_sd([r["final_kl"] for r in sel]),
        "reward": mean_sd([r["reward"] for r in sel]), "accuracy": mean_sd([r["accuracy"] for r in sel]),
        "perplexity": mean_sd([r["final_perplexity"] for r in sel]),
    }


def _fixed_pick(rs: list[dict[str, Any]], fixed: list[str], seeds: list[int],
                a: argparse.Namespace) -> tuple[str | None, int]:
    """The fixed β closest to the target on the first seed (or ``--fixed-picked``, picked on seed 0
    of an earlier sweep), and the seed it was picked on."""
    pick_seed = seeds[0]
    on_pick_seed = [n for n in fixed if any(r["arm"] == n and r["seed"] == pick_seed for r in rs)]
    picked = min(on_pick_seed, key=lambda n: next(r["abs_error"] for r in rs if r["arm"] == n and r["seed"] == pick_seed),
                 default=None)
    if getattr(a, "fixed_picked", None) is not None:
        picked = f"fixed β {a.fixed_picked:g}"
        pick_seed = 0
        if picked not in fixed:
            raise SystemExit(f"--fixed-picked {a.fixed_picked:g}: no '{picked}' arm in the results")
    return picked, pick_seed


def summarise(results: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    """Per trainer: mean ± sd per arm over seeds; the fixed β picked on the first seed (closest
    final KL to the target) evaluated on the others, the best in hindsight; the targets."""
    seeds = sorted({r["seed"] for r in results})
    summary: dict[str, Any] = {}
    targets: dict[str, Any] = {}
    for r in results:  # derived from the stored trace (also for files written before these figures)
        if r["kind"] != "early_stop":
            r.update(smoothed_quality(r["trace"], a))
    for kind in sorted({r["trainer"] for r in results}):
        summary[kind] = _summarise_trainer(kind, [r for r in results if r["trainer"] == kind], seeds, a, targets)
    return {"summary": summary, "targets": targets}


def _summarise_trainer(kind: str, rs: list[dict[str, Any]], seeds: list[int], a: argparse.Namespace,
                       targets: dict[str, Any]) -> dict[str, Any]:
    """One trainer's rows, its fixed pick and hindsight; each PID arm's targets go to ``targets``."""
    arms = sorted({r["arm"] for r in rs}, key=lambda n: [x["arm"] for x in rs].index(n))
    table = {name: _arm_row([r for r in rs if r["arm"] == name], a) for name in arms}
    fixed = [n for n in arms if n.startswith("fixed")]
    picked, pick_seed = _fixed_pick(rs, fixed, seeds, a)
    hindsight = min(fixed, key=lambda n: table[n]["abs_error"][0], default=None)
    for pid_name in [n for n in arms if any(r["arm"] == n and r["kind"] == "actuator" for r in rs)]:
        key = kind if pid_name == "actuator PID" else f"{kind}: {pid_name}"  # the preset's law keeps its key
        judged_pid = pid_targets(pid_name, table, rs, fixed, picked, pick_seed, seeds, a.steps)
        if judged_pid is not None:
            targets[key] = judged_pid
    return {"arms": table, "fixed_picked_on_seed": pick_seed, "fixed_picked": picked,
            "fixed_best_in_hindsight": hindsight}


def _pid_per_seed(pid_runs: dict[int, dict[str, Any]], zie_runs: dict[int, dict[str, Any]] | None,
                  fixed_runs: dict[int, dict[str, Any]], later: list[int]) -> dict[str, dict[int, bool]]:
    """A PID arm's targets seed by seed (against Ziegler's run and the fixed pick's on that seed)."""
    per_seed = {
        "overshoot_at_most_15pct": {s: r["overshoot_pct"] <= 15.0 for s, r in pid_runs.items()},
        "abs_error_at_most_picked_fixed": {s: pid_runs[s]["abs_error"] <= fixed_runs[s]["abs_error"]
                                           for s in later if s in pid_runs and s in fixed_runs},
    }
    if zie_runs is not None:
        per_seed["settles_in_half_ziegler_steps"] = {
            s: settles_against_ziegler(r["settling_step"], zie_runs[s]["settling_step"])
            for s, r in pid_runs.items() if s in zie_runs}
    return per_seed


def pid_targets(name: str, table: dict[str, Any], rs: list[dict[str, Any]], fixed: list[str], picked: str | None,
                pick_seed: int, seeds: list[int], steps: int) -> dict[str, Any] | None:
    """One PID arm's targets against Ziegler and the fixed β picked on ``pick_seed`` (None without a
    fixed arm), on the means and under the 4-of-5 seeds rule (``harness.judged``). Settling: in at
    most half Ziegler's steps on that seed, or within the run where Ziegler never settles (issue 40)."""
    pid, zie = table[name], table.get("Ziegler adaptive KL")
    if not picked:  # without a fixed arm (a variant run) there is nothing to judge against
        return None
    later = [s for s in seeds if s != pick_seed] or seeds
    mine = {r["seed"] for r in rs if r["arm"] == name}

    def on(arm: str, key: str) -> list[float]:  # the judged seeds this PID arm ran (the means compare like with like)
        return [r[key] for r in rs if r["arm"] == arm and r["seed"] in later and r["seed"] in mine]

    def runs(arm: str) -> dict[int, dict[str, Any]]:
        return {r["seed"]: r for r in rs if r["arm"] == arm}

    closest = min(fixed, key=lambda n: table[n]["abs_error"][0])  # also the best in hindsight
    pid_runs, zie_runs, fixed_runs = runs(name), runs("Ziegler adaptive KL"), runs(picked)
    never = bool(zie_runs) and all(r["settling_step"] is None for r in zie_runs.values())
    out: dict[str, Any] = {
        "settles_in_half_ziegler_steps": ((pid["settling_step"][0] <= steps if never
                                           else pid["settling_step"][0] <= zie["settling_step"][0] / 2)
                                          if zie else None),
        "pid_settling_step": pid["settling_step"], "ziegler_settling_step": zie["settling_step"] if zie else None,
        "overshoot_at_most_15pct": pid["overshoot_pct"][0] <= 15.0, "pid_overshoot_pct": pid["overshoot_pct"],
        "abs_error_at_most_picked_fixed": mean_sd(on(name, "abs_error"))[0] <= mean_sd(on(picked, "abs_error"))[0],
        "pid_abs_error_later_seeds": mean_sd(on(name, "abs_error")),
        "picked_fixed_abs_error_later_seeds": mean_sd(on(picked, "abs_error")),
        "abs_error_at_most_hindsight_fixed": pid["abs_error"][0] <= table[closest]["abs_error"][0],
        # within one sd or above it: a law that ends with more reward than the fixed β has not paid for it
        "reward_within_one_sd_of_closest_fixed": pid["reward"][0] >= table[closest]["reward"][0]
        - max(table[closest]["reward"][1], 1e-9),
        "closest_fixed": closest, "pid_reward": pid["reward"], "closest_fixed_reward": table[closest]["reward"],
    }
    per_seed = _pid_per_seed(pid_runs, zie_runs if zie else None, fixed_runs, later)
    verdicts = {k: judged({"met": out[k]}, v) for k, v in per_seed.items()}
    out.update({k: v["met"] for k, v in verdicts.items()}, verdicts=verdicts)
    return out


def print_tables(results: list[dict[str, Any]], summary: dict[str, Any], a: argparse.Namespace) -> None:
    table = Table(title=f"{SCENARIO} — SmolLM2-135M-Instruct, {a.steps} steps, KL target {a.target} "
                        f"(±{a.band:.0%}), lr {a.lr:g}, per seed")
    for col in ("trainer", "arm", "seed", "settling", "overshoot %", "final KL", "|err|", "final β", "reward",
                "accuracy", "ppl", "decisions", "s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(r["trainer"], r["arm"], str(r["seed"]),
                      "-" if r["settling_step"] is None else str(r["settling_step"]), f"{r['overshoot_pct']:.0f}",
                      f"{r['final_kl']:.4f}", f"{r['abs_error']:.4f}", f"{r['final_beta']:.3g}", f"{r['reward']:+.3f}",
                      f"{r['accuracy']:.2f}", "-" if r["final_perplexity"] is None else f"{r['final_perplexity']:.2f}",
                      "-" if r["decisions"] is None else str(r["decisions"]),
                      "-" if r["seconds"] is None else f"{r['seconds']:.0f}")
    console.print(table)
    for kind, s in summary.items():
        t = Table(title=f"{SCENARIO} [{kind}] mean ± sd over seeds {sorted({r['seed'] for r in results})} "
                        f"(fixed β picked on seed {s['fixed_picked_on_seed']}: {s['fixed_picked']}; "
                        f"best in hindsight: {s['fixed_best_in_hindsight']})")
        for col in ("arm", "settling step", "settled", "overshoot %", "settled (3-mean)", "overshoot % (3-mean)",
                    "final KL", "|KL − target|", "reward", "accuracy", "perplexity"):
            t.add_column(col, justify="right")
        for name, v in s["arms"].items():
            def f(key: str, spec: str = ".3f", v: dict[str, Any] = v) -> str:
                m, sd = v[key]
                return "-" if m is None or (isinstance(m, float) and math.isnan(m)) else f"{m:{spec}} ± {sd:{spec}}"
            t.add_row(name, f("settling_step", ".1f"), f"{v['settled']}/{len(v['seeds'])}", f("overshoot_pct", ".0f"),
                      f"{f('settling_step_ma3', '.1f')} ({v['settled_ma3']}/{len(v['seeds'])})",
                      f("overshoot_pct_ma3", ".0f"), f("final_kl", ".4f"), f("abs_error", ".4f"), f("reward"), f("accuracy", ".2f"), f("perplexity", ".2f"))
        console.print(t)


def _with_variant(part: dict[str, Any]) -> list[dict[str, Any]]:
    """A file's runs, its PID arms named with the variant its policy records."""
    suffix = variant(part.get("pid"))
    return [{**r, "arm": r["arm"] + suffix} if r["kind"] == "actuator" and suffix and not r["arm"].endswith(suffix)
            else r for r in part["arms"]]


def _read(a: argparse.Namespace) -> tuple[list[Path], list[dict[str, Any]], dict[str, Any]]:
    """The per-seed files (of ``--tag``, else the untagged ones), every run in them (a PID arm named
    with the variant its file's policy records; early stopping derived from fixed arms at several
    betas: one row per beta) and the last file's settings."""
    results: list[dict[str, Any]] = []
    meta: dict[str, Any] = {}
    paths = (sorted(a.results.glob(f"{SCENARIO}-x-{a.tag}-*-seed*.json")) if a.tag else
             sorted(p for p in a.results.glob(f"{SCENARIO}-*-seed*.json") if f"{SCENARIO}-x-" not in p.name))
    for path in paths:
        part = json.loads(path.read_text())
        results.extend(_with_variant(part))
        meta = {k: v for k, v in part.items() if k != "arms"}
    stops = {r["start_beta"] for r in results if r["kind"] == "early_stop"}
    for r in results if len(stops) > 1 else []:
        if r["kind"] == "early_stop":
            r["arm"] = f"early stopping (β {r['start_beta']:g})"
    return paths, results, meta


def aggregate(a: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    paths, results, meta = _read(a)
    if not results:
        raise SystemExit(f"no {SCENARIO}-*-seed*.json in {a.results}: run the seeds first")
    ns = copy.copy(a)
    for key in ("steps", "target", "band", "lr"):
        setattr(ns, key, meta[key])
    s = summarise(results, ns)
    print_tables(results, s["summary"], ns)
    out = {**meta, "seeds": sorted({r["seed"] for r in results}), "arms": results, "summary": s["summary"],
           "command": command_line("rl_kl", argv), "parts": [p.name for p in paths]}
    out.pop("wall_seconds", None)
    record_targets(out, s["targets"])
    save_results(f"{SCENARIO}-x-{a.tag}" if a.tag else SCENARIO, out, plot, results=a.results)
    return out


def beta_or_word(*words: str) -> Callable[[str], float | str]:
    """An argparse type: a beta > 0, or one of ``words`` (argparse names the flag in its error)."""
    choices = " or ".join(repr(w) for w in words)

    def parse(text: str) -> float | str:
        if text in words:
            return text
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a number > 0 or {choices}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    """The scenario's flags (``parser().parse_args([])``: the defaults)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    scenario_args(ap, SCENARIO, steps=24, quick="12 steps, the Actuator arm and one fixed beta",
                  arms=["actuator", "free", "ziegler", "kl-adaptive-lr", "fixed"],
                  arms_default=["actuator", "ziegler", "fixed"],
                  arms_help="actuator = the PID on beta; free = preset:rl-kl-fast, the PID on the trainer's logged kl "
                            "(train.kl) every step; ziegler = Ziegler's adaptive KL; kl-adaptive-lr = TorchRL's "
                            "KLAdaptiveLR rule on the learning rate; fixed = the --betas sweep",
                  tag_help="a variant run: results go to rl-kl-x-TAG-<trainer>-seed<N>.json, which --aggregate "
                           "leaves out", aggregate="combine the per-seed result files")
    ap.add_argument("--trainer", nargs="+", choices=["rloo", "grpo"], default=["rloo"])
    ap.add_argument("--beta", type=beta_or_word("auto"), default=0.1,
                    help="starting beta of Ziegler, early stopping and the PID, or 'auto': the feedforward beta "
                    "from the starting model's reward variance and answer length (Setup.start_beta), per seed")
    ap.add_argument("--auto-samples", type=int, default=8, help="answers per training prompt for --beta auto")
    ap.add_argument("--beta-bounds", type=float, nargs=2, default=[1.0, 100.0], metavar=("LO", "HI"),
                    help="the PID's kl_beta bounds as multiples of the starting beta")
    ap.add_argument("--probe-prompts", type=int, default=8,
                    help=f"held-out prompts of the KL probe (2..{len(HELD_OUT)}; the first 8 are the original set)")
    ap.add_argument("--betas", type=float, nargs="+", default=[0.1, 0.5, 2.5], help="the fixed-beta sweep")
    ap.add_argument("--target", type=float, default=0.04, help="KL target, nats per token (policy_kl)")
    ap.add_argument("--band", type=float, default=0.10)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--prompts", type=int, default=4, help="prompts per step")
    ap.add_argument("--samples", type=int, default=4, help="completions per prompt (num_generations)")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--length-cost", type=float, default=0.02, help="reward per completion token (subtracted)")
    ap.add_argument("--n-sums", type=int, default=20, help="arithmetic prompts next to the factual ones")
    ap.add_argument("--probe-every", type=int, default=2)
    ap.add_argument("--probe-samples", type=int, default=2, help="sampled answers per held-out prompt")
    ap.add_argument("--horizon", type=float, default=None, help="Ziegler horizon in samples (default: one probe "
                    "interval's samples, so an update moves beta by up to the paper's ±20%%)")
    ap.add_argument("--kl-lr-factor", type=float, default=1.5,
                    help="kl-adaptive-lr arm: the factor (TorchRL's default 1.5)")
    ap.add_argument("--kl-lr-bounds", type=float, nargs=2, default=[0.01, 1.0], metavar=("LO", "HI"),
                    help="kl-adaptive-lr arm: min_lr and max_lr as multiples of --lr (default 0.01 1: never above the "
                         "configured rate)")
    ap.add_argument("--kp", type=float, default=1.0, help="PID kp in log-beta per relative KL error (× 1/target)")
    ap.add_argument("--ki", type=float, default=0.1, help="PID ki per step (× 1/target)")
    ap.add_argument("--max-step", type=float, default=1.0, help="rate limit, log-beta units per decision")
    ap.add_argument("--predict", type=float, default=0.0,
                    help="actuator arm: prediction horizon in probe intervals (the PID acts on y + H·Δy; 0: none)")
    ap.add_argument("--free-setpoint", type=float, default=None,
                    help="free arm: the train.kl setpoint (default --target)")
    ap.add_argument("--free-kp", type=float, default=None, help="free arm: kp in place of preset:rl-kl-fast's")
    ap.add_argument("--free-ki", type=float, default=None, help="free arm: ki per step in place of the preset's")
    ap.add_argument("--free-horizon", type=float, default=None, help="free arm: horizon in steps in place of the preset's")
    ap.add_argument("--free-alpha", type=float, default=None, help="free arm: EMA alpha in place of the preset's")
    ap.add_argument("--ramp", type=int, default=0,
                    help="actuator arm: setpoint ramp in probe intervals (0: none)")
    ap.add_argument("--early-stop-beta", type=beta_or_word("start", "none"), default="start",
                    help="the fixed arm early stopping is cut from: a beta of --betas, 'start' (the starting "
                    "--beta) or 'none' (no early-stopping row)")
    ap.add_argument("--tail", type=int, default=5, help="steps averaged for the reward at the end")
    ap.add_argument("--fixed-picked", type=float, default=None,
                    help="with --aggregate: the fixed beta picked on seed 0 by an earlier sweep (when the sweep is "
                    "not among the files), compared with the PID on the other seeds")
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser()
    a = ap.parse_args(argv)
    check(ap, a)
    if a.aggregate:
        return aggregate(a, argv)
    if a.quick:
        a.steps = min(a.steps, 12)
        a.betas = [a.beta] if a.beta != "auto" else []
        a.arms = [x for x in a.arms if x != "ziegler"]
    if a.horizon is None:
        a.horizon = float(a.probe_every * a.prompts * a.samples)
    url = start(a)
    setup = Setup(a)
    base_ppl = setup.perplexity(setup.ref)
    console.print(f"start: general-text perplexity {base_ppl:.2f}; KL target {a.target} nats/token, lr {a.lr:g}, "
                  f"{a.prompts}×{a.samples} completions/step, Ziegler horizon {a.horizon:g} samples")
    out: dict[str, Any] = {}
    for kind in a.trainer:
        for seed in a.seeds:
            t_start = time.time()
            results = []
            sa = seed_args(a, setup, seed, kind)
            for arm_kind in a.arms:
                for arm in arms_of(arm_kind, sa):
                    r = run_arm(setup, kind, arm, sa, url, seed)
                    r["perplexity_increase_pct"] = 100 * (r["final_perplexity"] / base_ppl - 1)
                    results.append(r)
                    out = save_seed(kind, seed, results, sa, argv, base_ppl, t_start)  # each arm as it ends
    return out


def check(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The flags that depend on each other (argparse's error names the flag)."""
    if a.auto_samples < 2:
        ap.error("--auto-samples must be >= 2 (a variance needs two answers per prompt)")
    if not 0 < a.beta_bounds[0] <= 1 <= a.beta_bounds[1]:
        ap.error("--beta-bounds LO HI must satisfy 0 < LO <= 1 <= HI")
    if isinstance(a.early_stop_beta, float) and "fixed" in a.arms and a.early_stop_beta not in a.betas:
        ap.error(f"--early-stop-beta {a.early_stop_beta:g} is not among --betas {a.betas}: no fixed arm to cut it from")


def seed_args(a: argparse.Namespace, setup: Any, seed: int, kind: str) -> argparse.Namespace:
    """The arguments of one seed: with ``--beta auto``, the feedforward beta from the starting
    model's samples on that seed."""
    sa = copy.copy(a)
    if a.beta == "auto":
        with console.status(f"seed {seed}: feedforward beta from the starting model's samples…"):
            sa.feedforward = setup.start_beta(a, seed, kind)
        sa.beta = sa.feedforward["beta"]
        console.print(f"seed {seed}: feedforward beta {sa.beta:.4g} (reward variance "
                      f"{sa.feedforward['reward_variance']:.4f}, mean answer length "
                      f"{sa.feedforward['mean_length']:.1f} tokens, {sa.feedforward['prompts']} prompts)")
    return sa


def arms_of(arm_kind: str, sa: argparse.Namespace) -> list[dict[str, Any]]:
    """The arms of one ``--arms`` kind (fixed: one per ``--betas``)."""
    if arm_kind == "fixed":
        return [{"name": f"fixed β {b:g}", "kind": "fixed", "beta": b} for b in sa.betas]
    names = {"ziegler": "Ziegler adaptive KL", "actuator": "actuator PID" + variant(pid_policy(sa)["controllers"][0]),
             "kl-adaptive-lr": "TorchRL KLAdaptiveLR", "free": FREE}
    return [{"name": names[arm_kind], "kind": arm_kind}]


def save_seed(kind: str, seed: int, results: list[dict[str, Any]], a: argparse.Namespace, argv: list[str] | None,
              base_ppl: float, t_start: float) -> dict[str, Any]:
    """Write the seed's result file with the arms so far (plus early stopping once the fixed arm at
    the starting beta is in), so a stopped run keeps what it measured."""
    arms = list(results)
    stop_beta = a.beta if a.early_stop_beta == "start" else a.early_stop_beta
    start_fixed = next((r for r in arms if r["kind"] == "fixed" and r["start_beta"] == stop_beta), None)
    if start_fixed is not None:
        arms.append(early_stop(start_fixed, a))
    s = summarise(arms, a)
    print_tables(arms, s["summary"], a)
    out = {"scenario": SCENARIO, "trainer": kind, "steps": a.steps, "seeds": [seed], "target": a.target,
           "band": a.band, "lr": a.lr, "prompts": a.prompts, "samples": a.samples,
           "max_new_tokens": a.max_new_tokens, "length_cost": a.length_cost, "probe_every": a.probe_every,
           "ziegler_horizon": a.horizon, "start_beta": a.beta, "betas": a.betas,
           "feedforward": getattr(a, "feedforward", None), "probe_prompts": a.probe_prompts,
           "probe_samples": a.probe_samples, "beta_bounds": a.beta_bounds,
           "pid": pid_policy(a)["controllers"][0], "max_step": a.max_step,
           "kl_adaptive_lr": vars(kl_adaptive_lr(a)) if "kl-adaptive-lr" in a.arms else None,
           "kl_beta_bounds": [a.beta * a.beta_bounds[0], a.beta * a.beta_bounds[1]], "start_perplexity": base_ppl, "arms": arms,
           "command": command_line("rl_kl", argv), "wall_seconds": time.time() - t_start}
    name = f"{SCENARIO}-x-{a.tag}-{kind}-seed{seed}" if a.tag else f"{SCENARIO}-{kind}-seed{seed}"
    save_results(name if not a.quick else f"{SCENARIO}-quick", out, plot, results=a.results)
    return out


if __name__ == "__main__":
    main()
