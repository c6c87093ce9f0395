"""Knob setters: the training-side half of a knob.

A setter knows where a knob lives in one trainer (optimizer param groups, ``trainer.beta``, a
layer's active rank, ...). ``read()`` returns the value in effect, read back from the object the
training step really uses; ``apply(value)`` writes it and returns ``read()`` afterwards, so the
agent reports what training uses, not what it asked for.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ._hf_compat import sync_last_lr

__all__ = ["KnobSetter", "KnobNotSupported", "LearningRateKnob"]


class KnobNotSupported(RuntimeError):
    """The knob cannot be changed mid-run for this trainer; the message says why and what to do."""


@runtime_checkable
class KnobSetter(Protocol):
    name: str

    def read(self) -> float:
        """The value in effect, read from the object training uses."""

    def apply(self, value: float) -> float:
        """Make ``value`` the value in effect from the next step on; return ``read()``."""


class LearningRateKnob:
    """Learning rate of a torch optimizer, optionally driven by a LambdaLR-style scheduler.

    **The knob is the schedule's peak.** HF schedulers are ``LambdaLR``: every
    ``scheduler.step()`` recomputes ``lr = base_lr * lr_lambda(step)`` and overwrites
    ``param_groups[i]["lr"]``. Under such a schedule the knob's value is ``base_lrs[0]`` (the
    learning rate the user configured, which warm-up rises to and decay falls from), and a
    decision rescales ``base_lrs``, the param groups' ``initial_lr`` and their current ``lr`` by
    the same factor: it takes effect at the next step and the schedule's shape (warm-up, decay)
    is kept *exactly*. Controlling the current lr instead would fight the schedule -- a controller
    holding "its" value would undo the decay since its previous decision, every decision.
    Without a LambdaLR schedule (none, or a metric-driven one such as ReduceLROnPlateau) the knob
    is the current learning rate.

    Param group 0 is the reference; other groups keep their ratio to it (layer-wise LR decay,
    no-decay groups, ...).
    """

    name = "learning_rate"

    def __init__(self, optimizer: Any, scheduler: Any | None = None) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler

    def _scheduled(self) -> bool:
        base = getattr(self.scheduler, "base_lrs", None)
        return bool(base) and hasattr(self.scheduler, "lr_lambdas")

    def read(self) -> float:
        """The knob's value: the schedule's peak under a LambdaLR schedule, else the current lr."""
        if self._scheduled():
            return float(self.scheduler.base_lrs[0])
        return float(self.optimizer.param_groups[0]["lr"])

    def current(self) -> float:
        """The learning rate the next optimizer step uses (param group 0)."""
        return float(self.optimizer.param_groups[0]["lr"])

    def nominal(self) -> float:
        """The value to register the knob with (bounds are set around it): :meth:`read`."""
        return self.read()

    def apply(self, value: float) -> float:
        value = float(value)
        reference = self.read()
        sched = self.scheduler if self._scheduled() else None
        if reference > 0:
            factor = value / reference
            for group in self.optimizer.param_groups:
                group["lr"] = float(group["lr"]) * factor
                if "initial_lr" in group:
                    group["initial_lr"] = float(group["initial_lr"]) * factor
            if sched is not None:
                sched.base_lrs = [float(b) * factor for b in sched.base_lrs]
        else:
            # A peak (or, unscheduled, an lr) of 0: ratios are undefined, so set every group to
            # the value itself -- its schedule position applied when there is a schedule.
            shape = 1.0
            if sched is not None:
                shape = float(sched.lr_lambdas[0](sched.last_epoch))
                sched.base_lrs = [value for _ in sched.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] = value * shape
                if "initial_lr" in group:
                    group["initial_lr"] = value
        if sched is not None:
            sync_last_lr(sched, self.optimizer)  # get_last_lr() (the trainer's logged lr) says the new value
        return self.read()
