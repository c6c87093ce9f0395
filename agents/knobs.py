"""Knob setters: the training-side half of a knob.

A setter knows where a knob lives in one trainer (optimizer param groups, ``trainer.beta``, a
layer's active rank, ...). ``read()`` returns the value in effect, read back from the object the
training step really uses; ``apply(value)`` writes it and returns ``read()`` afterwards, so the
agent reports what training uses, not what it asked for.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

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

    HF schedulers are ``LambdaLR``: every ``scheduler.step()`` recomputes
    ``lr = base_lr * lr_lambda(step)`` and overwrites ``param_groups[i]["lr"]``. Writing the
    param group alone is therefore undone one step later. We scale ``scheduler.base_lrs`` (and
    the param groups' ``initial_lr``) by the same factor as the current lr so the schedule's
    shape (warm-up, decay) survives and the new peak is what the controller ordered.

    The knob's value is the *current* learning rate of param group 0; other groups keep their
    ratio to group 0 (layer-wise LR decay, no-decay groups, ...).
    """

    name = "learning_rate"

    def __init__(self, optimizer: Any, scheduler: Any | None = None) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler

    def read(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def nominal(self) -> float:
        """The value to register the knob with: the lr in effect, or during warm-up from 0 the
        schedule's peak (``base_lrs``), so bounds are set around the lr the user configured."""
        value = self.read()
        if value > 0:
            return value
        base = getattr(self.scheduler, "base_lrs", None)
        if base:
            return float(base[0])
        return float(self.optimizer.param_groups[0].get("initial_lr", value))

    def apply(self, value: float) -> float:
        value = float(value)
        current = self.read()
        if current > 0:
            factor = value / current
            for group in self.optimizer.param_groups:
                group["lr"] = float(group["lr"]) * factor
                if "initial_lr" in group:
                    group["initial_lr"] = float(group["initial_lr"]) * factor
            sched = self.scheduler
            if sched is not None and hasattr(sched, "base_lrs"):
                sched.base_lrs = [float(b) * factor for b in sched.base_lrs]
                if hasattr(sched, "_last_lr"):
                    sched._last_lr = [float(g["lr"]) for g in self.optimizer.param_groups]
        else:
            # lr is 0 now (e.g. first warm-up step): ratios are undefined, so set every group and
            # base lr to the value itself.
            for group in self.optimizer.param_groups:
                group["lr"] = value
                if "initial_lr" in group:
                    group["initial_lr"] = value
            if self.scheduler is not None and hasattr(self.scheduler, "base_lrs"):
                self.scheduler.base_lrs = [value for _ in self.scheduler.base_lrs]
        return self.read()
