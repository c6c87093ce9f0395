"""Measurement filters: a controller acts on a filtered probe value, never the raw one.

Probes are small evaluations (a few hundred held-out examples), so their readings carry sampling
noise of several percent. Fed raw into a PID, that noise goes straight through the proportional
and derivative terms into the knob. The filter is part of the policy because it trades noise for
lag, and lag is what a loop's stability depends on.

Every filter has the same shape as the PID: ``update(x, state) -> (filtered, new_state)``, with
a JSON-serialisable state, so the service can store it between observations.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ._checks import ParameterError, require_finite, saturate

__all__ = [
    "FilterKind",
    "Filter",
    "PassthroughState",
    "EMAState",
    "MedianState",
    "Passthrough",
    "EMA",
    "Median",
    "make_filter",
]

FilterKind = Literal["none", "ema", "median"]


class Filter(Protocol):
    """What the engine needs from any filter."""

    def update(self, x: float, state: Any = None) -> tuple[float, Any]: ...

    def state_from_dict(self, d: dict[str, Any]) -> Any: ...


@dataclass
class PassthroughState:
    """Only counts observations, so every filter has a state of the same kind."""

    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PassthroughState:
        return cls(count=int(d.get("count", 0)))


@dataclass
class EMAState:
    """``value`` is None until the first observation, which initialises the average."""

    value: float | None = None
    count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "count": self.count}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EMAState:
        v = d.get("value")
        return cls(value=None if v is None else float(v), count=int(d.get("count", 0)))


@dataclass
class MedianState:
    """The last ``window`` raw observations, oldest first."""

    values: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"values": list(self.values)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MedianState:
        return cls(values=[float(v) for v in d.get("values", [])])


class Passthrough:
    """No filtering: for probes that are already averages over many examples."""

    kind: FilterKind = "none"

    def update(self, x: float, state: PassthroughState | None = None) -> tuple[float, PassthroughState]:
        x = require_finite("x", x)
        count = 0 if state is None else state.count
        return x, PassthroughState(count=count + 1)

    def state_from_dict(self, d: dict[str, Any]) -> PassthroughState:
        return PassthroughState.from_dict(d)


class EMA:
    """Exponential moving average, ``alpha`` = weight of the newest value.

    Initialised with the first value rather than zero, because a zero start would read as a
    huge error to the controller for the first few decisions.
    """

    kind: FilterKind = "ema"

    def __init__(self, alpha: float) -> None:
        alpha = require_finite("alpha", alpha)
        if not 0.0 < alpha <= 1.0:
            raise ParameterError("alpha", f"must be in (0, 1], got {alpha}")
        self.alpha = alpha

    def update(self, x: float, state: EMAState | None = None) -> tuple[float, EMAState]:
        x = require_finite("x", x)
        if state is None or state.value is None:
            filtered = x
            count = 0 if state is None else state.count
        else:
            filtered = state.value + self.alpha * (x - state.value)
            if not math.isfinite(filtered):
                # x - value overflowed (values near the float range): the same average, weighted
                # the other way round, stays between the two finite values (up to rounding).
                filtered = saturate((1.0 - self.alpha) * state.value + self.alpha * x)
            count = state.count
        return filtered, EMAState(value=filtered, count=count + 1)

    def state_from_dict(self, d: dict[str, Any]) -> EMAState:
        return EMAState.from_dict(d)


class Median:
    """Running median over the last ``window`` observations.

    Rejects isolated outliers (a probe batch that hit a degenerate example) completely, where an
    EMA would only dilute them; costs about ``window // 2`` observations of lag.
    """

    kind: FilterKind = "median"

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ParameterError("window", f"must be an integer >= 1, got {window!r}")
        self.window = window

    def update(self, x: float, state: MedianState | None = None) -> tuple[float, MedianState]:
        x = require_finite("x", x)
        previous = [] if state is None else state.values
        values = (list(previous) + [x])[-self.window :]
        median = float(statistics.median(values))
        if not math.isfinite(median):  # the mean of the middle two overflowed: halve them first
            lo, hi = sorted(values)[len(values) // 2 - 1 : len(values) // 2 + 1]
            median = lo / 2 + hi / 2
        return median, MedianState(values=values)

    def state_from_dict(self, d: dict[str, Any]) -> MedianState:
        return MedianState.from_dict(d)


def make_filter(kind: FilterKind, **params: Any) -> Passthrough | EMA | Median:
    """Build a filter from a policy's filter spec.

    Parameters that do not belong to ``kind`` are ignored on purpose: a policy's filter spec
    carries defaults for every kind (``alpha`` and ``window``), and callers pass them all.
    Parameters that are not filter parameters at all are rejected, since they are typos.
    """
    unknown = set(params) - {"alpha", "window"}
    if unknown:
        raise ParameterError(sorted(unknown)[0], "is not a filter parameter (known: alpha, window)")
    if kind == "none":
        return Passthrough()
    if kind == "ema":
        if params.get("alpha") is None:
            raise ParameterError("alpha", "an 'ema' filter needs alpha")
        return EMA(params["alpha"])
    if kind == "median":
        if params.get("window") is None:
            raise ParameterError("window", "a 'median' filter needs window")
        return Median(params["window"])
    raise ParameterError("kind", f"must be one of ('none', 'ema', 'median'), got {kind!r}")
