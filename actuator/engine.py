"""The engine: one observation in, decisions and actions out.

Pure logic over the run's typed state (:mod:`actuator.run_state`: knobs, controller and guardrail
memories), so the service, the ``simulate`` endpoint and the benchmarks run exactly the same code. No I/O,
no clock: the store loads the context, calls :meth:`Engine.observe` once per new observation in
sequence order, and persists the mutated context with the decisions in one transaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .controllers import At, Law, ParameterError, PIDConfig, Reading, make_filter, registration
from .controllers.pid import pid_config
from .controllers.registry import undeclared
from .catalogue import limit
from .policy import ControllerSpec, GuardrailSpec, PolicyDocument
from .run_state import ControllerState, GuardrailState, KnobState, RunContext
from .schemas import (Action, ControllerUnusable, Decision, Event, GuardrailBreach, GuardrailCleared,
                      ObservationCreate)
from .warmup import Tuner, Warmup

__all__ = ["RunContext", "EngineResult", "Engine"]


@dataclass
class EngineResult:
    decisions: list[Decision] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    controller_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


def _fmt(x: float) -> str:
    return f"{x:.4g}"




# Distinct PID laws one engine keeps (beyond, it starts over): a handful per controller and knob
# bounds normally; a setpoint schedule makes one per step it is evaluated at.
_PID_CACHE_SIZE = 4096


def _exact(x: Any) -> Any:
    """A cache key part equal only for values that make the same PIDConfig, bit for bit: a
    non-zero float stands for itself; 0.0 and -0.0, 1 and 1.0, None are told apart by type and
    repr (a float's repr round-trips). Never raises, whatever the value (validation does)."""
    t = type(x)
    if (t is float and x != 0.0) or t is str:
        return x
    return (t.__name__, repr(x))



class Engine:
    """Evaluates one policy version against a run's observations (the run's state is the context).

    One engine serves every run of its policy version (the store keeps one per version), so what
    depends only on the policy is prepared once: the controllers in priority order, their
    filters, and each validated law, keyed on everything it is made of (the policy's spec and
    what its registration's ``inputs`` lists: the setpoint in force, the knob's bounds, scale and
    step limit...). A law is rebuilt, and validated, whenever one of those differs; the policy
    itself must not be mutated. The engine knows no law by kind: each controller's law comes from
    the law registry (controllers/registry.py) and is updated through one protocol
    (controllers/law.py); the bookkeeping around it is :meth:`_update`'s, the same for every law.
    """

    def __init__(self, policy: PolicyDocument, policy_version: int = 1, tuner: Tuner | None = None) -> None:
        """``tuner``: fits a gains-auto controller's warm-up step test (:mod:`actuator.warmup`; the
        store gives :func:`actuator.tune.fit_warmup`); without one such a controller falls back."""
        self.policy = policy
        self.policy_version = policy_version
        # Highest priority first (a stable sort: equal priorities keep the document's order).
        self._ordered = sorted(policy.controllers, key=lambda c: -c.priority)
        self._filters: dict[int, Any] = {}  # id(spec) -> filter (stateless; built on first use)
        self._laws: dict[tuple[Any, ...], Law] = {}  # (id(spec), the law's inputs) -> the validated law
        self._warmup = Warmup(policy, tuner, forget=self._laws.clear)  # gains auto: the warm-up step test

    # -- laws ---------------------------------------------------------------------------------
    def law(self, spec: ControllerSpec, knobs: Mapping[str, KnobState], at: At = At()) -> Law:
        """The validated law of ``spec`` on these knobs at ``at``: the one built for the same inputs
        before (its registration's ``inputs``), or a new one. Raises ParameterError when it cannot
        run on them."""
        law_kind = registration(spec.kind).law
        inputs = law_kind.inputs(spec, knobs, at)
        key = (id(spec), *map(_exact, inputs))
        law = self._laws.get(key)
        if law is None:
            law = law_kind.build(spec, knobs, inputs)  # validates: an invalid law is never kept
            if len(self._laws) >= _PID_CACHE_SIZE:
                self._laws.clear()
            self._laws[key] = law
        return law

    def pid_config(self, spec: ControllerSpec, knob: KnobState, step: int,
                   setpoint_override: Any = None, baseline: float | None = None) -> PIDConfig:
        """The PIDConfig of a setpoint or constraint controller on this knob (not validated)."""
        inputs = registration(spec.kind).law.inputs(spec, {spec.knob: knob}, At(step, setpoint_override, baseline))
        return pid_config(spec, *inputs[:6])

    def _pid(self, spec: ControllerSpec, knob: KnobState, step: int, setpoint_override: Any,
             baseline: float | None, model: tuple[float, float, float] | None = None) -> Any:
        """The validated law of a setpoint or constraint controller on one knob (see :meth:`law`)."""
        return self.law(spec, {spec.knob: knob}, At(step, setpoint_override, baseline, model))

    def knob_errors(self, knobs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
        """Why this policy cannot drive these knobs (name -> knob spec as a run stores it), each
        error with the policy field to change (``controllers.0.min``); empty when it can.

        Every controller's law is built as an observation would build it and validated, so what
        registration, a policy move and ``validate`` refuse is exactly what would fail at ingest:
        a knob the run does not declare, controller bounds disjoint from the knob's, a log scale
        over a bound <= 0, an integer scale over bounds that hold no integer. A law's registration
        may explain its errors itself (``check``); else the first problem building it is reported."""
        errors: list[dict[str, str]] = []
        declared = sorted(knobs)
        states = {name: KnobState.from_dict(stored, name) for name, stored in knobs.items()}

        def build(spec: ControllerSpec, on: Mapping[str, KnobState]) -> Law:
            # Any step and baseline will do: bounds and scale do not depend on them, and a setpoint
            # is finite at every step once the document is valid.
            return self.law(spec, on, At(0, None, 1.0))

        for i, spec in enumerate(self.policy.controllers):
            law_kind = registration(spec.kind).law
            check = getattr(law_kind, "check", None)
            if check is not None:
                errors += check(i, spec, states, build)
                continue
            missing = [k for k in spec.driven() if k not in knobs]
            if missing:
                errors += [undeclared(f"controllers.{i}.knob", spec.name, k, declared) for k in missing]
                continue
            try:
                build(spec, states)
            except ParameterError as exc:
                field = {"out_min": "min", "out_max": "max"}.get(exc.field, exc.field)
                if field in ("min", "max") and spec.min is None and spec.max is None:
                    field = "knob"
                knob = states[spec.knob]
                errors.append({"loc": f"controllers.{i}.{field}",
                               "msg": f"controller {spec.name!r} ({spec.kind}) on knob {spec.knob!r} "
                                      f"[{knob.min}, {knob.max}]: {exc}"})
        for i, g in enumerate(self.policy.guardrails):
            if g.knob is not None and g.knob not in knobs:
                errors.append({"loc": f"guardrails.{i}.knob",
                               "msg": f"guardrail {g.name!r} names knob {g.knob!r}, which the run does not "
                                      f"declare (knobs: {declared})"})
        return errors

    def _filter(self, spec: ControllerSpec) -> Any:
        filt = self._filters.get(id(spec))
        if filt is None:
            filt = self._filters[id(spec)] = make_filter(spec.filter.kind, alpha=spec.filter.alpha,
                                                         window=spec.filter.window)
        return filt

    @staticmethod
    def _values(obs: ObservationCreate) -> dict[str, float]:
        values = dict(obs.probes)
        values.update({f"train.{k}": v for k, v in obs.metrics.items()})
        return values

    def _decide(
        self, ctx: RunContext, result: EngineResult, *, step: int, knob: str, new: float,
        reason: str, controller: str | None, components: dict[str, float | None], inputs: dict[str, Any],
    ) -> None:
        spec = ctx.knobs[knob]
        old = float(spec.value)
        new = limit(spec, None, new)  # bounds and integer rounding; the law applied the rate limit
        if new == old:
            return
        ctx.decision_count += 1
        spec.value = new
        result.decisions.append(Decision(number=ctx.decision_count, step=step, knob=knob, old_value=old, new_value=new,
                                         reason=reason, controller=controller, components=components, inputs=inputs))

    # -- the loop ----------------------------------------------------------------------------
    def observe(self, ctx: RunContext, obs: ObservationCreate) -> EngineResult:
        """Feed one observation; mutates ``ctx``; returns the decisions and actions it caused."""
        result = EngineResult()
        values = self._values(obs)
        self._guardrails(ctx, obs, values, result)
        if ctx.state == "running":
            self._controllers(ctx, obs, values, result)
        return result

    def _guardrails(self, ctx: RunContext, obs: ObservationCreate, values: dict[str, float], result: EngineResult) -> None:
        for g in self.policy.guardrails:
            value = values.get(g.probe)
            if value is None:
                continue
            st = ctx.guardrails.setdefault(g.name, GuardrailState())
            if st.baseline is None:
                st.baseline = value
            threshold = g.resolve_threshold(st.baseline)
            if threshold is None:
                continue
            st.probe, st.threshold, st.value = g.probe, threshold, value
            breached = value < threshold if g.bound == "lower" else value > threshold
            inside = (
                value >= threshold + g.hysteresis if g.bound == "lower" else value <= threshold - g.hysteresis
            )
            if breached:
                st.breaches += 1
            elif inside:
                st.breaches = 0
                if st.active:
                    st.active = False
                    result.events.append(GuardrailCleared(step=obs.step, guardrail=g.name, value=value,
                                                          threshold=threshold))
            if breached and st.breaches >= g.consecutive and not st.active:
                st.active = True
                self._fire(ctx, g, obs.step, value, threshold, result)
            if g.reference == "best" and (value < st.baseline if g.bound == "upper" else value > st.baseline):
                st.baseline = value  # the best so far: the next reading's threshold is relative to it
        if any(g.action == "rollback" for g in self.policy.guardrails):
            self._note_held(ctx, obs.step)

    def _fire(self, ctx: RunContext, g: GuardrailSpec, step: int, value: float, threshold: float, result: EngineResult) -> None:
        side = "below" if g.bound == "lower" else "above"
        action: Any = g.action  # the guardrail's, or its ladder rung's
        rung, healthy, climbed = None, None, ""
        ladder = self.policy.rewind.ladder if self.policy.rewind is not None else None
        if g.action == "rollback" and ladder is not None:
            rung, action, climbed = self._climb(ctx, g, ladder, step)
        if action == "rollback":
            healthy = self._held_at(ctx)
            climbed += (f"; back to the newest checkpoint at or before step {healthy}, where every guardrail last held"
                        if healthy is not None else "; no step yet at which every guardrail held")
        at = f" at step {step}" if action in ("halt", "rollback") else ""  # what the agent's log and the event say
        ref = ""
        if g.reference == "best":  # the number the threshold came from, said (the first reading is stored)
            best = ctx.guardrails[g.name].baseline
            ref = f" ({g.threshold} of the best reading so far, {_fmt(best)})" if best is not None else ""
        reason = (f"guardrail {g.name}: {g.probe} {_fmt(value)} {side} threshold {_fmt(threshold)}{ref}{at} "
                  f"({action}{climbed})")
        result.events.append(GuardrailBreach(step=step, guardrail=g.name, action=action, value=value,
                                             threshold=threshold, reason=reason, rung=rung, healthy_step=healthy))
        self._act(ctx, g, action, step, value, threshold, reason, result)

    def _act(self, ctx: RunContext, g: GuardrailSpec, action: str, step: int, value: float, threshold: float,
             reason: str, result: EngineResult) -> None:
        """A guardrail's action (its own, or the ladder's rung): damp its knob, halt, order a rollback."""
        if action in ("adjust", "rollback") and g.knob and g.knob in ctx.knobs:
            old = float(ctx.knobs[g.knob].value)
            self._decide(ctx, result, step=step + 1, knob=g.knob, new=old * g.factor, reason=reason,
                         controller=None, components={},
                         inputs={"guardrail": g.name, "value": value, "threshold": threshold, "factor": g.factor})
            # The controllers on that knob restart bumplessly from the damped value.
            for c in self.policy.controllers:
                if g.knob in c.driven() and c.name in ctx.controllers:
                    ctx.controllers[c.name].reset = True
        if action == "halt":
            ctx.state = "halted"
        if action in ("halt", "rollback", "alert"):
            result.actions.append(Action(type=action, reason=reason,
                                         decision=ctx.decision_count if action == "rollback" else None))

    # -- the rewind ladder (policy.rewind.ladder) --------------------------------------------------
    @staticmethod
    def _note_held(ctx: RunContext, step: int) -> None:
        """After an observation's guardrails: if none is in breach, ``step`` is the run's last healthy step."""
        if ctx.guardrails and not any(st.active for st in ctx.guardrails.values()):
            for st in ctx.guardrails.values():
                st.held_at = step

    @staticmethod
    def _held_at(ctx: RunContext) -> int | None:
        """The last step at which every guardrail held (None: none yet)."""
        steps = [st.held_at for st in ctx.guardrails.values() if st.held_at is not None]
        return max(steps) if steps else None

    @staticmethod
    def _climb(ctx: RunContext, g: GuardrailSpec, ladder: Any, step: int) -> tuple[int, str, str]:
        """The ladder's rung for a firing of ``g`` at ``step``: (rung number, its action, the reason's words).
        Firings of every rollback guardrail within ``ladder.window`` steps are counted together."""
        since = step - ladder.window
        for st in ctx.guardrails.values():
            st.rewinds = [s for s in st.rewinds if s > since]
        earlier = sum(len(st.rewinds) for st in ctx.guardrails.values())
        number, rung = ladder.rung(earlier)
        ctx.guardrails[g.name].rewinds.append(step)
        words = (f"; rung {number} of {len(ladder.rungs)} of the rewind ladder: firing {earlier + 1} within "
                 f"{ladder.window} steps")
        return number, rung.action, words

    @staticmethod
    def _unusable(st: ControllerState, spec: ControllerSpec, step: int, message: str, result: EngineResult) -> None:
        if st.error != message:  # one event per new problem, not one per observation
            result.events.append(ControllerUnusable(step=step, controller=spec.name, knob="+".join(spec.driven()),
                                                    reason=message))
        st.error = message

    def _controllers(self, ctx: RunContext, obs: ObservationCreate, values: dict[str, float], result: EngineResult) -> None:
        """One update of every controller, whatever its law (the law registry: controllers/registry.py).

        Highest priority first; a knob changed by one controller this observation is not changed
        again by a lower-priority one (which instead tracks the new value bumplessly)."""
        taken: set[str] = set()
        for spec in self._ordered:
            names = spec.driven()
            declared = all(name in ctx.knobs for name in names)
            raw = values.get(spec.probe)
            if raw is None and declared and spec.probe.startswith("train.") and "loss" in obs.metrics:
                # the trainer logs its step (a loss) without this input: never a silent idle controller
                self._unusable(ctx.controllers.setdefault(spec.name, ControllerState()), spec, obs.step,
                               f"{spec.probe} is not among the metrics the trainer logs "
                               f"({', '.join(sorted(obs.metrics))}): the run is not controlled on it", result)
            if not declared or raw is None or not math.isfinite(raw):
                continue
            st = ctx.controllers.setdefault(spec.name, ControllerState())
            last = st.last_step
            if last is not None and obs.step <= last:
                continue  # stale or repeated step: never act twice on old data
            dt = float(obs.step - last) if last is not None else 1.0
            self._update(ctx, obs, values, result, spec, st, raw, dt, taken)

    def _update(self, ctx: RunContext, obs: ObservationCreate, values: dict[str, float], result: EngineResult,
                spec: ControllerSpec, st: ControllerState, raw: float, dt: float, taken: set[str]) -> None:
        """One controller at one observation: the bookkeeping every law shares (its law's own part
        is ``law.update``)."""
        law_kind = registration(spec.kind).law
        if not law_kind.ready(spec, values):
            return  # the law needs another input this observation lacks (a maximiser's cost): wait
        law_spec: ControllerSpec = spec
        if spec.gains == "auto":
            tuned = self._warmup.spec(ctx, obs, spec, st, raw, result.events)
            if tuned is None:  # the warm-up step test runs: the probe is tracked, the law waits
                self._track(obs, values, spec, ctx, st, raw, None)
                return
            law_spec = tuned
        filt = self._filter(spec)
        filtered, fstate = filt.update(raw, filt.state_from_dict(st.filter) if st.filter else None)
        # the reference for relative setpoints ('+10%'): the first filtered value
        baseline = filtered if st.baseline is None else st.baseline
        try:
            law = self.law(law_spec, ctx.knobs, At(obs.step, st.setpoint_override, baseline, self._warmup.fit(st)))
        except ParameterError as exc:
            # A stored policy whose law cannot run on this run's knobs (validation against the
            # knobs prevents it; runs and policies stored before it may still meet it): the
            # controller is reported unusable and skipped, never a failed observation.
            self._unusable(st, spec, obs.step, str(exc), result)
            return
        reading, current = self._track(obs, values, spec, ctx, st, raw, law, (filtered, fstate, baseline))
        single = current[spec.knob] if len(current) == 1 else current  # a law on several knobs gets them all
        if spec.gains == "auto" and st.pid is None and self._warmup.ended_at(st, obs.step):
            # the test ended because the probe ran past its setpoint: the law acts on this very
            # reading (P on the error from the value in effect), not one reading later
            st.pid = law.takeover(single)
        # Hand-over: while the knob is someone else's (an operator's override, or a controller of
        # higher priority moved it this observation) the law tracks the value in effect and decides
        # nothing; when control comes back (release, resume, policy move, guardrail damping) it
        # restarts from the value in effect.
        held = any(ctx.knobs[name].override is not None or name in taken for name in current)
        state = law.load(st)
        if held or st.reset:
            st.reset = False
            law.keep(st, law.handover(state, reading, single))
            if held:
                return
            state = law.load(st)
        out = law.update(state, reading, dt, single)
        law.keep(st, out.state)
        st.components = {**out.components, **out.notes}
        result.controller_outputs[spec.name] = st.components
        moves = out.moves if out.moves is not None else ({spec.knob: out.value} if out.changed else {})
        for knob, new in moves.items():
            taken.add(knob)
            head, tail = out.reason
            reason = (f"{head}: {knob} {_fmt(current[knob])} -> {_fmt(new)}{tail}" if out.moves is None
                      else f"{head}{tail}")
            self._decide(ctx, result, step=obs.step + 1, knob=knob, new=new, reason=reason, controller=spec.name,
                         components=dict(out.components), inputs=dict(out.inputs))

    def _track(self, obs: ObservationCreate, values: dict[str, float], spec: ControllerSpec, ctx: RunContext,
               st: ControllerState, raw: float, law: Law | None,
               filtered: tuple[float, Any, float] | None = None) -> tuple[Reading, dict[str, float]]:
        """The bookkeeping of a controller at an observation it acts on (or records, while a
        gains-auto step test runs and the law waits, ``law`` None): the filtered probe, the
        controller's memory updated, and the value in effect of each knob it drives (the agent's
        report, else the last known) as its law acts on it (clamped into its bounds: the learning
        rate knob is a LambdaLR schedule's peak, so a schedule's own warm-up and decay never show up
        here as knob changes to undo). Returns the law's reading and the values in effect."""
        if filtered is None:
            filt = self._filter(spec)
            value, fstate = filt.update(raw, filt.state_from_dict(st.filter) if st.filter else None)
            filtered = (value, fstate, value if st.baseline is None else st.baseline)
        value, fstate, baseline = filtered
        st.error = None
        reading = Reading(value=value, raw=raw, previous=st.filtered, step=obs.step, values=values,
                          last=st.components)
        st.filter = fstate.to_dict()
        st.last_step = obs.step
        st.probe, st.knob, st.raw, st.filtered, st.baseline = spec.probe, "+".join(spec.driven()), raw, value, baseline
        if law is not None and law.setpoint is not None:
            st.setpoint = law.setpoint
        current = {}
        for name in spec.driven():
            knob = ctx.knobs[name]
            reported = obs.knobs.get(name)
            in_effect = float(reported if reported is not None else knob.value)
            current[name] = knob.value = in_effect if law is None else law.in_effect(name, in_effect)
        return reading, current

