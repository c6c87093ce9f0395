"""A probe added in one file (issue 52): the L2 norm of the model's trainable weights.

The registration is all it takes: the catalogue key ``weight_norm`` (a policy may name it, and it
travels with the run's registration to a service that does not know it), ``for_preset`` (a policy
naming ``probes: [{name: weight_norm}]`` gets it built), and the docs row the agreement test
asks for (tests/actuator/test_catalogue.py)."""

from __future__ import annotations

import math
from typing import Any

from actuator.agents.probes import Key, Probe, register
from actuator.agents.probes._base import DefaultEvery

DOCS_ROW = "| `weight_norm` | [0, ∞] | lower | no | `weight_norm` | L2 norm of the trainable weights |"
PROBES_DOCS_ROW = "| `WeightNorm()` | `weight_norm` | L2 norm of the trainable weights | one pass over the weights |"


@register(Key("weight_norm", (0.0, math.inf), False, False, "weight_norm", "L2 norm of the trainable weights"))
class WeightNorm(Probe):
    name = "weight_norm"
    preset_needs_tokenizer = False

    def __init__(self, every: int | None = DefaultEvery(1)) -> None:
        self._init_schedule(every, False)

    @classmethod
    def for_preset(cls, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> WeightNorm:
        return cls()

    def _measure(self, model: Any, *, max_examples: int | None) -> dict[str, float]:
        squares = sum(float(p.detach().float().pow(2).sum()) for p in model.parameters() if p.requires_grad)
        return {"weight_norm": math.sqrt(squares)}

