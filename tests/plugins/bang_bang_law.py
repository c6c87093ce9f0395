"""A toy law added the way a new law is: one module and one registration (controllers/registry.py).

``kind: bang_bang``: the knob sits at ``high`` while the filtered probe is below ``threshold``
and at ``low`` once it is above (TRL's own adaptive entropy law has this shape). A service knows
it when started with ``ACTUATOR_PLUGINS=bang_bang_law`` (this folder on its path)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from actuator.controllers import LawBase, LawOutput, Reading, register
from actuator.policy import ControllerSpec


class BangBangController(ControllerSpec):
    """``kind: bang_bang``: the knob at ``high`` below ``threshold``, at ``low`` above it."""

    kind: Literal["bang_bang"] = "bang_bang"  # type: ignore[assignment]
    threshold: float = Field(description="bang_bang only: the probe value the knob switches at.")
    low: float = Field(description="bang_bang only: the knob's value above the threshold.")
    high: float = Field(description="bang_bang only: the knob's value below the threshold.")


class BangBang(LawBase):
    no_setpoint = "{name!r} switches {probe} at its threshold; it has no setpoint to change"

    def __init__(self, spec: BangBangController) -> None:
        self.spec = spec

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        return (spec.threshold, spec.low, spec.high)

    @classmethod
    def build(cls, spec: Any, knobs: Any, inputs: tuple[Any, ...]) -> BangBang:
        return cls(spec)

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        spec = self.spec
        above = reading.value > spec.threshold
        value = spec.low if above else spec.high
        return LawOutput(
            value=value, changed=value != current, components={"above": float(above)},
            reason=(f"bang_bang {spec.name}: {spec.probe} {reading.value:.4g} "
                    f"{'above' if above else 'at or below'} {spec.threshold:g}", ""),
            inputs={"probe": spec.probe, "filtered": reading.value, "threshold": spec.threshold})


register("bang_bang", spec=BangBangController, law=BangBang)
