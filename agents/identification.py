"""Identification mode: a short pre-run that steps one knob and restores it, so that
``actuator policy tune`` has a knob move to fit before the real run.

The callback asks :meth:`IdentificationMode.due` once per step boundary: plain arithmetic on the
step number, no I/O, so it costs nothing on the hot path and every rank computes the same value
at the same step (no broadcast needed). While the test runs, the service's decisions on that knob
are set aside (``holds``): the controller acting on the knob would blur the step the fit needs.
The observations report the knob values in effect as usual, which is all identification reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from actuator._exceptions import ConfigError
from actuator.controllers.identify import StepTest
from actuator.schemas import KnobSpec

__all__ = ["IdentificationMode", "StepTest"]

log = logging.getLogger("actuator.agents")


@dataclass
class IdentificationMode:
    """``IdentificationMode("learning_rate", StepTest(size=0.5, hold=10, length=40))``: from the
    step training starts at, hold the knob for ``hold`` steps, move it by ``size`` (log units for
    a log knob: 0.5 is x1.65) for ``length`` steps, then restore the value it had."""

    knob: str
    test: StepTest
    _nominal: float | None = field(default=None, init=False)
    _origin: int = field(default=0, init=False)
    _spec: KnobSpec | None = field(default=None, init=False)
    _last: float | None = field(default=None, init=False)

    @classmethod
    def from_config(cls, config: IdentificationMode | dict[str, Any]) -> IdentificationMode:
        """From ``{"knob": "learning_rate", "size": 0.5, "length": 40, "hold": 10}``."""
        if isinstance(config, IdentificationMode):
            return config
        cfg = dict(config)
        knob = cfg.pop("knob", "learning_rate")
        try:
            return cls(knob, StepTest(**cfg))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"identify: {exc}") from exc

    def bind(self, spec: KnobSpec, nominal: float, step: int) -> None:
        """Training starts at ``step`` with the knob at ``nominal``; the test counts from there."""
        self._spec, self._nominal, self._origin = spec, nominal, step

    @property
    def end(self) -> int:
        return self._origin + self.test.end

    def holds(self, knob: str, step: int) -> bool:
        """Whether decisions on ``knob`` are set aside at ``step`` (the test is running)."""
        return knob == self.knob and self._nominal is not None and step < self.end

    def due(self, step: int) -> float | None:
        """The value to apply at ``step`` when it differs from the last one applied, else ``None``."""
        if self._nominal is None or self._spec is None or step > self.end:
            return None
        spec = self._spec
        value = self.test.value(step - self._origin, self._nominal, spec.scale, spec.min, spec.max)
        if value == self._last:
            return None
        self._last = value
        if step - self._origin > 0:
            log.info("actuator: identification: %s -> %.6g at step %d", self.knob, value, step)
        return value
