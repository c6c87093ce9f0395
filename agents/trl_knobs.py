"""``kl_beta``: the KL coefficient of TRL's preference and RL trainers, changed mid-run.

    trainer = GRPOTrainer(model=model, args=GRPOConfig(beta=0.5, ...), ...)
    ActuatorCallback("preset:rl-kl", setters=[KLBetaKnob(trainer)], knobs={"kl_beta": {}},
                     probes=[PolicyKL(prompts, tok)]).attach(trainer)

(On DPO, beta cannot hold KL — ``preset:dpo-kl`` turns the learning rate and a KL anchor instead.)

Facts this module relies on (checked against the installed trl 1.16.0, ``trl/trainer/``):

* ``DPOTrainer.__init__`` copies ``self.beta = args.beta`` (dpo_trainer.py:801) and
  ``_compute_loss`` reads ``self.beta`` at every loss computation (the sigmoid loss
  ``-logsigmoid(self.beta * delta_score)``, dpo_trainer.py:1388, and every other loss type but
  ``sft``; the logged ``rewards/*`` are ``self.beta * logratios``, dpo_trainer.py:1582).
* ``GRPOTrainer`` copies ``self.beta = args.beta`` (grpo_trainer.py:983). With ``beta == 0``
  and no PEFT model it loads **no reference model** (``self.ref_model = None``,
  grpo_trainer.py:984-986), and generation computes reference log-probs only when
  ``self.beta != 0`` (grpo_trainer.py:2710); the loss adds ``self.beta * per_token_kl``
  (grpo_trainer.py:3098-3150). With PEFT and ``beta == 0`` the ``"ref"`` adapter copy of a
  pre-existing adapter is not made either (grpo_trainer.py:478), so the reference would silently
  become the bare base model.
* ``RLOOTrainer`` copies ``self.beta = args.beta`` (rloo_trainer.py:669), the same
  reference-model rule (rloo_trainer.py:670-689), and applies ``beta`` when it *generates*: the
  KL penalty is folded into the rewards (``rewards - self.beta * kl``, rloo_trainer.py:1664-1673).
  A new beta therefore takes effect from the next generation batch (every optimizer step with
  the defaults ``steps_per_generation = gradient_accumulation_steps``, ``num_iterations = 1``).
* Liger: trl 1.16 builds no Liger loss object. ``use_liger_kernel`` only patches the model's
  layers and refuses ``fused_linear_cross_entropy`` (dpo_trainer.py:939-952,
  grpo_trainer.py:1051-1064, rloo_trainer.py:699-712). Older TRL releases built fused Liger
  losses (``use_liger_loss``) that capture beta at init; a generic check refuses any such object.
* There is no PPO trainer in trl 1.16 (neither ``trl/trainer/`` nor ``trl/experimental/``), so
  there is no PPO KL coefficient to steer; other trainers with a ``beta`` attribute mean other
  things (GKD/distillation: a JSD interpolation, see ``actuator.agents.distill.GKDBetaKnob``;
  ORPO: the odds-ratio weight; OnlineDPO: a read-only property) and are refused.

So the knob writes the trainer attribute (never ``args``, which the trainers read only at init)
and refuses, with what/why/what-to-do, every case where the write would be silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .knobs import KnobNotSupported, knob_setter

__all__ = ["KLBetaKnob", "EntropyCoefKnob", "VERIFIED_TRAINERS", "feedforward_kl_beta", "KL_BETA_START"]

# Where preset:rl-kl starts beta when no feedforward start was computed (the same number in the
# preset, the README and the error below). Feedforward starts measured on SmolLM2 for 0.04-0.05
# targets: GRPO 0.75-0.78, RLOO 0.28-0.31 (BENCHMARKS.md "rl-kl"); 0.5 is within x2 of both (one
# decision's reach at the default rate limit) and the beta above which RLOO's KL stopped answering.
KL_BETA_START = 0.5

# The trainers whose loss reads `trainer.beta` as a KL coefficient at every step (trl 1.16).
VERIFIED_TRAINERS = ("DPOTrainer", "GRPOTrainer", "RLOOTrainer")

# Trainers whose `beta` means something else, and what to use instead.
_OTHER_MEANING = {
    "GKDTrainer": "its beta is the generalized-JSD interpolation, not a KL penalty: use "
                  "actuator.agents.distill.GKDBetaKnob (knob 'gkd_beta')",
    "GOLDTrainer": "its beta is the generalized-JSD interpolation: use actuator.agents.distill.GKDBetaKnob",
    "IWOPDTrainer": "its beta is the generalized-JSD interpolation: use actuator.agents.distill.GKDBetaKnob",
    "DistillationTrainer": "its beta is the generalized-JSD interpolation: use actuator.agents.distill.GKDBetaKnob",
    "ORPOTrainer": "its beta is the odds-ratio loss weight (lambda in the ORPO paper), not a KL coefficient",
    "OnlineDPOTrainer": "its beta is a read-only property computed from args.beta (a per-epoch list) at "
                        "every step, so setting the attribute fails",
}


def _verified_kind(trainer: Any) -> str | None:
    """The verified TRL trainer class ``trainer`` is (or subclasses), else None."""
    try:
        from trl import DPOTrainer, GRPOTrainer, RLOOTrainer
    except ImportError:  # no TRL: the trainer cannot be one of them
        return None
    for cls in (DPOTrainer, GRPOTrainer, RLOOTrainer):
        if isinstance(trainer, cls):
            return cls.__name__
    return None


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel) or isinstance(getattr(model, "module", None), PeftModel)


def _liger_losses(trainer: Any) -> list[str]:
    """Attributes holding a Liger fused loss (which captures beta in its constructor)."""
    found = []
    for attr, value in vars(trainer).items():
        module = type(value).__module__ or ""
        if module.startswith("liger_kernel") and "loss" in type(value).__name__.lower():
            found.append(f"trainer.{attr} ({type(value).__name__})")
    args = getattr(trainer, "args", None)
    if getattr(args, "use_liger_loss", False):
        found.append("args.use_liger_loss=True")
    return found


class KLBetaKnob:
    """``kl_beta`` (log scale): ``trainer.beta`` of a TRL ``DPOTrainer``, ``GRPOTrainer`` or
    ``RLOOTrainer``, the attribute their loss (RLOO: their reward shaping) reads every step.

    ``read()`` returns ``trainer.beta``; ``apply(v)`` sets it (``v`` finite and > 0, else
    ``ValueError``) and returns ``read()``. DPO and GRPO use the new value from the next loss
    computation; RLOO from the next generation batch.

    Raises :class:`~actuator.agents.knobs.KnobNotSupported` at construction when a change would
    be silently ignored or break the run:

    * the trainer has no ``beta`` attribute, or is not one of the verified TRL trainers (this
      includes any PPO trainer: trl 1.16 ships none);
    * GRPO / RLOO started with ``beta == 0``: no reference model was loaded (non-PEFT), or the
      PEFT reference adapter was not set up, and generations carry no reference log-probs;
    * a Liger fused loss object that fixed beta at init (none exists in trl 1.16; the check is
      defensive, for custom subclasses and older TRL);
    * DPO whose loss types do not use beta (``loss_type=["sft"]``) or ``beta <= 0``.
    """

    name = "kl_beta"

    def __init__(self, trainer: Any) -> None:
        cls = type(trainer).__name__
        if not hasattr(trainer, "beta"):
            raise KnobNotSupported(
                f"kl_beta: {cls} has no `beta` attribute, so there is no KL coefficient to steer. "
                f"kl_beta works with TRL's {', '.join(VERIFIED_TRAINERS)} (set beta in their config); "
                "for SFT steer `learning_rate`, for distillation use actuator.agents.distill knobs."
            )
        kind = _verified_kind(trainer)
        if kind is None:
            why = _OTHER_MEANING.get(cls)
            if why is None and "PPO" in cls.upper():
                why = ("trl 1.16 ships no PPO trainer (none in trl.trainer or trl.experimental), so its KL "
                       "coefficient has not been verified")
            raise KnobNotSupported(
                f"kl_beta: {cls}.beta is not verified to be a KL coefficient its loss reads at every step"
                f"{' (' + why + ')' if why else ''}. Verified trainers: {', '.join(VERIFIED_TRAINERS)}. "
                "For another trainer, write a KnobSetter (actuator.agents.knobs) that sets the attribute its "
                "loss reads, after checking that in its source."
            )
        liger = _liger_losses(trainer)
        if liger:
            raise KnobNotSupported(
                f"kl_beta: {cls} computes its loss with a Liger fused loss ({', '.join(liger)}), which copies "
                "beta when it is built and never reads trainer.beta again, so a change would be ignored. "
                "Disable the fused Liger loss (use_liger_loss=False) to steer beta mid-run."
            )
        beta = float(trainer.beta)
        if kind in ("GRPOTrainer", "RLOOTrainer") and beta == 0.0:
            if getattr(trainer, "ref_model", None) is None and not _is_peft(getattr(trainer, "model", None)):
                reason = ("so TRL loaded no reference model (trainer.ref_model is None) and never computes "
                          "reference log-probs: a beta > 0 set later would have nothing to measure KL against")
            else:
                reason = ("so TRL skipped the reference setup (the 'ref' adapter copy of a pre-trained adapter) "
                          "and generations carry no reference log-probs")
            raise KnobNotSupported(
                f"kl_beta: {kind} was started with beta=0.0, {reason}. Start it at beta={KL_BETA_START} "
                f"({kind.replace('Trainer', 'Config')}(beta={KL_BETA_START}), --beta {KL_BETA_START} on TRL's scripts; "
                "or at actuator.agents.trl_knobs.feedforward_kl_beta(...)) and let the controller move it from there "
                "(kl_beta is a log-scale knob: it cannot leave 0 anyway)."
            )
        if kind == "DPOTrainer":
            loss_types = set(getattr(trainer, "loss_types", None) or [])
            if loss_types and loss_types <= {"sft"}:
                raise KnobNotSupported(
                    "kl_beta: this DPOTrainer's loss_type is only 'sft', which does not use beta; "
                    "add a preference loss (e.g. loss_type=['sigmoid', 'sft']) or steer learning_rate instead."
                )
            if not beta > 0:
                raise KnobNotSupported(
                    f"kl_beta: DPOTrainer beta is {beta}; DPO needs beta > 0. Set DPOConfig(beta=0.1) or similar."
                )
        self.trainer = trainer
        self.kind = kind

    def read(self) -> float:
        return float(self.trainer.beta)

    def apply(self, value: float) -> float:
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"kl_beta must be finite and > 0 (a log-scale knob), got {value}")
        self.trainer.beta = value
        return self.read()


@knob_setter("kl_beta", hint="actuator.agents.trl_knobs.KLBetaKnob(trainer)")
def _kl_beta(*, trainer: Any, **_: Any) -> KLBetaKnob:
    return KLBetaKnob(trainer)


def feedforward_kl_beta(model: Any, tokenizer: Any, prompts: Sequence[str], reward_func: Callable[..., Any],
                        target: float, *, samples: int = 8, max_new_tokens: int = 24, batch_size: int = 8,
                        seed: int = 0, columns: Mapping[str, Sequence[Any]] | None = None,
                        scale_rewards: str | bool = "none") -> Any:
    """Where to start ``kl_beta``: the β at which the KL-regularised optimum sits at ``target``
    nats per token of ``policy_kl``, from the starting model alone.

    ``scale_rewards`` says what β is weighed against in the trainer's loss. RLOO penalises the
    raw reward (``r − β·KL``): leave it at ``"none"``. GRPO adds ``β·KL`` to a loss on the
    *normalised* advantage: pass its config's ``scale_rewards`` (``"group"`` by default; TRL's
    older booleans are read as ``True`` → ``"group"``, ``False`` → ``"none"``), and the variance is
    taken of the advantages as GRPO computes them (``actuator.controllers.feedforward``). It is the
    optimum's KL, which a short run at a small learning rate does not reach: a start, for the PID to
    trim (on the rl-kl benchmark RLOO's β₀ was 0.28–0.31 where the sweep's best was 0.5).

    The model samples ``samples`` answers (temperature 1, no top-k/top-p, at most
    ``max_new_tokens``, cut after the first end-of-turn token) to each of ``prompts`` (text already
    in the model's prompt format, as the trainer's ``prompt`` column); ``reward_func`` scores them
    with TRL's reward-function signature (``prompts=, completions=, completion_ids=`` and the
    dataset's other ``columns`` by name); :func:`actuator.controllers.kl_coefficient_for_target`
    turns the within-prompt reward variance and the mean answer length into
    ``β₀ = sqrt(Var[r] / (2·target·L))``. Returns its :class:`~actuator.controllers.KLStart`.

    Start the trainer at ``β₀`` (``RLOOConfig(beta=β₀)``, ``GRPOConfig(beta=β₀)``) and let the PID on log β trim it:
    feedforward puts the knob near its operating point before the first measurement, so the KL
    does not overshoot while feedback is still getting there (BENCHMARKS.md, rl-kl). It runs no
    training step and leaves the global RNG as it found it. Raises ``ValueError`` naming the
    field for bad arguments, and :class:`~actuator.controllers.ParameterError` when the reward
    never varies within a prompt (β then has no optimum to move).
    """
    import torch
    from transformers import GenerationConfig

    from actuator.controllers import kl_coefficient_for_target
    from actuator.controllers.feedforward import SCALES

    from .probes._common import encode, eos_token_ids, model_device, pad_batch, pad_token_id

    if samples < 2:
        raise ValueError(f"samples: need at least 2 answers per prompt for a variance, got {samples}")
    scale = ("group" if scale_rewards else "none") if isinstance(scale_rewards, bool) else scale_rewards
    if scale not in SCALES:
        raise ValueError(f"scale_rewards: must be 'none', 'group' or 'batch' (GRPOConfig's), got {scale_rewards!r}")
    if max_new_tokens < 1 or batch_size < 1:
        raise ValueError("max_new_tokens and batch_size must be >= 1")
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ValueError("prompts: need a non-empty list of non-empty strings")
    columns = dict(columns or {})
    for key, values in columns.items():
        if len(values) != len(prompts):
            raise ValueError(f"columns.{key}: {len(values)} values for {len(prompts)} prompts")
    eos = eos_token_ids(model, tokenizer)
    pad = pad_token_id(tokenizer)
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              num_return_sequences=samples, pad_token_id=pad, eos_token_id=eos or None)
    groups: list[list[float]] = []
    lengths: list[int] = []
    was_training = model.training
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            for i in range(0, len(prompts), batch_size):
                batch = prompts[i: i + batch_size]
                # as TRL's RL trainers tokenize prompts: no special tokens added, padded on the left
                ids, mask = pad_batch(encode(tokenizer, batch, add_special_tokens=False), pad, side="left",
                                      device=model_device(model))
                out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
                ids_list, texts, owners = [], [], []
                for j, row in enumerate(out[:, ids.shape[1]:].tolist()):
                    cut = next((k for k, t in enumerate(row) if t in eos), None)
                    answer = row if cut is None else row[: cut + 1]
                    ids_list.append(answer)
                    texts.append(tokenizer.decode(answer, skip_special_tokens=True))
                    owners.append(i + j // samples)
                rewards = reward_func(prompts=[prompts[o] for o in owners], completions=texts, completion_ids=ids_list,
                                      **{k: [v[o] for o in owners] for k, v in columns.items()})
                for j, r in enumerate(rewards):
                    if j % samples == 0:
                        groups.append([])
                    groups[-1].append(float(r))
                lengths.extend(len(a) for a in ids_list)
    finally:
        model.train(was_training)
    return kl_coefficient_for_target(groups, lengths, target, scale=scale)


# -- entropy_coef ------------------------------------------------------------------------------
# Facts (trl 1.16.0, trl/trainer/grpo_trainer.py): ``__init__`` copies ``self.entropy_coef =
# args.entropy_coef`` (846) and fixes ``self._entropy_bonus_enabled = entropy_coef != 0 or
# use_adaptive_entropy`` for the run (850); only then does ``_compute_loss`` compute the entropy
# term and subtract ``self.entropy_coef * entropy_loss``, reading the attribute at every loss
# computation (3195-3211). With ``use_adaptive_entropy=True`` TRL moves the same attribute itself
# every optimizer step (3216-3240). RLOOTrainer in 1.16 has no entropy bonus. ``epsilon_high`` is
# read by the loss at every step too (3110-3113) but is left out: its effect on entropy is through
# the clipped share only, and no scenario has measured it yet.

class EntropyCoefKnob:
    """``entropy_coef`` (linear, >= 0): ``trainer.entropy_coef`` of a TRL ``GRPOTrainer``, the
    entropy bonus its loss subtracts (``loss - entropy_coef * entropy``) at every step.

    Raises :class:`~actuator.agents.knobs.KnobNotSupported` at construction when a change would
    be ignored or fought: not a GRPOTrainer; the run started with ``entropy_coef=0`` (TRL then
    never computes the term: start it at a tiny value, ``GRPOConfig(entropy_coef=1e-4)``);
    ``use_adaptive_entropy=True`` (TRL's own law moves the same attribute every step); a Liger
    fused loss or ``use_liger_kernel`` (the loss is computed elsewhere)."""

    name = "entropy_coef"

    def __init__(self, trainer: Any) -> None:
        cls = type(trainer).__name__
        try:
            from trl import GRPOTrainer
        except ImportError:  # no TRL: the trainer cannot be one
            GRPOTrainer = None  # noqa: N806
        if GRPOTrainer is None or not isinstance(trainer, GRPOTrainer) or not hasattr(trainer, "entropy_coef"):
            raise KnobNotSupported(
                f"entropy_coef: {cls} is not a TRL GRPOTrainer with an entropy bonus (trl >= 1.8); "
                "RLOOTrainer in trl 1.16 has none. Steer kl_beta or learning_rate instead.")
        args = getattr(trainer, "args", None)
        if getattr(trainer, "use_adaptive_entropy", False) or getattr(args, "use_adaptive_entropy", False):
            raise KnobNotSupported(
                "entropy_coef: this GRPOTrainer runs TRL's own adaptive entropy law (use_adaptive_entropy=True), "
                "which moves trainer.entropy_coef by entropy_coef_delta every step and would fight the controller. "
                "Start it with use_adaptive_entropy=False and a small entropy_coef (e.g. GRPOConfig(entropy_coef=1e-4)).")
        liger = _liger_losses(trainer)
        if liger or getattr(args, "use_liger_kernel", False):
            raise KnobNotSupported(
                f"entropy_coef: this GRPOTrainer uses Liger kernels ({', '.join(liger) or 'use_liger_kernel=True'}), "
                "whose loss takes its coefficients at init; disable them to steer entropy_coef mid-run.")
        if not getattr(trainer, "_entropy_bonus_enabled", float(trainer.entropy_coef) != 0.0):
            raise KnobNotSupported(
                f"entropy_coef: the GRPOTrainer was started with entropy_coef={float(trainer.entropy_coef)}, so TRL "
                "decided at init never to compute the entropy term and a later coefficient would be ignored. Start it "
                "with a tiny non-zero coefficient, GRPOConfig(entropy_coef=1e-4) (--entropy_coef 1e-4 on TRL's "
                "scripts), and let the controller move it from there.")
        self.trainer = trainer

    def read(self) -> float:
        return float(self.trainer.entropy_coef)

    def apply(self, value: float) -> float:
        value = float(value)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"entropy_coef must be finite and >= 0, got {value}")
        self.trainer.entropy_coef = value
        return self.read()


@knob_setter("entropy_coef", hint="actuator.agents.trl_knobs.EntropyCoefKnob(trainer)")
def _entropy_coef(*, trainer: Any, **_: Any) -> EntropyCoefKnob:
    return EntropyCoefKnob(trainer)
