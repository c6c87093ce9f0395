"""A knob's limits: bounds, a per-decision rate limit in the knob's scale, integer rounding.

One implementation for every place a value is clamped before it reaches a knob: the PID's output
(in scale units, inside the law, where anti-windup needs to know which limit held), the service's
decisions and the agent's guard (``actuator.catalogue.limit``, in knob units).

* **Scale.** ``"log"`` knobs (learning rate, beta) are limited in ``ln(knob)``: ``max_step=0.5``
  allows at most a factor e**0.5 ~ 1.65 per decision. ``"linear"`` and ``"integer"`` knobs are
  limited in knob units.
* **Order.** bounds -> rate -> bounds again -> integer rounding. Bounds win over the rate limit:
  a knob found outside its bounds (an operator typed a bad value) is brought back at once,
  because bounds are the user's hard statement of what is safe.
* **Integers.** Nearest integer (halves round up), then kept inside the integer bounds and the
  rate window, so rounding never undoes a limit applied before it.
* **Exactness.** A value no limit moved is returned as given (no ``exp(log(x))`` round trip), and
  a value held at a bound is the bound exactly.

Standard library only, like the rest of ``controllers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["KnobLimits", "limited"]


def limited(u: float, cur: float, max_step: float | None, bounded: Callable[[float, set[str]], float],
            limits: set[str]) -> float:
    """``u`` inside the bounds (``bounded(value, limits)``), then within ``max_step`` of ``cur``,
    then inside the bounds again: bounds win over the rate limit, which only binds there when the
    knob was already outside its bounds. Each limit that acted is added to ``limits``. All values
    in scale units."""
    s = bounded(u, limits)
    if max_step is not None:
        if s > cur + max_step:
            s = cur + max_step
            limits.add("rate")
        elif s < cur - max_step:
            s = cur - max_step
            limits.add("rate")
        s = bounded(s, limits)
    return s


@dataclass(frozen=True)
class KnobLimits:
    """Bounds ``[out_min, out_max]`` in knob units, ``scale`` and ``max_step`` in scale units."""

    out_min: float = -math.inf
    out_max: float = math.inf
    scale: str = "linear"
    max_step: float | None = None
    lo: float = field(init=False, repr=False, compare=False)
    hi: float = field(init=False, repr=False, compare=False)

    # -- scale ---------------------------------------------------------------------------------
    def to_scale(self, x: float) -> float:
        if self.scale == "log":
            if x <= 0:
                return -math.inf
            return math.log(x) if x < math.inf else math.inf
        return x

    def from_scale(self, s: float) -> float:
        if self.scale == "log":
            try:
                return math.exp(s)
            except OverflowError:
                return math.inf
        return s

    def __post_init__(self) -> None:
        # the bounds in scale units, computed once (a law clamps several times per update)
        object.__setattr__(self, "lo", self.to_scale(self.out_min) if self.out_min > -math.inf else -math.inf)
        object.__setattr__(self, "hi", self.to_scale(self.out_max))

    # -- the limits, in scale units --------------------------------------------------------------
    def bounded(self, s: float, limits: set[str]) -> float:
        hi, lo = self.hi, self.lo
        if s > hi:
            limits.add("bounds")
            return hi
        if s < lo:
            limits.add("bounds")
            return lo
        return s

    def limited(self, u: float, cur_s: float, limits: set[str]) -> float:
        """Bounds, rate limit around ``cur_s``, bounds again (all in scale units)."""
        return limited(u, cur_s, self.max_step, self.bounded, limits)

    def to_knob(self, value_s: float, cur_s: float | None, cur: float | None) -> float:
        """Back to knob units, exactly: exp(log(x)) can miss x by one ulp, and a bound missed
        by one ulp is a bound violated."""
        if cur_s is not None and cur is not None and value_s == cur_s:
            return cur
        if value_s == self.lo:
            return self.out_min
        if value_s == self.hi:
            return self.out_max
        return min(max(self.from_scale(value_s), self.out_min), self.out_max)

    def round(self, value: float, cur: float | None, limits: set[str]) -> float:
        """Nearest integer (halves round up), then kept inside the integer bounds and the rate
        window around ``cur`` (None: no window), so rounding can never undo a limit applied
        before it."""
        r = float(math.floor(value + 0.5))
        step = self.max_step
        if step is not None and cur is not None and math.isfinite(cur + step) and math.isfinite(cur - step):
            r = min(r, float(math.floor(cur + step + 1e-9)))
            r = max(r, float(math.ceil(cur - step - 1e-9)))
        r = min(max(r, float(math.ceil(self.out_min))), float(math.floor(self.out_max)))
        if r != value:
            limits.add("integer")
        return r

    # -- the whole operation, in knob units ------------------------------------------------------
    def limit(self, current: float | None, ordered: float, limits: set[str] | None = None) -> float:
        """``ordered`` made safe to apply to a knob whose value in effect is ``current``: inside
        the bounds, within ``max_step`` of ``current`` (no rate window when ``current`` is None, not
        finite, or not > 0 on a log scale), inside the bounds again, rounded if integer. The
        limits that acted are added to ``limits``."""
        if math.isnan(ordered):
            raise ValueError("the ordered value is not a number")
        limits = set() if limits is None else limits
        usable = current is not None and math.isfinite(current) and (self.scale != "log" or current > 0)
        cur = current if usable else None
        ordered_s = self.to_scale(ordered)
        if cur is None:
            value_s, cur_s = self.bounded(ordered_s, limits), None
        else:
            cur_s = self.to_scale(cur)
            value_s = self.limited(ordered_s, cur_s, limits)
        value = float(ordered) if value_s == ordered_s else self.to_knob(value_s, cur_s, cur)
        if self.scale == "integer":
            value = self.round(value, cur, limits)
        return float(value)
