"""A law whose knob follows a probe through a monotone schedule.

Some knobs have a right value that is a known function of what a probe measures, not a value to
hold a probe at nor a peak to search for. The LK losses (Samarin et al. 2026, "LK losses: direct
acceptance-rate optimisation for speculative decoding") move a draft's training objective from KL
towards total variation *as the measured acceptance α rises*: KL's large gradients first, the
quantity speculative decoding pays for once the draft is close. That is a schedule ``knob =
f(probe)``, and this law runs one:

    target_k = f(y_k)          f piecewise linear through points (x_0, v_0) < (x_1, v_1) < ...,
                               held flat at v_0 below x_0 and at v_n above x_n
    u_k      = limit(target_k)  bounds, at most ``max_step`` from the value in effect (in the
                               knob's scale), bounds again, integer rounding

``y_k`` is the probe's filtered value (the filter is the policy's, applied by the caller). The
points' probe values are strictly increasing and their knob values monotone (all rising or all
falling), so a probe that moves one way moves the knob one way: a noisy probe cannot make the
knob zig-zag through a bump of the schedule. Interpolation is in knob units.

No state: the same filtered probe and value in effect give the same output, so a restart, an
override handed back or a policy move needs no bumpless transfer (the rate limit alone keeps the
first move small). Standard library only, like the rest of ``controllers``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._checks import ParameterError, require_finite, require_positive
from .law import LawBase, LawOutput, Reading, bounds, fmt, limits_text, trend
from .limits import KnobLimits

__all__ = ["FollowConfig", "FollowOutput", "Follow", "check_schedule", "schedule_at"]


def check_schedule(points: Sequence[Sequence[float]]) -> tuple[tuple[float, float], ...]:
    """The schedule as ``((probe, knob), ...)`` floats, or :class:`ParameterError` (field
    ``schedule``) saying what is wrong: fewer than 2 points, a value that is not a finite number,
    probe values not strictly increasing, knob values not monotone."""
    if len(points) < 2:
        raise ParameterError("schedule", f"needs at least 2 points [probe, knob], got {len(points)}")
    pts = []
    for i, point in enumerate(points):
        if len(point) != 2:
            raise ParameterError("schedule", f"point {i} must be [probe value, knob value], got {point!r}")
        pts.append((require_finite(f"schedule.{i}.0", point[0]), require_finite(f"schedule.{i}.1", point[1])))
    for i in range(1, len(pts)):
        if not pts[i][0] > pts[i - 1][0]:
            raise ParameterError("schedule", f"the probe values must be strictly increasing (sorted): point {i} "
                                             f"({pts[i][0]:g}) is not above point {i - 1} ({pts[i - 1][0]:g})")
    steps = [b[1] - a[1] for a, b in zip(pts, pts[1:])]
    if any(s > 0 for s in steps) and any(s < 0 for s in steps):
        raise ParameterError("schedule", "the knob values must be monotone (all non-decreasing or all "
                                         f"non-increasing), got {[v for _, v in pts]}")
    return tuple(pts)


def schedule_at(points: Sequence[tuple[float, float]], x: float) -> tuple[float, int, int]:
    """``(value, i, j)``: the schedule's knob value at probe value ``x`` and the points it lies
    between (``i == j``: on point i, or held at the first / last point outside the schedule)."""
    if x <= points[0][0]:
        return points[0][1], 0, 0
    last = len(points) - 1
    if x >= points[last][0]:
        return points[last][1], last, last
    for i in range(last):
        (x0, v0), (x1, v1) = points[i], points[i + 1]
        if x == x1:
            return v1, i + 1, i + 1
        if x0 < x < x1:
            return v0 + (v1 - v0) * (x - x0) / (x1 - x0), i, i + 1
    raise AssertionError("unreachable: the probe values are strictly increasing")


@dataclass(frozen=True)
class FollowConfig:
    """One follow law: the schedule ``points`` ((probe value, knob value), ...), the knob's bounds
    (knob units), its ``scale`` and the largest change per decision ``max_step`` (scale units)."""

    points: tuple[tuple[float, float], ...]
    out_min: float = -math.inf
    out_max: float = math.inf
    scale: str = "linear"
    max_step: float | None = None

    def validate(self) -> None:
        """Raise :class:`ParameterError` naming the first invalid field."""
        check_schedule(self.points)
        for name in ("out_min", "out_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ParameterError(name, f"must be a number, got {value!r}")
        if self.out_min > self.out_max:
            raise ParameterError("out_min", f"out_min ({self.out_min}) is above out_max ({self.out_max})")
        if self.scale not in ("linear", "log", "integer"):
            raise ParameterError("scale", f"must be 'linear', 'log' or 'integer', got {self.scale!r}")
        if self.scale == "log" and not self.out_min > 0:
            raise ParameterError("out_min", f"a log-scale knob needs out_min > 0, got {self.out_min}")
        if self.scale == "integer" and math.ceil(self.out_min) > math.floor(self.out_max):
            raise ParameterError("out_min", f"no integer in [{self.out_min}, {self.out_max}]")
        if self.max_step is not None:
            require_positive("max_step", self.max_step)


@dataclass(frozen=True)
class FollowOutput:
    """``value``: the knob value to apply; ``target``: the schedule's value at the probe (before
    the limits); ``segment``: the points the probe lies between (see :func:`schedule_at`);
    ``limited_by``: the limits that held the target back (``bounds``, ``rate``, ``integer``)."""

    value: float
    target: float
    segment: tuple[int, int]
    limited_by: tuple[str, ...]
    changed: bool


class Follow:
    """The follow law of a validated :class:`FollowConfig`."""

    def __init__(self, config: FollowConfig) -> None:
        config.validate()
        self.config = config
        self.points = check_schedule(config.points)
        self._limits = KnobLimits(float(config.out_min), float(config.out_max), config.scale, config.max_step)

    def update(self, probe: float, current: float) -> FollowOutput:
        """The knob value for filtered probe value ``probe``, from ``current`` (the value in effect)."""
        y = require_finite("probe", probe)
        cur = require_finite("current", current)
        target, i, j = schedule_at(self.points, y)
        limits: set[str] = set()
        value = self._limits.limit(cur, target, limits)
        return FollowOutput(value=value, target=target, segment=(i, j), limited_by=tuple(sorted(limits)),
                            changed=value != cur)

    def where(self, segment: tuple[int, int]) -> str:
        """The schedule's points a segment names, for a decision's reason: ``between points 1
        [0.3, 0.2] and 2 [0.5, 0.6]``, ``at point 1 [0.3, 0.2]``, ``held at the first point [...]``."""
        i, j = segment
        pt = lambda k: f"[{self.points[k][0]:.4g}, {self.points[k][1]:.4g}]"  # noqa: E731
        if i != j:
            return f"between points {i} {pt(i)} and {j} {pt(j)}"
        if i == 0:
            return f"at or below the first point {pt(0)}"
        if i == len(self.points) - 1:
            return f"at or above the last point {pt(i)}"
        return f"at point {i} {pt(i)}"


# -- the law seam (controllers/law.py) -------------------------------------------------------------

class FollowLaw(LawBase):
    """``kind: follow``: the knob goes to the schedule's value at the filtered probe, within the
    bounds and at most ``max_step`` from the value in effect. The law has no state, so an override,
    another controller's move or control handed back needs no restart: it only stands aside while
    the knob is someone else's. The value in effect is taken as reported, even outside the bounds:
    the law brings it back at once."""

    no_setpoint = "{name!r} follows {probe} on a schedule; it has no setpoint to change (change the policy's schedule)"

    def __init__(self, config: FollowConfig, spec: Any) -> None:
        self.law = Follow(config)  # validates
        self.config, self.spec = config, spec

    @staticmethod
    def follow_config(spec: Any, knob: Any) -> FollowConfig:
        """The follow law of a ``kind: follow`` controller on this run's knob: the schedule, bounds
        and scale as for a PID, ``max_step`` the controller's or else the knob's."""
        lo, hi = bounds(spec, knob)
        return FollowConfig(points=tuple((float(x), float(y)) for x, y in spec.schedule or ()), out_min=lo,
                            out_max=hi, scale=spec.scale or knob.scale,
                            max_step=spec.max_step if spec.max_step is not None else knob.max_step)

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        cfg = cls.follow_config(spec, knobs[spec.knob])
        return (cfg.out_min, cfg.out_max, cfg.scale, cfg.max_step)

    @classmethod
    def build(cls, spec: Any, knobs: Any, inputs: tuple[Any, ...]) -> FollowLaw:
        """Raises ParameterError when it cannot run on this knob, including a schedule whose knob
        values leave the run's bounds (the law would clamp them, and the schedule would not say
        what the knob does)."""
        cfg = cls.follow_config(spec, knobs[spec.knob])
        law = cls(cfg, spec)
        outside = [y for _, y in law.law.points if not cfg.out_min <= y <= cfg.out_max]
        if outside:
            raise ParameterError("schedule", f"knob values {outside} are outside the bounds [{cfg.out_min:g}, "
                                             f"{cfg.out_max:g}]")
        return law

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        spec, cfg, law = self.spec, self.config, self.law
        out = law.update(reading.value, current)
        head = (f"follow {spec.name}: {spec.probe} {fmt(reading.value)}{trend(reading)} -> {spec.knob} "
                f"{fmt(out.target)} ({law.where(out.segment)})")
        return LawOutput(
            value=out.value, changed=out.changed, components={"target": out.target}, limits=out.limited_by,
            reason=(head, limits_text(out.limited_by)),
            inputs={"probe": spec.probe, "raw": reading.raw, "filtered": reading.value, "dt": dt,
                    "schedule": [list(p) for p in law.points], "segment": list(out.segment),
                    "limited_by": list(out.limited_by), "bounds": [cfg.out_min, cfg.out_max],
                    "max_step": cfg.max_step, "scale": cfg.scale})
