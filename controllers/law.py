"""The seam between the engine and the control laws: one protocol, one output type.

A law is built from its controller's spec and the run's knob(s) (its registration's ``build``,
see :mod:`controllers.registry`) and updated as ``update(state, reading, dt, current) ->
LawOutput``: ``state`` is what it remembered (None at first), ``reading`` the filtered probe with
what the engine knows around it, ``dt`` the steps since the last update, ``current`` the knob's
value in effect (a mapping knob -> value for a law that drives several knobs). The engine does
the rest once for every law: filtering, the value in effect, hand-over after an override or a
reset, the decision and its reason line.

Standard library only, like every module of this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

__all__ = ["Reading", "LawOutput", "Law", "LawBase", "bounds", "fmt", "trend", "limits_text"]


@dataclass(frozen=True)
class Reading:
    """What a law reads at one observation: ``value`` the filtered probe, ``raw`` the probe as
    observed, ``previous`` the filtered value at the controller's last update (None at its first),
    ``step`` the optimizer step, ``values`` every probe and ``train.*`` value of the observation
    (a second input such as a maximiser's cost), ``last`` the components of the controller's last
    update."""

    value: float
    raw: float
    previous: float | None = None
    step: int = 0
    values: Mapping[str, float] = field(default_factory=dict)
    #: the components of the controller's last update (None before its first)
    last: Mapping[str, float] | None = None


@dataclass(frozen=True)
class LawOutput:
    """One update of any law.

    ``value``: the law's output (the knob's next value; a split-range law's output u);
    ``changed``: whether a knob moves; ``components``: the terms that made the output (stored as
    the decision's components); ``limits``: what held the output back (bounds, rate, ...);
    ``reason``: the reason line's parts ``(head, tail)``: the engine writes ``head: knob old ->
    new tail`` (a law moving several knobs names each move in ``head`` itself); ``state``: what the
    law remembers for its next update; ``moves``: the knobs that move and their new values
    (default: the one knob to ``value`` when ``changed``); ``notes``: numbers the law acted on
    besides the reading, kept beside its components in the controller's state; ``inputs``: what the
    decision records beyond the engine's own (probe, raw, filtered, dt)."""

    value: float
    changed: bool
    components: Mapping[str, float | None]
    limits: tuple[str, ...] = ()
    reason: tuple[str, str] = ("", "")
    state: Any = None
    moves: Mapping[str, float] | None = None
    notes: Mapping[str, float] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Law(Protocol):
    """What the engine asks of a law (see :class:`LawBase` for the defaults)."""

    #: the setpoint in force (shown in the controller's state), None for a law without one
    setpoint: float | None

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput: ...

    def handover(self, state: Any, reading: Reading, current: Any) -> Any:
        """The state to go on from while someone else holds the knob, or when control comes back."""
        ...

    def in_effect(self, knob: str, value: float) -> float:
        """The value in effect as the law acts on it (clamped into its bounds, rounded)."""
        ...

    @classmethod
    def ready(cls, spec: Any, values: Mapping[str, float]) -> bool:
        """Whether the observation carries every input ``spec``'s law needs besides its probe."""
        ...

    def load(self, memory: Any) -> Any:
        """The law's state from the controller's memory (its ``law`` or ``pid`` field)."""
        ...

    def keep(self, memory: Any, state: Any) -> None:
        """Store ``state`` in the controller's memory."""
        ...


class LawBase:
    """Defaults for a law: no setpoint, the value in effect as reported, ready whenever its probe
    is, a hand-over that keeps the state, and the state kept as a dict in the controller's ``law``
    field (``state_to_dict`` / ``state_from_dict``: a plain dict by default)."""

    setpoint: float | None = None
    #: see controllers/registry.py's LawKind: an operator may set this kind's setpoint (None), and
    #: gains auto does not apply to it
    no_setpoint: ClassVar[str | None] = None
    identifies: ClassVar[bool] = False
    #: the state's class: ``from_dict``/``to_dict`` read and write the stored memory (None: a dict)
    State: ClassVar[Any] = None

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        raise NotImplementedError

    def handover(self, state: Any, reading: Reading, current: Any) -> Any:
        return state

    def in_effect(self, knob: str, value: float) -> float:
        return value

    @classmethod
    def ready(cls, spec: Any, values: Mapping[str, float]) -> bool:
        return True

    def load(self, memory: Any) -> Any:
        stored = memory.law
        if not stored:
            return None
        return self.State.from_dict(stored) if self.State is not None else dict(stored)

    def keep(self, memory: Any, state: Any) -> None:
        if state is None:
            return
        memory.law = state.to_dict() if hasattr(state, "to_dict") else dict(state)


def bounds(spec: Any, knob: Any) -> tuple[Any, Any]:
    """A controller's bounds on a run's knob: the knob's, tightened by the controller's ``min`` and
    ``max`` where it states them (numbers kept as given: an int bound stays an int)."""
    lo = knob.min if spec.min is None else max(knob.min, spec.min)
    hi = knob.max if spec.max is None else min(knob.max, spec.max)
    return lo, hi


def fmt(x: float) -> str:
    """A number in a reason line."""
    return f"{x:.4g}"


def trend(reading: Reading) -> str:
    """`` and rising`` / `` and falling`` against the previous filtered value ("" when unknown or equal)."""
    prev, now = reading.previous, reading.value
    return "" if prev is None or now == prev else (" and rising" if now > prev else " and falling")


def limits_text(limited_by: tuple[str, ...]) -> str:
    """What held a law's output back, for a decision's reason."""
    text = f", limited by {', '.join(limited_by)}" if limited_by else ""
    if "overflow" in limited_by:
        text += " (a term of the law passed the float range: clamped to the largest finite value)"
    return text
