"""Setpoint schedules: a constant, or piecewise-linear points over training steps.

Targets often should move with the run (allow more drift late in training, tighten a KL target
after warm-up). A schedule is data in the policy, so it stays auditable; the PID itself only ever
sees the value at the current step and takes its derivative on the measurement, so a moving
setpoint never kicks the knob through the D term.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ._checks import ParameterError, require_finite

__all__ = ["Setpoint", "validate_setpoint", "setpoint_at"]

# Points may come straight from JSON/YAML, where pairs arrive as lists rather than tuples.
Setpoint = float | Sequence[Sequence[float]]


def validate_setpoint(spec: Setpoint) -> list[tuple[float, float]] | float:
    """Return the normalised schedule (a float, or a list of ``(step, value)`` tuples).

    Steps must be strictly increasing: the order in the document is the schedule, and silently
    sorting would hide a typo in a step number.
    """
    if isinstance(spec, bool):
        raise ParameterError("setpoint", f"must be a number or a list of (step, value) points, got {spec!r}")
    if isinstance(spec, (int, float)):
        return require_finite("setpoint", spec)
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence) or len(spec) == 0:
        raise ParameterError(
            "setpoint", f"must be a number or a non-empty list of (step, value) points, got {spec!r}"
        )
    points: list[tuple[float, float]] = []
    for k, pt in enumerate(spec):
        if isinstance(pt, (str, bytes)) or not isinstance(pt, Sequence) or len(pt) != 2:
            raise ParameterError(f"setpoint[{k}]", f"must be a (step, value) pair, got {pt!r}")
        step = require_finite(f"setpoint[{k}].step", pt[0])
        value = require_finite(f"setpoint[{k}].value", pt[1])
        if points and step <= points[-1][0]:
            raise ParameterError(
                f"setpoint[{k}].step", f"steps must be strictly increasing ({points[-1][0]} then {step})"
            )
        points.append((step, value))
    return points


def setpoint_at(spec: Setpoint, step: float) -> float:
    """The setpoint in force at ``step``: linear between points, held flat before and after."""
    s = validate_setpoint(spec)
    if isinstance(s, float):
        return s
    if not math.isfinite(step):
        raise ParameterError("step", f"must be finite, got {step!r}")
    if step <= s[0][0]:
        return s[0][1]
    for (s0, v0), (s1, v1) in zip(s, s[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0)
    return s[-1][1]
