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
``self.temperature`` to the loss: temperature only shapes on-policy sampling there.)
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

try:
    from transformers import Trainer
except ImportError as exc:  # pragma: no cover - depends on install
    raise ImportError("actuator.agents.distill needs transformers: `pip install 'actuator[train]'`") from exc

from .knobs import KnobNotSupported

__all__ = ["DistillationTrainer", "DistillLambdaKnob", "GKDBetaKnob", "distillation_loss"]


def _check_unit(value: float, what: str) -> float:
    value = float(value)
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {value}")
    return value


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor,
    distill_lambda: float,
    temperature: float,
    num_items_in_batch: torch.Tensor | int | None = None,
    shifted: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, kl, ce)`` for causal-LM logits (B, L, V) and labels (B, L).

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
    kl_sum = F.kl_div(
        F.log_softmax(s / temperature, dim=-1),
        F.log_softmax(t / temperature, dim=-1),
        reduction="sum",
        log_target=True,
    )
    denom = n_local.clamp_min(1) if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(denom):
        denom = denom.to(ce_sum.device)
    lam = float(distill_lambda)
    loss = (lam * temperature**2 * kl_sum + (1.0 - lam) * ce_sum) / denom
    n = n_local.clamp_min(1)
    return loss, (kl_sum / n).detach(), (ce_sum / n).detach()


class DistillationTrainer(Trainer):
    """``transformers.Trainer`` with the loss ``λ·T²·KL_T(teacher‖student) + (1−λ)·CE``.

    ``teacher_model`` is put in eval mode, frozen, and moved to the student's device; it runs
    under ``torch.no_grad()`` on the same inputs (labels removed). The batch must carry
    ``labels`` (-100 = ignored; or ``shift_labels`` already shifted). ``distill_lambda`` ∈ [0, 1]
    is read at every step: λ = 1 is pure distillation, λ = 0 pure cross-entropy (the teacher
    still runs, so ``distill_kl`` is measured). ``temperature`` > 0 applies to the KL term only.

    Training logs gain ``distill_kl`` (KL at temperature T, per token), ``distill_ce`` (per
    token), both averaged over the steps since the last log, and ``distill_lambda``, the λ used by
    the latest loss computation: the value in effect, not the one requested.

    With gradient accumulation the sums are divided by the trainer's ``num_items_in_batch`` (the
    valid-token count over all micro-batches), matching HF's own causal-LM loss.
    """

    def __init__(
        self,
        *args: Any,
        teacher_model: nn.Module,
        distill_lambda: float = 0.5,
        temperature: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if teacher_model is None:
            raise ValueError("DistillationTrainer needs a teacher_model")
        self.distill_lambda = _check_unit(distill_lambda, "distill_lambda")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        device = next(self.model.parameters()).device
        self.teacher_model = teacher_model.to(device).eval().requires_grad_(False)
        self._distill_sums = {"distill_kl": 0.0, "distill_ce": 0.0}
        self._distill_count = 0
        self._distill_last_lambda: float | None = None

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        # Read once: a knob write from another thread cannot split one step between two values.
        lam = float(self.distill_lambda)
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
        loss, kl, ce = distillation_loss(
            student_logits,
            teacher_logits,
            labels,
            lam,
            self.temperature,
            num_items_in_batch=num_items_in_batch,
            shifted=shifted,
        )
        # Normalised by the count over all accumulated micro-batches: already scaled for GA.
        self.loss_is_scaled_for_ga = num_items_in_batch is not None
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            # num_items_in_batch is then the global count and DDP averages gradients.
            loss = loss * self.accelerator.num_processes
        if model.training:
            self._distill_sums["distill_kl"] += float(kl)
            self._distill_sums["distill_ce"] += float(ce)
            self._distill_count += 1
            self._distill_last_lambda = lam
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._distill_count:
            for key, total in self._distill_sums.items():
                logs[key] = total / self._distill_count
                self._distill_sums[key] = 0.0
            self._distill_count = 0
            logs["distill_lambda"] = self._distill_last_lambda
        super().log(logs, start_time)


# Attributes read at every step, verified against the installed sources: ours (KL weight in
# compute_loss); TRL GKD's (on-policy probability in training_step; GOLD / IW-OPD read it when
# they fill their on-policy buffer).
_LAMBDA_ATTRS = ("distill_lambda", "lmbda")


class DistillLambdaKnob:
    """``distill_lambda`` (linear scale, bounds [0, 1]) of a distillation trainer.

    * :class:`DistillationTrainer`: ``trainer.distill_lambda``, the KL weight of the loss.
    * TRL ``GKDTrainer`` (and ``GOLDTrainer`` / ``IWOPDTrainer``, which share the attribute):
      ``trainer.lmbda``, the probability that a step trains on student-generated sequences. Same
      knob name, different meaning: GKD's λ is an on-policy fraction; the policy must say which.

    ``apply`` raises ``ValueError`` outside [0, 1]; other trainers raise ``KnobNotSupported``.
    """

    name = "distill_lambda"
    bounds = (0.0, 1.0)

    def __init__(self, trainer: Any) -> None:
        for attr in _LAMBDA_ATTRS:
            if hasattr(trainer, attr):
                self.attr = attr
                break
        else:
            raise KnobNotSupported(
                f"DistillLambdaKnob: {type(trainer).__name__} has neither `distill_lambda` "
                "(actuator DistillationTrainer) nor `lmbda` (TRL GKDTrainer)"
            )
        self.trainer = trainer

    def read(self) -> float:
        return float(getattr(self.trainer, self.attr))

    def apply(self, value: float) -> float:
        setattr(self.trainer, self.attr, _check_unit(value, self.name))
        return self.read()


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
