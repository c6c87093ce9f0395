"""Knob setters: the training-side half of a knob.

A setter knows where a knob lives in one trainer (optimizer param groups, ``trainer.beta``, a
layer's active rank, ...). ``read()`` returns the value in effect, read back from the object the
training step really uses; ``apply(value)`` writes it and returns ``read()`` afterwards, so the
agent reports what training uses, not what it asked for.

**Where a knob's setter is found.** A setter *factory* registers beside its setter, under the
knob's name, with :func:`knob_setter` (``learning_rate`` here; ``kl_weight`` in anchor.py; ``kl_beta``
in trl_knobs.py; the distillation knobs in distill.py; ``rank`` and the thresholds in
compression/). :func:`setter_for` finds the setter of a knob from the trainer, and imports every
registering module first, so a knob is never "unknown" because its module was not imported. The
knob's defaults (bounds, scale, rate limit) are in the catalogue (``actuator.catalogue``); passing
a :class:`~actuator.catalogue.Knob` to :func:`knob_setter` adds a new knob to both at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from actuator._exceptions import ActuatorError, ConfigError
from actuator.catalogue import Knob, register_knob

from ._hf_compat import sync_last_lr

__all__ = ["KnobSetter", "KnobNotSupported", "LearningRateKnob", "SetterFactory", "knob_setter", "setter_for",
           "setter_hint", "registered_setters", "unwrap_scheduler"]


class KnobNotSupported(ActuatorError, RuntimeError):
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


def unwrap_scheduler(sched: Any) -> Any:
    """The LambdaLR that owns ``base_lrs`` (accelerate's AcceleratedScheduler wraps it)."""
    while sched is not None and not hasattr(sched, "base_lrs") and hasattr(sched, "scheduler"):
        sched = sched.scheduler
    return sched


# -- the setter registry -------------------------------------------------------------------------

SetterFactory = Callable[..., KnobSetter]
"""``factory(*, trainer, optimizer, lr_scheduler, model) -> KnobSetter``: the setter of one knob,
found from the trainer (any of the four may be None). It raises :class:`KnobNotSupported` when
this trainer cannot have the knob changed (the message says why), or ``ConfigError`` for a
message that must stand on its own."""


@dataclass(frozen=True)
class _Registration:
    factory: SetterFactory
    hint: str  # the setter to pass by hand, as error messages name it
    needs_trainer: bool


_REGISTRY: dict[str, _Registration] = {}
# The modules whose setters register themselves (relative to actuator.agents).
_REGISTERING_MODULES = (".anchor", ".trl_knobs", ".distill", ".compression")


def knob_setter(knob: str | Knob, *, hint: str, needs_trainer: bool = True) -> Callable[[SetterFactory], SetterFactory]:
    """Register the decorated factory as the setter of ``knob``. ``hint`` is the setter a user
    can pass by hand (``setters=[...]``), as error messages name it. ``needs_trainer``: the factory
    reads the trainer, so a callback without one says how to attach it. A :class:`Knob` (a knob
    the catalogue does not ship) is added to the catalogue too: one registration adds a knob."""

    def register(factory: SetterFactory) -> SetterFactory:
        if isinstance(knob, Knob):
            register_knob(knob)
        name = knob.name if isinstance(knob, Knob) else knob
        known = _REGISTRY.get(name)
        if known is not None and known.factory.__qualname__ != factory.__qualname__:
            raise ValueError(f"knob {name!r} already has a setter factory: {known.factory.__qualname__}")
        _REGISTRY[name] = _Registration(factory, hint, needs_trainer)
        return factory

    return register


def _load_registrations() -> None:
    for module in _REGISTERING_MODULES:
        importlib.import_module(module, __package__)


def registered_setters() -> dict[str, str]:
    """Every knob with a registered setter factory, and its hint."""
    _load_registrations()
    return {name: reg.hint for name, reg in sorted(_REGISTRY.items())}


def setter_hint(name: str) -> str | None:
    """The setter a user can pass for knob ``name`` (``"actuator.agents.trl_knobs.KLBetaKnob(trainer)"``)."""
    _load_registrations()
    reg = _REGISTRY.get(name)
    return reg.hint if reg is not None else None


def setter_for(name: str, *, trainer: Any = None, optimizer: Any = None, lr_scheduler: Any = None,
               model: Any = None) -> KnobSetter:
    """The setter of knob ``name``, found from the trainer (its optimizer, scheduler and model are
    passed apart because Trainer hooks hand them over before the trainer has them). Raises
    ``ConfigError`` naming the knob and what to pass instead."""
    _load_registrations()
    reg = _REGISTRY.get(name)
    if reg is None:
        raise ConfigError(f"knobs.{name}: no setter for this knob; pass setters=[...] with an object that has "
                          "name, read() and apply(value) (the KnobSetter protocol, actuator.agents.knobs)")
    if reg.needs_trainer and trainer is None:
        raise ConfigError(f"knobs.{name}: the callback could not find its trainer; attach it with "
                          f".attach(trainer), or pass setters=[{reg.hint}]")
    try:
        return reg.factory(trainer=trainer, optimizer=optimizer, lr_scheduler=lr_scheduler, model=model)
    except KnobNotSupported as exc:
        raise ConfigError(f"knobs.{name}: {exc} (the setter the callback tried: {reg.hint})") from exc


@knob_setter("learning_rate", hint="actuator.agents.knobs.LearningRateKnob(optimizer, scheduler)",
             needs_trainer=False)
def _learning_rate(*, optimizer: Any, lr_scheduler: Any, trainer: Any = None, **_: Any) -> KnobSetter:
    if optimizer is None:
        raise ConfigError("knobs.learning_rate: the trainer has no optimizer yet")
    sched = unwrap_scheduler(lr_scheduler)
    if getattr(trainer, "is_deepspeed_enabled", False) and sched is not None and not hasattr(sched, "lr_lambdas"):
        # Measured (DeepSpeed 0.19, ZeRO-3, WarmupLR from the config): the scheduler steps inside
        # engine.step() and writes its own lr back, so a write to param_groups lasted one step.
        raise KnobNotSupported(
            f"under DeepSpeed the learning rate is steered through the Trainer's own schedule (a LambdaLR: leave "
            f"\"scheduler\" out of the DeepSpeed config); {type(sched).__name__} from the DeepSpeed config steps "
            "inside engine.step() and puts its own lr back, so a change would last one step")
    return LearningRateKnob(optimizer, sched)
