"""The law registry: each controller kind's document model and its law, registered once.

``register(kind, spec=..., law=...)`` is all a new law needs besides its module: the policy
documents accept ``kind: <kind>`` (validated by ``spec``, a model of :mod:`actuator.policy`), the
engine builds and updates the law through :class:`LawKind`'s class methods, and the operator
actions, the CLI and the API ask the registration what the kind allows. The shipped kinds are
registered by :mod:`actuator.policy`; a law outside the package is registered by importing its
module (a service imports the modules named in ``ACTUATOR_PLUGINS`` at start).

Standard library only: ``spec`` is held as an opaque class here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from .law import Law

__all__ = ["At", "LawKind", "Registration", "undeclared", "register", "registration", "registrations", "kinds", "on_register"]


@dataclass(frozen=True)
class At:
    """Where a law is built: the optimizer step, an operator's setpoint for the run (None: the
    policy's), the probe's first filtered value (the reference of a relative setpoint), and a
    fitted model's ``(rate, drift, u_ref)`` where gains auto fitted an integrating plant."""

    step: int = 0
    setpoint_override: Any = None
    baseline: float | None = None
    model: tuple[float, float, float] | None = None


class LawKind(Law, Protocol):
    """What a registered law class provides besides :class:`~controllers.law.Law`'s methods.

    ``inputs`` lists everything a law is made of (the engine keeps one law per distinct inputs, so
    the inputs must be hashable and complete); ``build`` makes and validates it, raising
    ParameterError when it cannot run on the run's knobs. ``check`` (optional) explains why a law
    cannot run on a run's knobs, with the document's field to change."""

    #: an operator may give this kind a setpoint for a run: None; else why not (``{name}``,
    #: ``{probe}`` filled in), e.g. "{name!r} maximizes {probe}; it has no setpoint to change"
    no_setpoint: ClassVar[str | None] = None
    #: gains auto (a warm-up step test and a fit) applies to this kind; its law then also has
    #: ``takeover(current) -> state`` (act at once when the test ends early)
    identifies: ClassVar[bool] = False

    @classmethod
    def inputs(cls, spec: Any, knobs: Mapping[str, Any], at: At) -> tuple[Any, ...]: ...

    @classmethod
    def build(cls, spec: Any, knobs: Mapping[str, Any], inputs: tuple[Any, ...]) -> Law: ...


@dataclass(frozen=True)
class Registration:
    kind: str
    spec: type
    law: type[LawKind]


_REGISTRY: dict[str, Registration] = {}
_LISTENERS: list[Callable[[Registration], None]] = []


def register(kind: str, *, spec: type, law: type[Any]) -> Registration:
    """Register (or replace) the law of ``kind`` and its document model."""
    if not kind or not kind.replace("_", "").isalnum() or kind == "?":
        raise ValueError(f"a law's kind is a name of letters, digits and '_', got {kind!r}")
    for method in ("inputs", "build", "update"):
        if not callable(getattr(law, method, None)):
            raise TypeError(f"law {law.__name__} of kind {kind!r} has no {method}()")
    reg = _REGISTRY[kind] = Registration(kind, spec, law)
    for listener in _LISTENERS:
        listener(reg)
    return reg


def on_register(listener: Callable[[Registration], None]) -> None:
    """Call ``listener`` with every registration from now on (the policy documents' kinds)."""
    _LISTENERS.append(listener)


def registration(kind: str) -> Registration:
    """The registration of ``kind``; KeyError naming the kinds there are."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise KeyError(f"no law of kind {kind!r} is registered (kinds: {sorted(_REGISTRY)})") from None


def registrations() -> list[Registration]:
    return list(_REGISTRY.values())


def kinds() -> list[str]:
    return list(_REGISTRY)


def undeclared(loc: str, controller: str, knob: str, declared: list[str]) -> dict[str, str]:
    """The error of a controller driving a knob the run does not declare (``knob_errors``)."""
    return {"loc": loc, "msg": f"controller {controller!r} drives knob {knob!r}, which the run does not declare "
                               f"(knobs: {declared})"}
