"""Identification mode: a short pre-run that steps one knob and restores it, so that
``actuator policy tune`` has a knob move to fit before the real run.

The callback asks :meth:`IdentificationMode.due` once per step boundary: plain arithmetic on the
step number, no I/O, so it costs nothing on the hot path. Every rank runs rank 0's plan (shared
once at the start: :meth:`IdentificationMode.plan`, ``ControlSession.share_identification``), so
every rank computes the same value at the same step. While the test runs, the service's decisions on that knob
are set aside (``holds``): the controller acting on the knob would blur the step the fit needs.
The observations report the knob values in effect as usual, which is all identification reads.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from actuator._exceptions import ConfigError
from actuator.controllers.identify import StepTest
from actuator.policy import ControllerSpec, PolicyDocument
from actuator.schemas import KnobSpec

__all__ = ["IdentificationMode", "StepTest", "auto_controller", "schedule_steps", "warmup_test"]

# The share of a run the warm-up step test of gains auto may take when the schedule has no warm-up.
AUTO_SHARE = 0.10
# Its length when neither the run's length nor a warm-up is known.
AUTO_DEFAULT_STEPS = 20

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

    def plan(self) -> dict[str, Any]:
        """What another rank needs to run the same test at the same steps (plain data, picklable):
        the knob, the step test's fields and the step it counts from. Each rank binds its own knob
        spec and nominal value (:meth:`from_plan`, then :meth:`bind`)."""
        return {"knob": self.knob, "test": asdict(self.test), "origin": self._origin}

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> IdentificationMode:
        return cls(plan["knob"], StepTest(**plan["test"]))

    @property
    def started(self) -> bool:
        """Whether the test has set the knob yet."""
        return self._last is not None

    @property
    def start(self) -> int:
        return self._origin + self.test.start

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


def auto_controller(doc: PolicyDocument | None) -> ControllerSpec | None:
    """The policy's ``gains: auto`` controller (validation allows one), or None."""
    return next((c for c in (doc.controllers if doc is not None else ()) if c.kind in ("setpoint", "constraint")
                 and c.gains == "auto"), None)


def schedule_steps(scheduler: Any) -> tuple[int, int]:
    """``(max_steps, warmup steps)`` an HF ``LambdaLR`` schedule was built for, 0 where it does not
    say: ``get_scheduler`` binds ``num_training_steps`` and ``num_warmup_steps`` (from
    ``warmup_steps`` or ``warmup_ratio``) into its ``functools.partial`` lambda."""
    lambdas = getattr(scheduler, "lr_lambdas", None) or []
    keywords = getattr(lambdas[0], "keywords", None) if lambdas else None
    if not isinstance(keywords, dict):
        return 0, 0

    def steps(name: str) -> int:
        value = keywords.get(name)
        return int(value) if isinstance(value, (int, float)) and value > 0 else 0

    return steps("num_training_steps"), steps("num_warmup_steps")


def warmup_test(spec: ControllerSpec, knob: KnobSpec, *, max_steps: int = 0, warmup: int = 0) -> StepTest:
    """The step test of a gains-auto controller: the policy's ``identify`` fields where given, the
    rest sized to fit the scheduler's warm-up (``warmup`` steps), else the first 10% of
    ``max_steps``, else :data:`AUTO_DEFAULT_STEPS`: a quarter held at the nominal value, the rest
    moved by 0.5 (log knobs: x1.65) or 10% of the bounds' span, away from the nearer bound."""
    given = spec.identify
    window = warmup or int(max_steps * AUTO_SHARE) or AUTO_DEFAULT_STEPS
    hold = given.hold if given is not None and given.hold is not None else max(1, window // 4)
    length = given.length if given is not None and given.length is not None else max(1, window - hold)
    size = given.size if given is not None else None
    if size is None:
        scale = spec.scale or knob.scale
        if scale == "log":
            size = 0.5
            up = knob.value * math.exp(size) <= knob.max
        else:
            span = knob.max - knob.min
            size = 0.1 * span if math.isfinite(span) and span > 0 else 0.1 * abs(knob.value) or 1.0
            if scale == "integer":
                size = float(max(1, round(size)))
            up = knob.value + size <= knob.max
        size = size if up else -size
    return StepTest(size=size, length=length, hold=hold)
