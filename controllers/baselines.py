"""Baseline control laws, kept beside the PID so every benchmark can compare against them.

Each one follows its published formula exactly (the tests check that), and has the same pure
shape as the PID: state in, state out, no hidden memory, no clock.

* :class:`AdaptiveKLController` -- Ziegler et al. 2019, "Fine-Tuning Language Models from Human
  Preferences", Sec. 2.2; the same update as openai/lm-human-preferences and TRL.
* :class:`ReduceLROnPlateau` -- the semantics of ``torch.optim.lr_scheduler.ReduceLROnPlateau``
  for one parameter group, without needing an optimizer.
* :class:`KLAdaptiveLR` -- TorchRL's ``torchrl.objectives.KLAdaptiveLR`` (the rsl_rl PPO rule): the
  learning rate divided or multiplied by a factor when the KL leaves a band around the target.
* :class:`FixedSchedule` -- open loop: constant, piecewise-linear, or AdaLoRA's cubic budget
  decay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ._checks import (
    ParameterError,
    json_float,
    require_finite,
    require_non_negative,
    require_positive,
)
from .setpoint import setpoint_at, validate_setpoint

__all__ = [
    "AdaptiveKLState",
    "AdaptiveKLController",
    "PlateauState",
    "ReduceLROnPlateau",
    "KLAdaptiveLR",
    "FixedSchedule",
]


# -- Ziegler et al. 2019 ---------------------------------------------------------------------


@dataclass
class AdaptiveKLState:
    """The current KL coefficient (beta)."""

    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AdaptiveKLState:
        return cls(value=float(d["value"]))


class AdaptiveKLController:
    """``beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon``.

    A clipped, integral-only controller in log(beta): the clip bounds how fast beta can move
    (at most a factor ``1 +- 0.2 * n_steps / horizon`` per update), which is what makes it robust
    and also what makes it slow to settle. ``n_steps`` is the number of samples (episodes) since
    the last update -- the PPO batch size in the paper and in TRL.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float) -> None:
        self.init_kl_coef = require_positive("init_kl_coef", init_kl_coef)
        self.target = require_positive("target", target)
        self.horizon = require_positive("horizon", horizon)

    def update(
        self, current_kl: float, n_steps: int, state: AdaptiveKLState | None = None
    ) -> tuple[float, AdaptiveKLState]:
        kl = require_finite("current_kl", current_kl)
        n = require_non_negative("n_steps", n_steps)
        beta = self.init_kl_coef if state is None else state.value
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        mult = 1.0 + proportional_error * n / self.horizon
        beta *= mult
        return beta, AdaptiveKLState(value=beta)


# -- PyTorch ReduceLROnPlateau ----------------------------------------------------------------


@dataclass
class PlateauState:
    """Mirror of the torch scheduler's mutable attributes (``best`` None in JSON = not set yet)."""

    best: float | None = None
    num_bad_epochs: int = 0
    cooldown_counter: int = 0
    last_epoch: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "best": json_float(self.best),
            "num_bad_epochs": self.num_bad_epochs,
            "cooldown_counter": self.cooldown_counter,
            "last_epoch": self.last_epoch,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlateauState:
        best = d.get("best")
        return cls(
            best=None if best is None else float(best),
            num_bad_epochs=int(d.get("num_bad_epochs", 0)),
            cooldown_counter=int(d.get("cooldown_counter", 0)),
            last_epoch=int(d.get("last_epoch", 0)),
        )


class ReduceLROnPlateau:
    """Pure re-implementation of ``torch.optim.lr_scheduler.ReduceLROnPlateau`` (one group).

    Same parameters and defaults; ``update(metric, current_lr, state)`` is ``scheduler.step(metric)``
    followed by reading the group's lr. One deliberate difference: a non-finite metric raises
    instead of counting as a bad epoch, consistently with the other control laws here.
    """

    def __init__(
        self,
        mode: Literal["min", "max"] = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: Literal["rel", "abs"] = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ) -> None:
        if mode not in ("min", "max"):
            raise ParameterError("mode", f"must be 'min' or 'max', got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ParameterError("threshold_mode", f"must be 'rel' or 'abs', got {threshold_mode!r}")
        factor = require_non_negative("factor", factor)
        if factor >= 1.0:
            raise ParameterError("factor", f"must be < 1.0, got {factor}")
        for name, v in (("patience", patience), ("cooldown", cooldown)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ParameterError(name, f"must be an integer >= 0, got {v!r}")
        self.mode = mode
        self.factor = factor
        self.patience = patience
        self.threshold = require_non_negative("threshold", threshold)
        self.threshold_mode = threshold_mode
        self.cooldown = cooldown
        self.min_lr = require_non_negative("min_lr", min_lr)
        self.eps = require_non_negative("eps", eps)
        # torch starts ``best`` at the worst possible value for the mode.
        self._worse = math.inf if mode == "min" else -math.inf

    def _is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def update(self, metric: float, current_lr: float, state: PlateauState | None = None) -> tuple[float, PlateauState]:
        current = require_finite("metric", metric)
        lr = require_non_negative("current_lr", current_lr)
        st = state if state is not None else PlateauState()
        best = self._worse if st.best is None else st.best
        bad = st.num_bad_epochs
        cooldown_counter = st.cooldown_counter

        if self._is_better(current, best):
            best = current
            bad = 0
        else:
            bad += 1
        if cooldown_counter > 0:
            cooldown_counter -= 1
            bad = 0  # bad epochs during cooldown are ignored, as in torch
        if bad > self.patience:
            new_lr = max(lr * self.factor, self.min_lr)
            # torch skips reductions smaller than eps (keeps the old lr unchanged)
            if lr - new_lr > self.eps:
                lr = new_lr
            cooldown_counter = self.cooldown
            bad = 0
        return lr, PlateauState(
            best=None if math.isinf(best) else best,
            num_bad_epochs=bad,
            cooldown_counter=cooldown_counter,
            last_epoch=st.last_epoch + 1,
        )


# -- TorchRL KLAdaptiveLR ---------------------------------------------------------------------


class KLAdaptiveLR:
    """TorchRL's ``KLAdaptiveLR`` rule for one learning rate (``torchrl.objectives.KLAdaptiveLR``,
    the schedule of rsl_rl's PPO, Rudin et al. 2021), without an optimizer.

    After each measurement of the KL: above ``2 * target_kl`` the learning rate is divided by
    ``factor``; positive but below ``target_kl / 2`` it is multiplied by ``factor``; in the band
    ``[target_kl / 2, 2 * target_kl]`` it is left alone; then it is clamped to ``[min_lr, max_lr]``.
    A KL of exactly zero (or below: an estimate can come out negative) leaves it unchanged, so a
    policy that did not move does not grow the rate without end. Defaults are TorchRL's: factor 1.5,
    min_lr 1e-5, max_lr 1e-2. It is a bang-bang law with a dead band: no notion of how far outside
    the band the KL is, or where it is heading, which is what it is compared for.
    """

    def __init__(self, target_kl: float, *, factor: float = 1.5, min_lr: float = 1e-5, max_lr: float = 1e-2) -> None:
        self.target_kl = require_positive("target_kl", target_kl)
        self.factor = require_finite("factor", factor)
        if not self.factor > 1.0:
            raise ParameterError("factor", f"must be greater than one, got {self.factor}")
        self.min_lr = require_non_negative("min_lr", min_lr)
        self.max_lr = require_positive("max_lr", max_lr)
        if self.min_lr > self.max_lr:
            raise ParameterError("min_lr", f"min_lr ({self.min_lr}) is greater than max_lr ({self.max_lr})")

    def update(self, kl: float, current_lr: float) -> float:
        """The learning rate after one ``step(kl)`` from ``current_lr`` (stateless: the rate is the state)."""
        kl = require_finite("kl", kl)
        lr = require_non_negative("current_lr", current_lr)
        if kl > 2.0 * self.target_kl:
            lr = lr / self.factor
        elif 0.0 < kl < self.target_kl / 2.0:
            lr = lr * self.factor
        return min(max(lr, self.min_lr), self.max_lr)


# -- open loop ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedSchedule:
    """Open-loop value over training steps: the "no controller" arm of every comparison.

    Build it with :meth:`constant`, :meth:`piecewise` or :meth:`cubic`. ``integer=True`` rounds
    to the nearest integer (halves up), for rank budgets.
    """

    kind: Literal["constant", "piecewise", "cubic"]
    value: float = 0.0
    points: tuple[tuple[float, float], ...] = ()
    v0: float = 0.0
    v_final: float = 0.0
    t_init: float = 0.0
    t_final: float = 0.0
    integer: bool = False

    @classmethod
    def constant(cls, value: float, *, integer: bool = False) -> FixedSchedule:
        return cls(kind="constant", value=require_finite("value", value), integer=integer)

    @classmethod
    def piecewise(cls, points: Sequence[Sequence[float]], *, integer: bool = False) -> FixedSchedule:
        """Linear between ``(step, value)`` points, flat outside them."""
        normalised = validate_setpoint(points)
        if isinstance(normalised, float):
            raise ParameterError("points", "must be a list of (step, value) points")
        return cls(kind="piecewise", points=tuple(normalised), integer=integer)

    @classmethod
    def cubic(cls, v0: float, v_final: float, t_init: float, t_final: float, *, integer: bool = False) -> FixedSchedule:
        """AdaLoRA's budget shape: ``v0`` until ``t_init``, then
        ``v_final + (v0 - v_final) * (1 - (t - t_init) / (t_final - t_init)) ** 3``, then ``v_final``.

        Front-loaded decay: most of the reduction happens early, while the optimizer still has
        many steps left to recover from it.
        """
        t_init = require_finite("t_init", t_init)
        t_final = require_finite("t_final", t_final)
        if t_final <= t_init:
            raise ParameterError("t_final", f"must be greater than t_init ({t_init}), got {t_final}")
        return cls(
            kind="cubic",
            v0=require_finite("v0", v0),
            v_final=require_finite("v_final", v_final),
            t_init=t_init,
            t_final=t_final,
            integer=integer,
        )

    def value_at(self, step: float) -> float:
        t = require_finite("step", step)
        if self.kind == "constant":
            v = self.value
        elif self.kind == "piecewise":
            v = setpoint_at([list(p) for p in self.points], t)
        elif t <= self.t_init:
            v = self.v0
        elif t >= self.t_final:
            v = self.v_final
        else:
            remaining = 1.0 - (t - self.t_init) / (self.t_final - self.t_init)
            v = self.v_final + (self.v0 - self.v_final) * remaining**3
        return float(math.floor(v + 0.5)) if self.integer else v
