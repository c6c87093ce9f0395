"""Replay a policy: through a run's recorded observations, or closed loop against a fitted model.

Lets users tune gains before a real run. :func:`simulate` feeds the simulated knob values as
"in effect" (not the values the real run reported, which its own controller moved), so the
result is what this policy would have done on its own; but recorded probes cannot answer the new
decisions. :func:`simulate_model` closes the loop through a model fitted to the run
(:mod:`controllers.identify`): each step the model answers the knob value the engine left in
effect, and every ``every`` steps the engine observes it, exactly as it observes an agent.
"""

from __future__ import annotations

import math
from typing import Any

from .controllers.identify import FittedModel

from .engine import Engine
from .policy import PolicyDocument
from .run_state import RunContext
from .schemas import FINAL_STATES, Decision, Event, ObservationCreate, SimulatedAction

__all__ = ["simulate", "simulate_model"]


def simulate(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], observations: list[Any]) -> dict[str, Any]:
    engine = Engine(policy, 0)
    ctx = RunContext.from_json(knobs)
    decisions: list[Decision] = []
    actions: list[SimulatedAction] = []
    events: list[Event] = []
    trace: list[dict[str, Any]] = []
    for o in sorted(observations, key=lambda o: o.seq):
        if ctx.state in FINAL_STATES:
            break
        obs = ObservationCreate(seq=o.seq, step=o.step, probes=o.probes, metrics=o.metrics,
                                knobs={k: float(v.value) for k, v in ctx.knobs.items()})
        result = engine.observe(ctx, obs)
        decisions.extend(result.decisions)
        actions.extend(SimulatedAction(**a.model_dump(), step=o.step) for a in result.actions)
        events.extend(result.events)
        trace.append({"step": o.step, "knobs": {k: float(v.value) for k, v in ctx.knobs.items()}})
    return {"decisions": decisions, "actions": actions, "events": events, "trace": trace,
            "final_state": ctx.state, "observations": len(observations)}


def simulate_model(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], model: FittedModel, *, probe: str,
                   knob: str, steps: int, every: int, start_step: int = 0) -> dict[str, Any]:
    """Run ``policy`` closed loop on ``model`` (the probe ``probe`` answering knob ``knob``) for
    ``steps`` optimizer steps from the model's start, observing every ``every`` steps. The trace
    has the noise-free probe, the knob and each controller's setpoint at every step."""
    engine = Engine(policy, 0)
    ctx = RunContext.from_json(knobs)
    log = ctx.knobs[knob].scale == "log"
    state = model.start()
    y = model.output(state)
    decisions: list[Decision] = []
    trace: list[dict[str, Any]] = []
    setpoints: dict[str, float] = {}
    seq = 0
    for k in range(steps + 1):
        value = float(ctx.knobs[knob].value)
        if k > 0:
            y, state = model.step(state, math.log(value) if log else value)
        if k % every == 0 and ctx.state == "running":
            values = {probe.removeprefix("train."): y}
            obs = ObservationCreate(seq=seq, step=start_step + k, probes={} if probe.startswith("train.") else values,
                                    metrics=values if probe.startswith("train.") else {},
                                    knobs={n: float(v.value) for n, v in ctx.knobs.items()})
            seq += 1
            result = engine.observe(ctx, obs)
            decisions.extend(result.decisions)
            setpoints = {n: c.setpoint for n, c in ctx.controllers.items() if c.setpoint is not None}
        trace.append({"step": start_step + k, "probe": y, "knob": value, "setpoints": dict(setpoints)})
    return {"decisions": decisions, "trace": trace, "final_state": ctx.state, "observations": seq}
