"""rl-entropy: GRPO (TRL ``GRPOTrainer``) of the real SmolLM2-135M-Instruct, holding the policy's
per-token entropy at a target by moving the entropy bonus ``entropy_coef`` (``preset:rl-entropy``).

Task, reward, model and trainer are rl-kl's (``benchmarks/control/rl_kl.py``: short factual and
arithmetic questions, +1 for the gold answer minus ``--length-cost`` per token, 4 prompts × 4
completions of 16 tokens a step, lr 3e-5, β 0.04). The reward pulls towards short exact answers
and the policy's entropy collapses within the run: the open loop (no bonus) goes from ~1.7 nats at
the start to ~0.8 by step 30 (issue 55's table). The signal is the entropy TRL logs at every
optimizer step (``train.entropy``: the mean per-token entropy of the step's own completions): no
probe run, the same figure in every arm.

Arms (one process per seed runs them one after another, same data and seed):
- ``no bonus``: the open loop (``entropy_coef`` 0);
- ``fixed coef C``: a constant bonus, a sweep; the one nearest the target on seed 0 is the pick;
- ``TRL adaptive entropy``: TRL's own law (``use_adaptive_entropy=True``, Skywork-OR1): the
  coefficient moves by ``entropy_coef_delta`` (0.005, TRL's default) a step, up while the entropy is
  at or below ``entropy_target`` (the same target), down above it, and applies only at or below it;
- ``actuator preset:rl-entropy``: the preset through the real controller service
  (``ActuatorCallback`` + ``EntropyCoefKnob``), its setpoint at the target, gains from the preset
  unless ``--kp``/``--ki``/``--horizon``/``--alpha``/``--release``/``--ctl-step`` are given (seed-0
  tuning only).

Measures per arm and seed (all from the logged entropy, the controlled signal):
- ``entropy_mae``: mean |entropy − target| over the second half of the steps;
- ``steps_below``: steps whose entropy is under the target; ``overshoot_pct``: how far under the
  target (% of it) the entropy went once it had reached it (the entropy falls onto the target, so
  past it is below); ``settling_step``: the first step from which every step stays within
  ±``--band`` of the target (None: never);
- ``reward``: the task reward, mean over the second half;
- answer diversity at the end, on held-out questions never trained on (``--k`` answers each at
  T = 1): ``distinct`` (distinct answers per question), ``pass1`` and ``passk``.

    python -m benchmarks.control.rl_entropy --seeds 0 [--arms ...] [--tag -x]   # one per-seed file
    python -m benchmarks.control.rl_entropy --quick                            # 8 steps, 2 arms
    python -m benchmarks.control.rl_entropy --aggregate [--tag -x]
    python -m benchmarks.control.validate rl-entropy --tags seed --judged-on 1 2 3 4
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.control import contract
from benchmarks.control.contract import Arm, ArmResult, Declared, Metric, Pick
from benchmarks.control.data import prompt_text
from benchmarks.control.harness import add_flags, console, start
from benchmarks.control.rl_kl import HELD_OUT, Setup, TaskReward, is_correct, make_trainer, shipped_preset

SCENARIO = "rl-entropy"
OPEN = "no bonus"
TRL = "TRL adaptive entropy"
PRESET = "actuator preset:rl-entropy"
COEFS = (0.03, 0.1, 0.3)
FIXED = tuple(f"fixed coef {c:g}" for c in COEFS)
HELD_OUT_GOLD = ("honey", "lion", "green", "Rome", "21", "42", "2|two", "cold")  # HELD_OUT[:8], in order


def _fixed_coef(name: str) -> float:
    return float(name.split()[-1])


SPEC = Declared(
    name=SCENARIO,
    task="GRPO of SmolLM2-135M-Instruct on rl-kl's task, 30 steps; the entropy bonus holds the per-token "
         "entropy (train.entropy) at a target",
    arm_list=[Arm(OPEN, "open", {"entropy_coef": 0.0}),
              *(Arm(n, "fixed", {"entropy_coef": _fixed_coef(n)}) for n in FIXED),
              Arm(TRL, "trl-adaptive"), Arm(PRESET, "actuator")],
    quick=(OPEN, PRESET),
    metrics=[Metric("entropy_mae", "min", "nats", target=0.5, relative_to=TRL, judge=(PRESET,),
                    label="|entropy - target| over the second half at most half TRL's adaptive law's"),
             Metric("reward", "max", "reward"), Metric("steps_below", "min", "steps"),
             Metric("overshoot_pct", "min", "%"), Metric("final_entropy", "max", "nats"),
             Metric("distinct", "max", "answers"), Metric("pass1", "max"), Metric("passk", "max")],
    picks=[Pick("fixed coef", "entropy_mae", FIXED)], plots=("entropy", "entropy_coef", "reward"))


def held_out() -> list[tuple[str, str]]:
    """The diversity questions: rl-kl's first 8 held-out questions (never trained on) with gold."""
    return list(zip(HELD_OUT[: len(HELD_OUT_GOLD)], HELD_OUT_GOLD, strict=True))


# -- the figures ---------------------------------------------------------------------------------
def control_figures(trace: Sequence[dict[str, Any]], target: float, band: float) -> dict[str, Any]:
    """``entropy_mae`` (second half), ``steps_below``, ``overshoot_pct``, ``settling_step``,
    ``final_entropy`` (mean of the last 5 steps) of a trace of logged entropies (one a step)."""
    h = [t["entropy"] for t in trace]
    half = h[len(h) // 2:]
    first = next((i for i, v in enumerate(h) if v <= target), None)
    past = h[first:] if first is not None else []
    inside = [abs(v - target) <= band * target for v in h]
    settle = next((i for i in range(len(h)) if all(inside[i:])), None)
    return {"entropy_mae": statistics.fmean(abs(v - target) for v in half) if half else math.nan,
            "steps_below": sum(v < target for v in h),
            "overshoot_pct": 100 * max(0.0, (target - min(past)) / target) if past else 0.0,
            "settling_step": trace[settle]["step"] if settle is not None else None,
            "final_entropy": statistics.fmean(h[-5:]) if h else math.nan}


def diversity(model: Any, tok: Any, k: int, seed: int, max_new_tokens: int) -> dict[str, float]:
    """``k`` answers (T = 1) to each held-out question: distinct answers per question (stripped,
    lower-cased), pass@1 (share correct) and pass@k (share of questions with one correct)."""
    import torch

    was = model.training
    model.eval()
    distinct, hits, anyhit = [], [], []
    torch.manual_seed(20_000 + seed)
    try:
        for q, gold in held_out():
            enc = tok(prompt_text(q), return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                     max_new_tokens=max_new_tokens, num_return_sequences=k,
                                     pad_token_id=tok.pad_token_id or tok.eos_token_id)
            answers = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            ok = [is_correct(x, gold) for x in answers]
            distinct.append(len({" ".join(x.lower().split()) for x in answers}))
            hits.append(statistics.fmean(ok))
            anyhit.append(float(any(ok)))
    finally:
        model.train(was)
    return {"distinct": statistics.fmean(distinct), "pass1": statistics.fmean(hits), "passk": statistics.fmean(anyhit)}


# -- one arm -------------------------------------------------------------------------------------
def preset_policy(a: argparse.Namespace) -> dict[str, Any]:
    """``preset:rl-entropy`` as shipped, its setpoint at ``--target``; ``--kp``/``--ki``/
    ``--horizon``/``--alpha``/``--release`` and ``--ctl-step`` (the controller's ``max_step``)
    replace the preset's (seed-0 tuning)."""
    doc = shipped_preset(SCENARIO, a.target, kp=a.kp, ki=a.ki, horizon=a.horizon, alpha=a.alpha,
                         scale_guardrails=False)  # the collapse floor is absolute
    c = doc["controllers"][0]
    c.update({k: v for k, v in (("release", a.release), ("max_step", a.ctl_step)) if v is not None})
    return doc


def trainer_config(arm: Arm, a: argparse.Namespace) -> dict[str, Any]:
    """The GRPOConfig fields of the arm's entropy term."""
    if arm.kind == "trl-adaptive":
        return {"use_adaptive_entropy": True, "entropy_target": a.target, "entropy_coef": 0.0,
                "entropy_coef_delta": a.trl_delta}
    if arm.kind == "actuator":
        return {"entropy_coef": a.start_coef}
    return {"entropy_coef": float(arm.params["entropy_coef"])}


class Run:
    """The scenario's shared parts for a process: the model, the controller service, the flags."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.url = start(a)
        self.setup = Setup(a)

    def __call__(self, seed: int, arm: Arm) -> ArmResult:
        from transformers import TrainerCallback

        from actuator.agents.callback import ActuatorCallback
        from actuator.agents.trl_knobs import EntropyCoefKnob

        a = self.a
        reward = TaskReward(a.length_cost)
        trainer = make_trainer(self.setup, "grpo", f"{arm.kind}-{seed}", a.beta, reward, a, seed,
                               **trainer_config(arm, a))
        cb = None
        if arm.kind == "actuator":
            cb = ActuatorCallback(preset_policy(a), connection=self.url, setters=[EntropyCoefKnob(trainer)],
                                  knobs={"entropy_coef": {"min": 0.0, "max": a.coef_max, "max_step": a.coef_step}},
                                  run=f"bench-{SCENARIO}-{seed}").attach(trainer)
        trace: list[dict[str, Any]] = []

        class Log(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
                if logs and "entropy" in logs:
                    trace.append({"step": state.global_step, "entropy": logs["entropy"], "reward": logs.get("reward"),
                                  "kl": logs.get("kl"), "entropy_coef": float(trainer.entropy_coef)})
                    if not console.is_terminal:
                        console.print(f"  {arm.name} seed {seed} step {state.global_step}: entropy "
                                      f"{logs['entropy']:.3f} coef {trainer.entropy_coef:.4g} reward "
                                      f"{logs.get('reward', math.nan):+.3f}")

        trainer.add_callback(Log())
        t0 = time.time()
        trainer.train()
        seconds = time.time() - t0
        metrics: dict[str, Any] = control_figures(trace, a.target, a.band)
        half = reward.log[len(reward.log) // 2:]
        metrics["reward"] = statistics.fmean(t["reward"] for t in half)
        metrics.update(diversity(trainer.model, self.setup.tok, a.k, seed, a.max_new_tokens))
        record = {"target": a.target, "band": a.band, "steps": a.steps, "lr": a.lr, "beta": a.beta,
                  "config": trainer_config(arm, a), "policy": preset_policy(a) if cb is not None else None,
                  "decisions": len(cb.session.applied) if cb is not None else None, "seconds": seconds,
                  "final_coef": float(trainer.entropy_coef), "rewards": reward.log}
        return ArmResult(arm.name, arm.kind, seed, metrics, trace, record)


# -- the command line ----------------------------------------------------------------------------
FLAGS: dict[str, tuple[Any, str]] = {
    "--target": (1.3, "entropy target, nats per token (train.entropy)"),
    "--band": (0.10, "settling band, a share of the target"),
    "--lr": (3e-5, "learning rate (constant)"),
    "--beta": (0.04, "GRPO's KL coefficient (fixed in every arm)"),
    "--prompts": (4, "prompts per step"),
    "--samples": (4, "completions per prompt (num_generations)"),
    "--max-new-tokens": (16, "completion length"),
    "--length-cost": (0.02, "reward per completion token (subtracted)"),
    "--n-sums": (20, "arithmetic prompts beside the factual ones"),
    "--k": (8, "answers per held-out question for the diversity figures"),
    "--trl-delta": (0.005, "TRL adaptive arm: entropy_coef_delta (TRL's default)"),
    "--start-coef": (1e-4, "preset arm: the starting entropy_coef (TRL computes the term only from a non-zero start)"),
    "--coef-max": (0.1, "preset arm: the entropy_coef ceiling"),
    "--coef-step": (0.01, "preset arm: the entropy_coef rate limit per decision"),
    "--probe-prompts": (8, "(rl-kl's Setup: unused here)"),
}


def parser() -> argparse.ArgumentParser:
    """The scenario's own flags; the contract's (--seeds, --quick, --arms, --tag, --results,
    --aggregate) are parsed by :func:`benchmarks.control.contract.main`."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 add_help=False)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: by machine load)")
    ap.add_argument("--out", default=None, help="scratch: the saved model, trainer dirs, the service's SQLite")
    add_flags(ap, FLAGS)
    for name in ("kp", "ki", "horizon", "alpha", "release"):
        ap.add_argument(f"--{name}", type=float, default=None, help=f"preset arm: {name} in place of the preset's")
    ap.add_argument("--ctl-step", type=float, default=None,
                    help="preset arm: the controller's own max_step (default: the knob's, --coef-step); with "
                         "--release, a larger --coef-step lets the release fall faster than the law moves")
    return ap


def _quick(a: argparse.Namespace) -> None:
    a.steps = min(a.steps, 8)


def main(argv: list[str] | None = None) -> contract.Validation:
    return contract.scenario_main(SPEC, parser(), Run, argv, quick=_quick)


if __name__ == "__main__":
    main()
