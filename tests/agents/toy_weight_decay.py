"""A knob added in one file (issue 52): the optimizer's weight decay.

``@knob_setter(Knob(...))`` registers both halves at once: the catalogue entry (bounds, scale,
rate limit: a policy may name the knob, and it travels with the run's registration to a service
that does not know it) and the setter the agent finds from the trainer."""

from __future__ import annotations

from typing import Any

from actuator.agents.knobs import KnobSetter, knob_setter
from actuator.catalogue import Knob

DOCS_ROW = ("| `weight_decay` | 0 | 0.5 | linear | 0.05 | `WeightDecayKnob(optimizer)` | the optimizer's weight decay "
            "(its decayed parameter group) |")


class WeightDecayKnob:
    """Weight decay of param group 0 (the Trainer's decayed parameters; the no-decay group keeps 0)."""

    name = "weight_decay"

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer

    def read(self) -> float:
        return float(self.optimizer.param_groups[0]["weight_decay"])

    def apply(self, value: float) -> float:
        self.optimizer.param_groups[0]["weight_decay"] = float(value)
        return self.read()


@knob_setter(Knob("weight_decay", 0.0, 0.5, "linear", 0.05, "the optimizer's weight decay"),
             hint="WeightDecayKnob(optimizer)", needs_trainer=False)
def _weight_decay(*, optimizer: Any, **_: Any) -> KnobSetter:
    return WeightDecayKnob(optimizer)
