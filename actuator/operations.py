"""Operator actions on a live run, as pure functions over a :class:`RunContext`.

Each returns ``(decision drafts, audit events)``; the store applies it under the run's lock and
persists everything in one transaction. A ``ValueError`` refuses the action (nothing stored).
"""

from __future__ import annotations

import math
from typing import Any

from .controllers import registration
from .policy import PolicyDocument
from .run_state import ControllerState, RunContext
from .schemas import (
    ControlPaused,
    ControlResumed,
    Decision,
    Event,
    KnobOverridden,
    OverrideReleased,
    SetpointChanged,
)

__all__ = ["override_knob", "release_knob", "set_setpoint", "pause", "resume"]

Result = tuple[list[Decision], list[Event]]


def _step(run: Any) -> int:
    return (run.last_step or 0) + 1


def override_knob(ctx: RunContext, run: Any, knob: str, value: float, note: str = "") -> Result:
    """Pin ``knob`` to ``value``: controllers on it track it (bumpless) until released."""
    spec = ctx.knobs.get(knob)
    if spec is None:
        raise ValueError(f"knob: the run has no knob {knob!r} (knobs: {sorted(ctx.knobs)})")
    if not math.isfinite(value) or not spec.min <= value <= spec.max:
        raise ValueError(f"value: {value} is outside {knob}'s bounds [{spec.min}, {spec.max}]")
    if spec.scale == "integer" and value != int(value):
        raise ValueError(f"value: {knob} is an integer knob")
    old = float(spec.value)
    spec.override = float(value)
    spec.value = float(value)
    ev = KnobOverridden(step=run.last_step, knob=knob, old=old, new=value, note=note)
    drafts = []
    if value != old:
        ctx.decision_count += 1
        reason = f"manual override of {knob}: {old:.4g} -> {value:.4g}" + (f" ({note})" if note else "")
        drafts.append(Decision(number=ctx.decision_count, step=_step(run), knob=knob, old_value=old,
                               new_value=float(value), reason=reason, controller=None, components={},
                               inputs={"override": True, "note": note}))
    return drafts, [ev]


def release_knob(ctx: RunContext, run: Any, knob: str, policy: PolicyDocument) -> Result:
    """Hand the knob back to its controllers; they restart bumplessly from the value in effect."""
    spec = ctx.knobs.get(knob)
    if spec is None:
        raise ValueError(f"knob: the run has no knob {knob!r}")
    if spec.override is None:
        raise ValueError(f"knob: {knob} is not overridden")
    spec.override = None
    for c in policy.controllers:
        if knob in c.driven() and c.name in ctx.controllers:
            ctx.controllers[c.name].reset = True
    return [], [OverrideReleased(step=run.last_step, knob=knob, value=spec.value)]


def set_setpoint(ctx: RunContext, run: Any, controller: str, setpoint: Any, policy: PolicyDocument) -> Result:
    names = {c.name for c in policy.controllers}
    if controller not in names:
        raise ValueError(f"controller: the policy has no controller {controller!r} (controllers: {sorted(names)})")
    spec = next(c for c in policy.controllers if c.name == controller)
    why = registration(spec.kind).law.no_setpoint  # what the kind allows: its law registration says
    if why is not None:
        raise ValueError("controller: " + why.format(name=controller, probe=spec.probe))
    st = ctx.controllers.setdefault(controller, ControllerState())
    old = st.setpoint_override
    st.setpoint_override = setpoint
    return [], [SetpointChanged(step=run.last_step, controller=controller, old=old, new=setpoint)]


def pause(ctx: RunContext, run: Any) -> Result:
    if ctx.state != "running":
        raise ValueError(f"state: run is {ctx.state}; only a running run can be paused")
    ctx.state = "paused"
    return [], [ControlPaused(step=run.last_step)]


def resume(ctx: RunContext, run: Any) -> Result:
    if ctx.state != "paused":
        raise ValueError(f"state: run is {ctx.state}; only a paused run can be resumed")
    ctx.state = "running"
    for st in ctx.controllers.values():
        st.reset = True  # bumpless: start again from the values in effect
    return [], [ControlResumed(step=run.last_step)]
