"""Replay a run's recorded observations through a policy: the decisions it would have taken.

Lets users tune gains before a real run. The replay feeds the simulated knob values as "in
effect" (not the values the real run reported, which its own controller moved), so the result
is what this policy would have done on its own.
"""

from __future__ import annotations

from typing import Any

from .engine import Engine
from .policy import PolicyDocument
from .run_state import RunContext
from .schemas import ObservationCreate

__all__ = ["simulate"]


def simulate(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], observations: list[Any]) -> dict[str, Any]:
    engine = Engine(policy, 0)
    ctx = RunContext.from_json(knobs)
    decisions: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    for o in sorted(observations, key=lambda o: o.seq):
        if ctx.state in ("halted", "finished"):
            break
        obs = ObservationCreate(seq=o.seq, step=o.step, probes=o.probes, metrics=o.metrics,
                                knobs={k: float(v.value) for k, v in ctx.knobs.items()})
        result = engine.observe(ctx, obs)
        decisions.extend(d.model_dump() for d in result.decisions)
        actions.extend({**a.model_dump(), "step": o.step} for a in result.actions)
        events.extend(result.events)
        trace.append({"step": o.step, "knobs": {k: float(v.value) for k, v in ctx.knobs.items()}})
    return {"decisions": decisions, "actions": actions, "events": events, "trace": trace,
            "final_state": ctx.state, "observations": len(observations)}
