"""Argument checks shared by the control laws.

Control laws reject bad input loudly instead of clamping it quietly: a NaN probe or a reversed
bound that slipped through would otherwise turn into a silent, wrong knob change mid-run.
"""

from __future__ import annotations

import math
import sys
from typing import Any

__all__ = [
    "ParameterError",
    "require_finite",
    "require_positive",
    "require_non_negative",
    "json_float",
    "float_from_json",
    "saturate",
    "finite_term",
]


class ParameterError(ValueError):
    """A configuration field or call argument is invalid.

    A ``ValueError`` so callers can catch it generically; ``field`` carries the offending name so
    the service can point at ``controllers.0.out_min`` without parsing the message.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def require_finite(field: str, value: Any) -> float:
    """Return ``value`` as a float, or raise naming ``field`` if it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParameterError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ParameterError(field, f"must be finite, got {value!r}")
    return float(value)


def require_positive(field: str, value: Any) -> float:
    """Finite and strictly positive."""
    x = require_finite(field, value)
    if x <= 0:
        raise ParameterError(field, f"must be > 0, got {x!r}")
    return x


def require_non_negative(field: str, value: Any) -> float:
    """Finite and >= 0."""
    x = require_finite(field, value)
    if x < 0:
        raise ParameterError(field, f"must be >= 0, got {x!r}")
    return x


def saturate(x: float) -> float:
    """``x`` itself if finite, else the largest finite float of its sign.

    A law's arithmetic on finite inputs overflows only at magnitudes no knob or probe means
    (a gain of 1e308, a probe of 1e308): saturating there keeps every number a law returns or
    stores finite (JSON and Postgres have no infinities), and keeps ``inf - inf`` from ever
    turning into a NaN further on. Callers that report overflow compare the result with ``x``.
    """
    if math.isfinite(x):
        return x
    return math.copysign(sys.float_info.max, x)


_FLOAT_MAX = sys.float_info.max


def finite_term(x: float, limits: set[str]) -> float:
    """A term of a control law, saturated (:func:`saturate`); ``"overflow"`` is added to the
    law's ``limits`` when it had to be, so the decision says so."""
    if -_FLOAT_MAX <= x <= _FLOAT_MAX:  # false for infinities and NaN; the common case, kept cheap
        return x
    limits.add("overflow")
    return saturate(x)


def json_float(x: float | None) -> float | None:
    """Strict JSON has no infinities: they travel as ``None`` (and so does ``None`` itself).

    Only used for fields where infinity is the sole non-finite value and ``None`` is not otherwise
    meaningful, so the mapping is reversible by :func:`float_from_json`.
    """
    if x is None or math.isinf(x):
        return None
    return float(x)


def float_from_json(x: float | None, default: float) -> float:
    """Inverse of :func:`json_float`: ``None`` means ``default`` (the field's infinity)."""
    return default if x is None else float(x)
