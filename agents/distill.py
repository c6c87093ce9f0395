"""Knowledge distillation with a mid-run distillation weight, and knobs for TRL's GKD family.

:class:`DistillationTrainer` minimises, over the non-masked next-token positions,

    loss = λ · T² · KL(softmax(teacher/T) ‖ softmax(student/T)) + (1 − λ) · CE(student, labels)

and reads ``self.distill_lambda`` at every loss computation, which is what
:class:`DistillLambdaKnob` writes. The T² factor keeps the soft-target gradients on the scale of
the hard-target ones as T changes (Hinton et al. 2015).

TRL (1.16, ``trl.experimental.gkd``) ``GKDTrainer`` copies ``args.lmbda`` / ``args.beta`` into
``trainer.lmbda`` / ``trainer.beta`` at init; ``training_step`` reads ``self.lmbda`` every step
(the probability that the step trains on student-generated sequences: an on-policy fraction, not
a loss weight) and ``compute_loss`` passes ``self.beta`` to ``generalized_jsd_loss`` every step.
So the knobs set those trainer attributes, never ``args``. (GKD's ``compute_loss`` does not pass
``self.temperature`` to the loss, and its sampling temperature is frozen into ``generation_config``
at init: writing ``trainer.temperature`` mid-run changes nothing there, so
:class:`DistillTemperatureKnob` refuses GKD.)

Three more knobs move what the draft learns from and with, each read at every step:

* ``onpolicy_fraction`` (:class:`OnPolicyFractionKnob`): the probability that a micro-batch trains
  on continuations the student (draft) samples itself at T = 1 from the batch's prompts, instead
  of the dataset's text (GKD, Agarwal et al. 2024; DistillSpec, Zhou et al. 2024). Ours:
  ``trainer.onpolicy_fraction``; TRL GKD: ``trainer.lmbda`` (``random.random() <= self.lmbda`` in
  ``training_step``).
* ``divergence_mix`` (:class:`DivergenceMixKnob`): the blend of forward KL(p‖q), reverse KL(q‖p)
  and total variation TV(p, q) the loss uses. Acceptance in speculative sampling is
  α = Σ min(p, q) = 1 − TV (Leviathan et al. 2023), which is why TV is on the menu (DistillSpec
  found TV-style losses best for some tasks). The knob moves weight along a two-divergence path,
  forward → TV by default: ``mix_form="blend"`` (the default) as (1 − m)·KL + m·TV, ``"hybrid"`` as
  the LK losses' hybrid KL + λ·TV with λ = m (Samarin et al. 2026, arXiv 2602.23881: KL keeps its
  large gradients while TV, the quantity decoding pays for, gains weight; a ``kind: follow``
  controller raises λ with the measured acceptance).
* ``divergence="neg_log_acceptance"``: the LK losses' −log α per position, α = Σ_v min(p_v, q_v)
  (clamped at :data:`ACCEPTANCE_FLOOR`), whose gradient is TV's scaled by 1/α: large while the draft
  accepts little, where TV's own vanish.
* ``distill_temperature`` (:class:`DistillTemperatureKnob`): T of the divergence term.
* ``distill_token_filter`` (:class:`TokenFilterKnob`): the fraction of positions dropped from the
  divergence term, AdaSPEC's selective distillation (Hu et al. 2025, arXiv 2510.19779): with a
  ``reference_model`` (the draft's architecture, already distilled from the teacher), the positions
  whose gap KL(p‖q_student) − KL(p‖q_reference) is smallest are dropped: those the reference, of
  the draft's capacity, fits no better than the draft, the tokens the draft cannot learn
  (:func:`token_filter_mask`).
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping
from typing import Any

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from transformers import Trainer
except ImportError as exc:
    from .models import training_stack_missing

    raise training_stack_missing("actuator.agents.distill", exc) from exc

from .knobs import KnobNotSupported, knob_setter
from .probes._draft import sample_continuations

log = logging.getLogger("actuator.agents")

__all__ = [
    "ACCEPTANCE_FLOOR",
    "DIVERGENCES",
    "MIX_FORMS",
    "DistillationTrainer",
    "DistillLambdaKnob",
    "DistillTemperatureKnob",
    "DivergenceMixKnob",
    "GKDBetaKnob",
    "OnPolicyFractionKnob",
    "TokenFilterKnob",
    "distillation_loss",
    "divergence_weights",
    "mix_weights",
    "sample_continuations",
    "token_filter_mask",
]

# The divergences the loss can blend (p = teacher, q = student, both at temperature T):
# KL(p‖q), KL(q‖p), TV(p, q) = ½ Σ|p − q|, and −log α with α = Σ min(p, q) = 1 − TV.
DIVERGENCES = ("forward", "reverse", "tv", "neg_log_acceptance")
# α is clamped here before its log: a position where the draft puts (numerically) no mass on the
# teacher's tokens costs −log(1e-6) ≈ 13.8 and a finite gradient, never inf or NaN.
ACCEPTANCE_FLOOR = 1e-6
# How divergence_mix m weighs the two divergences of its path (a, b): blend (1 − m)·a + m·b,
# hybrid a + m·b (the LK hybrid KL + λ·TV).
MIX_FORMS = ("blend", "hybrid")


def _check_unit(value: float, what: str) -> float:
    value = float(value)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {value}")
    return value


def _check_filter(value: float, what: str) -> float:
    value = float(value)
    if math.isnan(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{what} must be in [0, 1), got {value}")
    return value


def token_filter_mask(student_kl: torch.Tensor, reference_kl: torch.Tensor, fraction: float) -> torch.Tensor:
    """AdaSPEC's token selection: a boolean mask over positions that drops the ⌊fraction·n⌋ of the
    n positions with the smallest gap ``student_kl − reference_kl`` (per-position KL(p‖q) of the
    draft and of the reference model). AdaSPEC keeps ``delta >= quantile(delta, 1 − k)``, k the kept
    share; ties are broken by position (a stable sort), so exactly ⌊fraction·n⌋ go."""
    fraction = _check_filter(fraction, "token_filter")
    keep = torch.ones(student_kl.shape, dtype=torch.bool, device=student_kl.device)
    drop = int(math.floor(fraction * student_kl.numel() + 1e-9))
    if drop:
        gap = (student_kl - reference_kl).detach().reshape(-1)
        keep.view(-1)[torch.argsort(gap, stable=True)[:drop]] = False
    return keep


def _check_temperature(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {value}")
    return value


def divergence_weights(spec: str | Mapping[str, float], normalise: bool = True) -> dict[str, float]:
    """One of :data:`DIVERGENCES` or a mapping of weights over them, as weights summing to 1 (as
    given when not ``normalise``). Raises ``ValueError`` naming the bad key or weight."""
    if isinstance(spec, str):
        spec = {spec: 1.0}
    if not isinstance(spec, Mapping):
        raise ValueError(f"divergence must be one of {DIVERGENCES} or a mapping of weights, got {spec!r}")
    weights = {name: 0.0 for name in DIVERGENCES}
    for name, w in spec.items():
        if name not in DIVERGENCES:
            raise ValueError(f"divergence: unknown divergence {name!r}; known: {DIVERGENCES}")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ValueError(f"divergence.{name}: a weight is a finite number >= 0, got {w!r}")
        weights[name] = float(w)
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"divergence: the weights sum to 0, got {dict(spec)}")
    return {name: w / total for name, w in weights.items()} if normalise else weights


def mix_weights(m: float, path: tuple[str, str] = ("forward", "tv"), form: str = "blend") -> dict[str, float]:
    """The divergence weights ``divergence_mix`` = m stands for on ``path`` (a, b): ``"blend"``:
    ``{a: 1 − m, b: m}``; ``"hybrid"``: ``{a: 1, b: m}`` (not normalised: the LK hybrid a + λ·b).
    Every other divergence weighs 0."""
    m = _check_unit(m, "divergence_mix")
    if form not in MIX_FORMS:
        raise ValueError(f"mix_form must be one of {MIX_FORMS}, got {form!r}")
    weights = {name: 0.0 for name in DIVERGENCES}
    weights.update({path[0]: 1.0 if form == "hybrid" else 1.0 - m, path[1]: m})
    return weights if form == "hybrid" else divergence_weights(weights)


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    distill_lambda: float,
    temperature: float,
    num_items_in_batch: torch.Tensor | int | None = None,
    shifted: bool = False,
    divergence: str | Mapping[str, float] = "forward",
    normalise: bool = True,
    token_filter: float = 0.0,
    reference_logits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, kl, ce)`` for causal-LM logits (B, L, V) and labels (B, L).

    ``loss = λ·T²·D + (1 − λ)·CE`` where ``D = w_f·KL(p‖q) + w_r·KL(q‖p) + w_tv·TV(p, q) +
    w_nla·(−log α)``, α = Σ min(p, q) clamped at :data:`ACCEPTANCE_FLOOR`, with p the teacher's and
    q the student's softmax at temperature T, per position, and the weights from ``divergence``
    (default: forward KL alone, the classic loss), normalised to sum 1 unless ``normalise`` is
    False (the LK hybrid KL + λ·TV is ``{"forward": 1, "tv": λ}`` un-normalised, see
    :func:`mix_weights`).

    With ``token_filter`` x > 0 and ``reference_logits`` (a reference model's, same shape), D is
    summed over the positions :func:`token_filter_mask` keeps: ⌊x·n⌋ of the n valid positions, those
    with the smallest gap KL(p‖q) − KL(p‖q_reference) at temperature T, leave the divergence term
    (AdaSPEC); the cross-entropy term and the denominator still count every position (AdaSPEC
    divides by ``num_items_in_batch`` likewise).

    Unless ``shifted``, logits at position i are scored against ``labels[:, i + 1]``. Positions
    whose label is -100 are excluded from both terms. ``kl`` (at temperature T, per token) and
    ``ce`` (T = 1, per token) are the batch means over valid positions; ``loss`` divides the sums
    by ``num_items_in_batch`` when given (the trainer's count over all gradient-accumulation
    micro-batches) and by the local count otherwise.
    """
    if not shifted:
        student_logits = student_logits[:, :-1]
        teacher_logits = teacher_logits[:, :-1]
        labels = labels[:, 1:]
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} "
            "differ: distillation needs a shared vocabulary"
        )
    mask = labels != -100
    s = student_logits[mask].float()
    t = teacher_logits[mask].float()
    y = labels[mask]
    n_local = mask.sum()
    ce_sum = F.cross_entropy(s, y, reduction="sum")
    log_q = F.log_softmax(s / temperature, dim=-1)
    log_p = F.log_softmax(t / temperature, dim=-1)
    kl_pos = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(dim=-1)  # per position
    kl_sum = kl_pos.sum()
    weights = divergence_weights(divergence, normalise=normalise)
    div_pos = weights["forward"] * kl_pos if weights["forward"] else kl_pos.new_zeros(kl_pos.shape)
    if weights["reverse"]:
        div_pos = div_pos + weights["reverse"] * (log_q.exp() * (log_q - log_p)).sum(dim=-1)
    if weights["tv"]:
        div_pos = div_pos + weights["tv"] * 0.5 * (log_q.exp() - log_p.exp()).abs().sum(dim=-1)
    if weights["neg_log_acceptance"]:
        alpha = torch.minimum(log_q.exp(), log_p.exp()).sum(dim=-1).clamp_min(ACCEPTANCE_FLOOR)
        div_pos = div_pos + weights["neg_log_acceptance"] * -torch.log(alpha)
    if _check_filter(token_filter, "token_filter") > 0:
        if reference_logits is None:
            raise ValueError("token_filter > 0 needs reference_logits (AdaSPEC's reference model)")
        r = (reference_logits if shifted else reference_logits[:, :-1])[mask].float().detach()
        ref_kl = F.kl_div(F.log_softmax(r / temperature, dim=-1), log_p, reduction="none",
                          log_target=True).sum(dim=-1)
        div_pos = div_pos[token_filter_mask(kl_pos, ref_kl, token_filter)]
    div_sum = div_pos.sum()
    denom = n_local.clamp_min(1) if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(denom):
        denom = denom.to(ce_sum.device)
    lam = float(distill_lambda)
    loss = (lam * temperature**2 * div_sum + (1.0 - lam) * ce_sum) / denom
    n = n_local.clamp_min(1)
    return loss, (kl_sum / n).detach(), (ce_sum / n).detach()


class DistillationTrainer(Trainer):
    """``transformers.Trainer`` with the loss ``λ·T²·D_T(teacher, student) + (1−λ)·CE``.

    ``teacher_model`` is put in eval mode, frozen, and moved to the student's device; it runs
    under ``torch.no_grad()`` on the same inputs (labels removed). The batch must carry
    ``labels`` (-100 = ignored; or ``shift_labels`` already shifted). ``distill_lambda`` ∈ [0, 1]
    is read at every step: λ = 1 is pure distillation, λ = 0 pure cross-entropy (the teacher
    still runs, so ``distill_kl`` is measured). ``temperature`` > 0 applies to the divergence
    term only. ``divergence`` is ``"forward"`` (KL(teacher‖student), the default), ``"reverse"``,
    ``"tv"``, ``"neg_log_acceptance"`` (−log α, the LK loss) or a mapping of weights over them (see
    :func:`distillation_loss`); the trainer keeps it normalised in ``divergence_weights``, read at
    every step and used as it stands (the ``divergence_mix`` knob writes it). ``mix_form`` says how
    that knob's value m weighs its path: ``"blend"`` (1 − m)·KL + m·TV, ``"hybrid"`` KL + m·TV (the
    LK hybrid); see :class:`DivergenceMixKnob`.

    **On-policy steps.** With probability ``onpolicy_fraction`` (read at every micro-batch, drawn
    from the trainer's own ``random.Random(args.seed)`` so it never moves the data order) a
    micro-batch's text is replaced by the student's own continuation: the first
    ``onpolicy_prompt_tokens`` tokens of each row (default: half the row) are the prompt, and the
    student samples ``onpolicy_new_tokens`` tokens (default: the rest of the row) at T = 1, the
    distribution a draft proposes from in speculative decoding. Generation runs under its own
    seeded RNG (``torch.random.fork_rng``), so the global RNG is untouched. The loss of that
    micro-batch is the divergence term alone, on the generated positions (``T²·D``): its labels
    would be the student's own samples, which are no target. A micro-batch whose prompt part has
    padding (``attention_mask`` 0) cannot be continued and stays off-policy; the first such case
    is warned about. This is GKD's ``lmbda`` (Agarwal et al. 2024), which TRL draws per micro-batch
    too.

    **Token filter.** ``token_filter`` ∈ [0, 1) (read at every step; the ``distill_token_filter``
    knob writes it) drops that fraction of each micro-batch's positions from the divergence term,
    AdaSPEC's selection against ``reference_model`` (frozen, run only while the filter is above 0;
    required when it starts above 0, see :func:`distillation_loss`).

    Training logs gain ``distill_kl`` (forward KL at temperature T, per token), ``distill_ce``
    (per token, off-policy micro-batches only), averaged over the steps since the last log;
    ``distill_lambda``, ``distill_temperature``, ``distill_token_filter`` and ``onpolicy_fraction``:
    the values the latest loss computation used (in effect, not requested); ``onpolicy_share``: the
    share of micro-batches since the last log that trained on-policy.

    With gradient accumulation the sums are divided by the trainer's ``num_items_in_batch`` (the
    valid-token count over all micro-batches), matching HF's own causal-LM loss. (On an on-policy
    micro-batch the count is its own: the trainer's count was made from the replaced text.)
    """

    def __init__(
        self,
        *args: Any,
        teacher_model: nn.Module,
        distill_lambda: float = 0.5,
        temperature: float = 2.0,
        divergence: str | Mapping[str, float] = "forward",
        mix_form: str = "blend",
        onpolicy_fraction: float = 0.0,
        onpolicy_prompt_tokens: int | None = None,
        onpolicy_new_tokens: int | None = None,
        reference_model: nn.Module | None = None,
        token_filter: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if teacher_model is None:
            raise ValueError("DistillationTrainer needs a teacher_model")
        self.token_filter = _check_filter(token_filter, "token_filter")
        if self.token_filter > 0 and reference_model is None:
            raise ValueError("token_filter > 0 needs a reference_model (AdaSPEC: the draft's architecture, "
                             "distilled from the teacher) to measure each token's gap against")
        self.distill_lambda = _check_unit(distill_lambda, "distill_lambda")
        self.temperature = _check_temperature(temperature, "temperature")
        self.divergence_weights = divergence_weights(divergence)
        if mix_form not in MIX_FORMS:
            raise ValueError(f"mix_form must be one of {MIX_FORMS}, got {mix_form!r}")
        self.mix_form = mix_form
        self.onpolicy_fraction = _check_unit(onpolicy_fraction, "onpolicy_fraction")
        for name, value in (("onpolicy_prompt_tokens", onpolicy_prompt_tokens),
                            ("onpolicy_new_tokens", onpolicy_new_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.onpolicy_prompt_tokens = onpolicy_prompt_tokens
        self.onpolicy_new_tokens = onpolicy_new_tokens
        self._onpolicy_rng = random.Random(self.args.seed)
        self._generations = 0
        self._warned_padding = False
        device = next(self.model.parameters()).device
        self.teacher_model = teacher_model.to(device).eval().requires_grad_(False)
        self.reference_model = (None if reference_model is None
                                else reference_model.to(device).eval().requires_grad_(False))
        self._distill_sums = {"distill_kl": 0.0, "distill_ce": 0.0}
        self._distill_count = 0
        self._ce_count = 0
        self._onpolicy_count = 0
        self._distill_last: dict[str, float] = {}
        #: Whether the latest training micro-batch was on-policy (None before the first one).
        self.last_onpolicy: bool | None = None

    # -- on-policy data ---------------------------------------------------------------------------
    def _prompt_tokens(self, length: int) -> int:
        k = self.onpolicy_prompt_tokens if self.onpolicy_prompt_tokens is not None else length // 2
        return max(1, min(k, length - 1)) if length > 1 else 1

    @torch.no_grad()
    def _onpolicy_inputs(self, model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any] | None:
        """The micro-batch with the student's own continuations in place of its text, or None
        when the prompt part has padding (the row cannot be continued where its text stops)."""
        ids = inputs["input_ids"]
        mask = inputs.get("attention_mask")
        k = self._prompt_tokens(ids.shape[1])
        if mask is not None and not bool(mask[:, :k].bool().all()):
            if not self._warned_padding:
                log.warning("on-policy step skipped: the first %d positions of a row hold padding "
                               "(set onpolicy_prompt_tokens below the shortest row); training off-policy", k)
                self._warned_padding = True
            return None
        new = self.onpolicy_new_tokens if self.onpolicy_new_tokens is not None else ids.shape[1] - k
        prompt = ids[:, :k]
        student = self.accelerator.unwrap_model(model)
        was_training = student.training
        student.eval()
        self._generations += 1
        try:
            # Own seeded stream: reproducible samples, and the global RNG (dropout, data order)
            # is exactly where it would be without the generation.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.args.seed * 1_000_003 + self._generations)
                seqs = sample_continuations(student, prompt, new)
        finally:
            student.train(was_training)
        labels = seqs.clone()
        labels[:, :k] = -100
        eos = getattr(getattr(student, "generation_config", None), "eos_token_id", None)
        attention = torch.ones_like(seqs)
        if eos is not None:
            # Everything after a row's first end-of-sequence token is not part of the sample.
            stop = torch.isin(seqs[:, k:], torch.tensor(eos, device=seqs.device).reshape(-1))
            after = (stop.cumsum(dim=1) - stop.long()) > 0
            labels[:, k:][after] = -100
            attention[:, k:][after] = 0
        out = {key: v for key, v in inputs.items() if key not in ("labels", "shift_labels")}
        out.update(input_ids=seqs, attention_mask=attention, labels=labels)
        return out

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        fraction = float(self.onpolicy_fraction)  # read once per micro-batch
        self._step_fraction = fraction
        onpolicy = self._onpolicy_rng.random() < fraction  # never at 0, always at 1
        replaced = self._onpolicy_inputs(model, inputs) if onpolicy else None
        self._step_onpolicy = replaced is not None
        if replaced is not None:
            inputs = replaced
            num_items_in_batch = None  # the count the trainer made belongs to the replaced text
        return super().training_step(model, inputs, num_items_in_batch)

    # -- loss -------------------------------------------------------------------------------------
    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        # Read once: a knob write from another thread cannot split one step between two values.
        lam = float(self.distill_lambda)
        temperature = float(self.temperature)
        token_filter = float(self.token_filter)
        weights = dict(self.divergence_weights)
        onpolicy = bool(model.training and getattr(self, "_step_onpolicy", False))
        shifted = "shift_labels" in inputs
        labels = inputs["shift_labels"] if shifted else inputs.get("labels")
        if labels is None:
            raise ValueError("DistillationTrainer needs `labels` (or `shift_labels`) in every batch")
        model_inputs = {k: v for k, v in inputs.items() if k not in ("labels", "shift_labels")}
        outputs = model(**model_inputs)
        student_logits = outputs.logits
        # The teacher runs even at λ = 0 so the logged KL stays a true measurement: a controller
        # raising λ when the student drifts needs it most then.
        self.teacher_model.eval()
        with torch.no_grad():
            teacher_logits = self.teacher_model(**model_inputs).logits
            # the reference runs only while the filter drops tokens (AdaSPEC's second forward)
            reference_logits = (self.reference_model.eval()(**model_inputs).logits
                                if token_filter > 0 and self.reference_model is not None else None)
        loss, kl, ce = distillation_loss(
            student_logits,
            teacher_logits,
            labels,
            1.0 if onpolicy else lam,
            temperature,
            num_items_in_batch=num_items_in_batch,
            shifted=shifted,
            divergence=weights,
            normalise=False,  # valid as they stand: normalised at init, or the knob's (the hybrid's are not)
            token_filter=token_filter if reference_logits is not None else 0.0,
            reference_logits=reference_logits,
        )
        # Normalised by the count over all accumulated micro-batches: already scaled for GA (an
        # on-policy micro-batch is a per-token mean that the trainer divides by the GA steps).
        self.loss_is_scaled_for_ga = num_items_in_batch is not None
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            # num_items_in_batch is then the global count and DDP averages gradients.
            loss = loss * self.accelerator.num_processes
        if model.training:
            self._distill_sums["distill_kl"] += float(kl)
            self._distill_count += 1
            if not onpolicy:
                self._distill_sums["distill_ce"] += float(ce)
                self._ce_count += 1
            self._onpolicy_count += int(onpolicy)
            self.last_onpolicy = onpolicy
            self._distill_last = {"distill_lambda": lam, "distill_temperature": temperature,
                                  "distill_token_filter": token_filter,
                                  "onpolicy_fraction": float(getattr(self, "_step_fraction", self.onpolicy_fraction))}
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._distill_count:
            logs["distill_kl"] = self._distill_sums["distill_kl"] / self._distill_count
            if self._ce_count:
                logs["distill_ce"] = self._distill_sums["distill_ce"] / self._ce_count
            logs["onpolicy_share"] = self._onpolicy_count / self._distill_count
            logs.update(self._distill_last)
            self._distill_sums = {"distill_kl": 0.0, "distill_ce": 0.0}
            self._distill_count = self._ce_count = self._onpolicy_count = 0
        super().log(logs, start_time)


# Attributes read at every step, verified against the installed sources: ours (KL weight in
# compute_loss); TRL GKD's (on-policy probability in training_step; GOLD / IW-OPD read it when
# they fill their on-policy buffer).
_LAMBDA_ATTRS = ("distill_lambda", "lmbda")


class _UnitAttrKnob:
    """A knob in [0, 1] stored in the first of ``attrs`` the trainer has (read at every step)."""

    name: str
    attrs: tuple[str, ...]
    bounds = (0.0, 1.0)

    def __init__(self, trainer: Any) -> None:
        attr = next((a for a in self.attrs if hasattr(trainer, a)), None)
        if attr is None:
            raise KnobNotSupported(self._refusal(type(trainer).__name__))
        self.attr = attr
        self.trainer = trainer

    def _refusal(self, kind: str) -> str:
        raise NotImplementedError

    def read(self) -> float:
        return float(getattr(self.trainer, self.attr))

    def apply(self, value: float) -> float:
        setattr(self.trainer, self.attr, type(self).check(value, self.name))
        return self.read()

    check = staticmethod(_check_unit)


class DistillLambdaKnob(_UnitAttrKnob):
    """``distill_lambda`` (linear scale, bounds [0, 1]) of a distillation trainer.

    * :class:`DistillationTrainer`: ``trainer.distill_lambda``, the KL weight of the loss.
    * TRL ``GKDTrainer`` (and ``GOLDTrainer`` / ``IWOPDTrainer``, which share the attribute):
      ``trainer.lmbda``, the probability that a step trains on student-generated sequences. Same
      knob name, different meaning: GKD's λ is an on-policy fraction; the policy must say which.

    ``apply`` raises ``ValueError`` outside [0, 1]; other trainers raise ``KnobNotSupported``.
    """

    name = "distill_lambda"
    attrs = _LAMBDA_ATTRS

    def _refusal(self, kind: str) -> str:
        return (f"DistillLambdaKnob: {kind} has neither `distill_lambda` (actuator DistillationTrainer) nor `lmbda` "
                "(TRL GKDTrainer)")


class GKDBetaKnob:
    """``gkd_beta`` (linear scale, bounds [0, 1]): the generalized JSD interpolation of TRL GKD.

    ``GKDTrainer.compute_loss`` passes ``self.beta`` to ``generalized_jsd_loss`` at every step
    (β = 0: forward KL(teacher‖student), β = 1: reverse KL, between: generalized JSD). Distinct
    from ``kl_beta`` (the DPO/GRPO penalty), hence its own name. Trainers with ``lmbda`` and
    ``beta`` attributes are accepted; our :class:`DistillationTrainer` has no β and is refused.
    """

    name = "gkd_beta"
    bounds = (0.0, 1.0)

    def __init__(self, trainer: Any) -> None:
        if not (hasattr(trainer, "lmbda") and hasattr(trainer, "beta")):
            raise KnobNotSupported(
                f"GKDBetaKnob: {type(trainer).__name__} is not a TRL GKD-style trainer "
                "(needs `lmbda` and `beta` attributes read by its loss)"
            )
        self.trainer = trainer

    def read(self) -> float:
        return float(self.trainer.beta)

    def apply(self, value: float) -> float:
        self.trainer.beta = _check_unit(value, self.name)
        return self.read()


class OnPolicyFractionKnob(_UnitAttrKnob):
    """``onpolicy_fraction`` (linear scale, bounds [0, 1]): the probability that a step trains on
    continuations the student (draft) generates itself.

    * :class:`DistillationTrainer`: ``trainer.onpolicy_fraction``, drawn per micro-batch in
      ``training_step``.
    * TRL ``GKDTrainer`` (and the trainers that share its attribute): ``trainer.lmbda``, read by
      ``training_step`` as ``random.random() <= self.lmbda`` per micro-batch (trl 1.16,
      ``trl/experimental/gkd/gkd_trainer.py``). There it is the same number the ``distill_lambda``
      knob writes; this name says what it means.

    ``apply`` raises ``ValueError`` outside [0, 1]; other trainers raise ``KnobNotSupported``.
    """

    name = "onpolicy_fraction"
    attrs = ("onpolicy_fraction", "lmbda")

    def _refusal(self, kind: str) -> str:
        return (f"OnPolicyFractionKnob: {kind} has neither `onpolicy_fraction` (actuator DistillationTrainer) nor "
                "`lmbda` (TRL GKDTrainer): it never trains on generated sequences")


class DivergenceMixKnob:
    """``divergence_mix`` (linear scale, bounds [0, 1]): where the loss sits on a path between two
    divergences of :class:`DistillationTrainer` (``"forward"``, ``"reverse"``, ``"tv"``,
    ``"neg_log_acceptance"``).

    The value m sets ``trainer.divergence_weights`` to :func:`mix_weights` (m, path, form) (a
    weight off the path becomes 0): with ``form="blend"`` ``{path[0]: 1 − m, path[1]: m}``, and
    ``read`` returns ``w[path[1]] / (w[path[0]] + w[path[1]])``; with ``form="hybrid"``
    ``{path[0]: 1, path[1]: m}``, the LK losses' hybrid KL + λ·TV with λ = m on the default path,
    and ``read`` returns ``w[path[1]] / w[path[0]]``. ``form`` defaults to the trainer's
    ``mix_form``. The default path, forward KL → TV, goes from the classic distillation loss to the
    quantity speculative decoding pays for (acceptance = 1 − TV). For TRL GKD's forward/reverse
    interpolation use :class:`GKDBetaKnob` (``gkd_beta``): GKD has no TV term.
    """

    name = "divergence_mix"
    bounds = (0.0, 1.0)

    def __init__(self, trainer: Any, path: tuple[str, str] = ("forward", "tv"), form: str | None = None) -> None:
        if not isinstance(getattr(trainer, "divergence_weights", None), dict):
            raise KnobNotSupported(
                f"DivergenceMixKnob: {type(trainer).__name__} has no `divergence_weights` read by its loss "
                "(use actuator.agents.distill.DistillationTrainer; for TRL GKD use GKDBetaKnob)"
            )
        if len(path) != 2 or path[0] == path[1] or any(p not in DIVERGENCES for p in path):
            raise ValueError(f"path: two different divergences of {DIVERGENCES}, got {path!r}")
        form = getattr(trainer, "mix_form", "blend") if form is None else form
        if form not in MIX_FORMS:
            raise ValueError(f"form: one of {MIX_FORMS}, got {form!r}")
        self.trainer = trainer
        self.path = (path[0], path[1])
        self.form = form

    def read(self) -> float:
        w = self.trainer.divergence_weights
        a, b = float(w.get(self.path[0], 0.0)), float(w.get(self.path[1], 0.0))
        if self.form == "hybrid":
            return min(1.0, b / a) if a > 0 else (1.0 if b > 0 else 0.0)
        return b / (a + b) if a + b > 0 else 0.0

    def apply(self, value: float) -> float:
        # One assignment of a new dict: a step reading the weights sees the old blend or the new.
        self.trainer.divergence_weights = mix_weights(_check_unit(value, self.name), self.path, self.form)
        return self.read()


class DistillTemperatureKnob:
    """``distill_temperature`` (log scale): T of :class:`DistillationTrainer`'s divergence term,
    read at every loss computation (the T² factor follows it).

    TRL GKD is refused: its ``compute_loss`` never passes ``self.temperature`` to the loss, and its
    sampling temperature is frozen in ``generation_config`` at init, so a write would do nothing.
    """

    name = "distill_temperature"

    def __init__(self, trainer: Any) -> None:
        if not isinstance(trainer, DistillationTrainer):
            kind = type(trainer).__name__
            why = ("its loss ignores `temperature` (GKD's compute_loss does not pass it; sampling fixes it at init)"
                   if hasattr(trainer, "lmbda") else "it has no distillation temperature read by its loss")
            raise KnobNotSupported(f"DistillTemperatureKnob: {kind}: {why}; use "
                                   "actuator.agents.distill.DistillationTrainer")
        self.trainer = trainer

    def read(self) -> float:
        return float(self.trainer.temperature)

    def apply(self, value: float) -> float:
        self.trainer.temperature = _check_temperature(value, self.name)
        return self.read()


class TokenFilterKnob(_UnitAttrKnob):
    """``distill_token_filter`` (linear scale, [0, 1)): the fraction of positions
    :class:`DistillationTrainer` drops from its divergence term, AdaSPEC-style (see
    :func:`token_filter_mask`), read at every loss computation. Needs the trainer's
    ``reference_model``; without one (or on another trainer) ``KnobNotSupported``."""

    name = "distill_token_filter"
    attrs = ("token_filter",)
    bounds = (0.0, 0.9)  # the catalogue's: beyond 0.9 almost nothing is left to distil
    check = staticmethod(_check_filter)

    def __init__(self, trainer: Any) -> None:
        if not isinstance(trainer, DistillationTrainer) or trainer.reference_model is None:
            raise KnobNotSupported(self._refusal(type(trainer).__name__))
        super().__init__(trainer)

    def _refusal(self, kind: str) -> str:
        return (f"TokenFilterKnob: {kind} has no reference_model to measure each token's gap against (pass "
                "actuator DistillationTrainer(reference_model=...), a draft-sized model distilled from the teacher)")


def _register_trainer_knob(cls: type) -> None:
    """``cls(trainer)`` is the setter of knob ``cls.name``."""
    knob_setter(cls.name, hint=f"actuator.agents.distill.{cls.__name__}(trainer)")(
        lambda *, trainer, **_: cls(trainer))


for _cls in (DistillLambdaKnob, GKDBetaKnob, OnPolicyFractionKnob, DivergenceMixKnob, DistillTemperatureKnob,
             TokenFilterKnob):
    _register_trainer_knob(_cls)
