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

from .controllers import (
    PID,
    ExtremumConfig,
    Follow,
    FollowConfig,
    ExtremumSeeking,
    ExtremumState,
    ParameterError,
    PIDConfig,
    PIDLagrangian,
    PIDState,
    SplitRange,
    make_filter,
)
from .catalogue import limit
from .policy import ControllerSpec, GuardrailSpec, PolicyDocument, SplitRangeController, setpoint_at, split_range_field
from .run_state import ControllerState, GuardrailState, KnobState, RunContext
from .schemas import (Action, AutoGainsFallback, AutoGainsFit, AutoGainsPrediction, AutoGainsSet, AutoGainsTuned,
                      ControllerUnusable, Decision, Event, GuardrailBreach, GuardrailCleared, ObservationCreate)

__all__ = ["RunContext", "EngineResult", "Engine"]


@dataclass
class EngineResult:
    decisions: list[Decision] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    controller_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _trend(filtered: float, prev: float | None) -> str:
    return "" if prev is None or filtered == prev else (" and rising" if filtered > prev else " and falling")


def _limits(out: Any) -> str:
    """What held a law's output back, for a decision's reason."""
    text = f", limited by {', '.join(out.limited_by)}" if out.limited_by else ""
    if "overflow" in out.limited_by:
        text += " (a term of the law passed the float range: clamped to the largest finite value)"
    return text


def _reason(probe: str, filtered: float, prev: float | None, setpoint: float, knob: str, current: float,
            out: Any, prev_components: dict[str, float] | None, ramp: float = 0.0) -> str:
    """One line a person can check: where the probe is, where it is heading, what moved the knob.

    The PID's proportional term acts on the change of the error since control started (see
    controllers/pid.py), so a rising probe can cut a direct knob while still below its setpoint;
    the trend and the per-term move say so instead of leaving "below setpoint" beside a cut.
    The terms are this decision's moves (ΔP, ΔI, ΔD: each term's change since the previous
    update), not the terms' levels, which the decision's components keep.
    """
    side = "above" if filtered > setpoint else "below" if filtered < setpoint else "at"
    trend = _trend(filtered, prev)
    limits = _limits(out)
    terms = ""
    if prev_components:
        moves = [(name, getattr(out, name) - float(prev_components.get(name, 0.0))) for name in ("p", "i", "d")]
        terms = ", " + " ".join(f"Δ{n.upper()} {m:+.3g}" for n, m in moves if abs(m) > 1e-12)
    return (f"{probe} {_fmt(filtered)} {side} setpoint {_fmt(setpoint)}{trend}{_acted_on(out, setpoint, filtered, ramp)}: "
            f"{knob} {_fmt(current)} -> {_fmt(out.value)}{terms}{limits}")


def _acted_on(out: Any, setpoint: float, filtered: float, ramp: float) -> str:
    """What the law compared when it was not the reading against the setpoint: the projected
    reading (``horizon``) and the setpoint in force on the ramp (``setpoint_ramp``), e.g.
    ``; the law acted on projected 0.031 against ramped setpoint 0.0437 (ramp 2 of 8 probe
    intervals), above it``: a cut below the final setpoint is then read against the numbers used."""
    projected = out.projected if out.projected is not None and out.projected != filtered else None
    ramped = out.setpoint if out.setpoint is not None and out.setpoint != setpoint else None
    if projected is None and ramped is None:
        return ""
    y = filtered if projected is None else projected
    r = setpoint if ramped is None else ramped
    what = f"projected {_fmt(y)}" if projected is not None else f"{_fmt(y)}"
    where = f"setpoint {_fmt(r)}"
    if ramped is not None:
        done = out.state.updates - 1 - out.state.ramp_start
        where = f"ramped setpoint {_fmt(r)} (ramp {done:g} of {ramp:g} probe intervals toward {_fmt(setpoint)})"
    side = "above it" if y > r else "below it" if y < r else "at it"
    return f"; the law acted on {what} against {where}, {side}"


def _law_inputs(out: Any) -> dict[str, float]:
    """The numbers a PID law acted on besides the reading and the setpoint, where it has them:
    ``setpoint_in_force`` (on a setpoint ramp) and ``projected`` (with a horizon)."""
    law = {"setpoint_in_force": out.setpoint, "projected": out.projected}
    return {k: float(v) for k, v in law.items() if v is not None}


def _constraint_reason(name: str, probe: str, filtered: float, prev: float | None, budget: float, bound: str,
                       knob: str, current: float, out: Any) -> str:
    """The constraint controller's line: is the constraint active (violated) or slack, and how
    the multiplier moved; e.g. ``constraint keep-drift active: kl_drift 0.62 > budget 0.5 and
    rising: kl_weight 0 -> 0.24 (levels P +0.12 I +0.12)``: the multiplier is the sum of the
    terms' levels, so the levels are what explains its value (labelled, not to be read as moves)."""
    violated = filtered > budget if bound == "upper" else filtered < budget
    sign = (">" if bound == "upper" else "<") if violated else ("<=" if bound == "upper" else ">=")
    trend = _trend(filtered, prev)
    terms = " ".join(f"{n.upper()} {getattr(out, n):+.3g}" for n in ("p", "i", "d") if getattr(out, n))
    limits = _limits(out)
    state = "active" if violated else ("slack, releasing" if out.value < current else "slack")
    return (f"constraint {name} {state}: {probe} {_fmt(filtered)} {sign} budget {_fmt(budget)}{trend}: "
            f"{knob} {_fmt(current)} -> {_fmt(out.value)}" + (f" (levels {terms})" if terms else "") + limits)


# The most observations a gains-auto controller records in its warm-up step test (beyond, every
# other one is dropped: the fit needs the step's shape, not every reading).
AUTO_MAX_SAMPLES = 1000


def _undeclared(loc: str, controller: str, knob: str, declared: list[str]) -> dict[str, str]:
    return {"loc": loc, "msg": f"controller {controller!r} drives knob {knob!r}, which the run does not declare "
                               f"(knobs: {declared})"}


def _handover(law: Any, st: ControllerState, current: Any, filtered: float, held: bool) -> tuple[bool, PIDState | None]:
    """Whether a PID-based law stands aside this observation, and the state its update starts from.

    ``held`` (a manual override in force, or another controller moved the knob): the law tracks the
    value in effect bumplessly and decides nothing. Control handed back (``st.reset``: release,
    resume, policy move, guardrail damping): it restarts bumplessly from the value in effect; this
    update outputs it unchanged."""
    if held:
        st.pid = law.bumpless(current, filtered, st.pid)
        st.reset = False
        return True, None
    if st.reset:
        st.reset = False
        return False, law.bumpless(current, filtered, st.pid)
    return False, st.pid


def _integrating(st: ControllerState) -> tuple[float, float, float] | None:
    """A gains-auto controller's integrating fit (rate, drift, u_ref), once tuned from one."""
    model = (st.auto or {}).get("model") if (st.auto or {}).get("status") == "tuned" else None
    return None if model is None else (float(model["rate"]), float(model["drift"]), float(model["u_ref"]))


def _gains_set(spec: ControllerSpec, gains: str | None = None) -> AutoGainsSet:
    return AutoGainsSet(gains=gains or ("absolute" if spec.gains == "absolute" else "relative"),
                        kp=float(spec.kp or 0.0), ki=spec.ki, kd=spec.kd, direction=spec.direction,
                        setpoint_weight=spec.setpoint_weight)


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
    filters, and each validated PID law, keyed on everything its config is made of (the policy's
    spec, the setpoint in force, the knob's bounds, scale and step limit). A law is rebuilt, and
    validated, whenever one of those differs; the policy itself must not be mutated.
    """

    def __init__(self, policy: PolicyDocument, policy_version: int = 1) -> None:
        self.policy = policy
        self.policy_version = policy_version
        # Highest priority first (a stable sort: equal priorities keep the document's order).
        self._ordered = sorted(policy.controllers, key=lambda c: -c.priority)
        self._filters: dict[int, Any] = {}  # id(spec) -> filter (stateless; built on first use)
        self._pids: dict[tuple[Any, ...], PID] = {}
        self._extrema: dict[tuple[Any, ...], ExtremumSeeking] = {}
        self._follows: dict[tuple[Any, ...], Follow] = {}
        self._splits: dict[tuple[Any, ...], SplitRange] = {}
        self._tuned: dict[tuple[Any, ...], ControllerSpec] = {}  # gains auto: the spec with a run's tuned gains

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _law(spec: ControllerSpec, knob: KnobState, step: int, setpoint_override: Any,
             baseline: float | None) -> tuple[float, Any, Any, Any, Any, float]:
        """What a controller's PIDConfig takes from the run: setpoint, bounds, scale, max_step, and
        the span its gains divide the error by (``gains: relative``; 1.0 for absolute gains)."""
        lo = knob.min if spec.min is None else max(knob.min, spec.min)
        hi = knob.max if spec.max is None else min(knob.max, spec.max)
        target = spec.setpoint if setpoint_override is None else setpoint_override
        # A maximize controller has no setpoint; its law is built by _extremum, never from this.
        setpoint = math.nan if target is None else setpoint_at(target, step, baseline)
        scale = "linear" if spec.kind == "constraint" else spec.scale or knob.scale
        max_step = spec.max_step if spec.max_step is not None else knob.max_step
        span = 1.0 if target is None else spec.error_span(setpoint, baseline)
        return setpoint, lo, hi, scale, max_step, span

    def pid_config(self, spec: ControllerSpec, knob: KnobState, step: int,
                   setpoint_override: Any = None, baseline: float | None = None) -> PIDConfig:
        return self._config(spec, *self._law(spec, knob, step, setpoint_override, baseline))

    @staticmethod
    def _config(spec: ControllerSpec, setpoint: float, lo: Any, hi: Any, scale: Any, max_step: Any,
                span: float = 1.0, model: Any = None) -> PIDConfig:
        # relative gains (span != 1) act on the error divided by the span: the same law in probe units;
        # model: an integrating fit's (rate, drift, u_ref), the projection when a horizon is set
        rate, drift, u_ref = model if model is not None and spec.horizon > 0 else (None, 0.0, 0.0)
        return PIDConfig(
            setpoint=setpoint,
            kp=(spec.kp if spec.kp is not None else 0.0) / span,
            ki=spec.ki / span,
            kd=spec.kd / span,
            out_min=lo,
            out_max=hi,
            scale=scale,
            direction=spec.direction,
            max_step=max_step,
            deadband=spec.deadband,
            cooldown=float(spec.cooldown),
            setpoint_weight=spec.setpoint_weight,
            horizon=spec.horizon,
            setpoint_ramp=spec.setpoint_ramp,
            model_rate=rate,
            model_drift=drift,
            model_u_ref=u_ref,
        )

    def _pid(self, spec: ControllerSpec, knob: KnobState, step: int, setpoint_override: Any,
             baseline: float | None, model: tuple[float, float, float] | None = None) -> PID:
        """The validated PID law in force: the one built for the same inputs before, or a new one."""
        law = self._law(spec, knob, step, setpoint_override, baseline)
        key = (id(spec), *map(_exact, law), *map(_exact, model or ()))
        pid = self._pids.get(key)
        if pid is None:
            pid = self._law_class(spec)(self._config(spec, *law, model=model))  # validates: an invalid law is never kept
            if len(self._pids) >= _PID_CACHE_SIZE:
                self._pids.clear()
            self._pids[key] = pid
        return pid

    @staticmethod
    def extremum_config(spec: ControllerSpec, knob: KnobState) -> ExtremumConfig:
        """The extremum-seeking law of a ``kind: maximize`` controller on this run's knob: bounds
        and scale as for a PID; the centre's step is ``max_step``, or one dither by default."""
        lo = knob.min if spec.min is None else max(knob.min, spec.min)
        hi = knob.max if spec.max is None else min(knob.max, spec.max)
        scale = spec.scale or knob.scale
        dither = float(spec.dither) if spec.dither is not None else 0.0
        return ExtremumConfig(dither=dither, gain=spec.gain if spec.gain is not None else 0.0, out_min=lo,
                              out_max=hi, max_step=spec.max_step if spec.max_step is not None else dither,
                              smoothing=spec.smoothing, scale=scale,
                              cost_weight=spec.cost_weight)

    def _extremum(self, spec: ControllerSpec, knob: KnobState) -> ExtremumSeeking:
        """The validated extremum-seeking law in force (cached like the PIDs). Raises
        ParameterError when it cannot run on this knob, including a dither whose flip (2a per
        decision) the knob's own rate limit would cut."""
        cfg = self.extremum_config(spec, knob)
        key = (id(spec), *map(_exact, (cfg.out_min, cfg.out_max, cfg.scale, knob.max_step)))
        law = self._extrema.get(key)
        if law is None:
            move = 2 * cfg.dither + (cfg.max_step or 0.0)
            if knob.max_step is not None and move > knob.max_step * (1 + 1e-9):
                raise ParameterError("dither", f"a decision moves the knob by up to 2 x dither + max_step = {move:g} "
                                               f"(the dither flips, the centre steps), more than the knob's max_step "
                                               f"{knob.max_step:g}, which would cut the dither")
            law = ExtremumSeeking(cfg)  # validates
            if len(self._extrema) >= _PID_CACHE_SIZE:
                self._extrema.clear()
            self._extrema[key] = law
        return law

    @staticmethod
    def follow_config(spec: ControllerSpec, knob: KnobState) -> FollowConfig:
        """The follow law of a ``kind: follow`` controller on this run's knob: the schedule, bounds
        and scale as for a PID, ``max_step`` the controller's or else the knob's."""
        lo = knob.min if spec.min is None else max(knob.min, spec.min)
        hi = knob.max if spec.max is None else min(knob.max, spec.max)
        return FollowConfig(points=tuple((float(x), float(y)) for x, y in spec.schedule or ()), out_min=lo,
                            out_max=hi, scale=spec.scale or knob.scale,
                            max_step=spec.max_step if spec.max_step is not None else knob.max_step)

    def _follow_law(self, spec: ControllerSpec, knob: KnobState) -> Follow:
        """The validated follow law in force (cached like the PIDs). Raises ParameterError when it
        cannot run on this knob, including a schedule whose knob values leave the run's bounds
        (the law would clamp them, and the schedule would not say what the knob does)."""
        cfg = self.follow_config(spec, knob)
        key = (id(spec), *map(_exact, (cfg.out_min, cfg.out_max, cfg.scale, cfg.max_step)))
        law = self._follows.get(key)
        if law is None:
            law = Follow(cfg)  # validates
            outside = [y for _, y in law.points if not cfg.out_min <= y <= cfg.out_max]
            if outside:
                raise ParameterError("schedule", f"knob values {outside} are outside the bounds [{cfg.out_min:g}, "
                                                 f"{cfg.out_max:g}]")
            if len(self._follows) >= _PID_CACHE_SIZE:
                self._follows.clear()
            self._follows[key] = law
        return law

    @staticmethod
    def _law_class(spec: ControllerSpec) -> type[PID] | type[PIDLagrangian]:
        return PIDLagrangian if spec.kind == "constraint" else PID

    def knob_errors(self, knobs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
        """Why this policy cannot drive these knobs (name -> knob spec as a run stores it), each
        error with the policy field to change (``controllers.0.min``); empty when it can.

        Every controller's law is built as an observation would build it and validated, so what
        registration, a policy move and ``validate`` refuse is exactly what would fail at ingest:
        a knob the run does not declare, controller bounds disjoint from the knob's, a log scale
        over a bound <= 0, an integer scale over bounds that hold no integer."""
        errors: list[dict[str, str]] = []
        declared = sorted(knobs)
        for i, spec in enumerate(self.policy.controllers):
            if isinstance(spec, SplitRangeController):
                errors += self._split_errors(i, spec, knobs)
                continue
            stored = knobs.get(spec.knob)
            if stored is None:
                errors.append(_undeclared(f"controllers.{i}.knob", spec.name, spec.knob, declared))
                continue
            # Any step and baseline will do: bounds and scale do not depend on them, and a
            # setpoint is finite at every step once the document is valid.
            knob = KnobState.from_dict(stored, spec.knob)
            if spec.kind in ("maximize", "follow"):
                try:
                    self._extremum(spec, knob) if spec.kind == "maximize" else self._follow_law(spec, knob)
                except ParameterError as exc:
                    field = {"out_min": "min", "out_max": "max"}.get(exc.field, exc.field)
                    if field in ("min", "max") and spec.min is None and spec.max is None:
                        field = "knob"
                    errors.append({"loc": f"controllers.{i}.{field}",
                                   "msg": f"controller {spec.name!r} ({spec.kind}) on knob {spec.knob!r} "
                                          f"[{knob.min}, {knob.max}]: {exc}"})
                continue
            cfg = self.pid_config(spec, knob, 0, None, baseline=1.0)
            try:
                self._law_class(spec)(cfg)  # validates, as at every observation
            except ParameterError as exc:
                field = {"out_min": "min", "out_max": "max"}.get(exc.field, exc.field)
                where = f"knob {spec.knob!r} [{knob.min}, {knob.max}]"
                if cfg.out_min > cfg.out_max:
                    field = "min" if spec.min is not None else "max"
                    msg = (f"controller {spec.name!r}: its bounds [{spec.min}, {spec.max}] do not overlap {where}")
                else:
                    if field in ("min", "max") and spec.scale is not None:
                        field = "scale"  # the scale the controller chose does not fit the bounds
                    msg = f"controller {spec.name!r} on {where} with scale {cfg.scale!r}: {exc}"
                errors.append({"loc": f"controllers.{i}.{field}", "msg": msg})
        for i, g in enumerate(self.policy.guardrails):
            if g.knob is not None and g.knob not in knobs:
                errors.append({"loc": f"guardrails.{i}.knob",
                               "msg": f"guardrail {g.name!r} names knob {g.knob!r}, which the run does not "
                                      f"declare (knobs: {declared})"})
        return errors

    def _split_errors(self, i: int, spec: SplitRangeController, knobs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
        """knob_errors of a split_range controller: each leg's knob declared by the run, its values
        inside the knob's bounds, the law buildable on the run's knob scales."""
        errors: list[dict[str, str]] = []
        states = {}
        for k, leg in enumerate(spec.legs or ()):
            stored = knobs.get(leg.knob)
            if stored is None:
                errors.append(_undeclared(f"controllers.{i}.legs.{k}.knob", spec.name, leg.knob, sorted(knobs)))
                continue
            knob = states[leg.knob] = KnobState.from_dict(stored, leg.knob)
            outside = [v for v in leg.values if not knob.min <= v <= knob.max]
            if outside:
                errors.append({"loc": f"controllers.{i}.legs.{k}.values",
                               "msg": f"controller {spec.name!r}: values {outside} of knob {leg.knob!r} are outside "
                                      f"its bounds [{knob.min}, {knob.max}]"})
            elif knob.scale == "integer":
                errors.append({"loc": f"controllers.{i}.legs.{k}.knob",
                               "msg": f"controller {spec.name!r}: a split range moves a knob continuously; "
                                      f"{leg.knob!r} is an integer knob"})
        if not errors:
            try:
                self._split_law(spec, states, 0, None, 1.0)
            except ParameterError as exc:
                errors.append({"loc": f"controllers.{i}.{split_range_field(exc.field)}",
                               "msg": f"controller {spec.name!r} on the run's knobs: {exc}"})
        return errors

    def _split_law(self, spec: ControllerSpec, knobs: Mapping[str, KnobState], step: int, setpoint_override: Any,
                   baseline: float | None) -> SplitRange:
        """The validated split-range law in force (cached like the PIDs): the PID on the output u
        in [-1, 1] and the legs on the run's knob scales. Raises ParameterError (SplitRangeError)
        when it cannot run."""
        assert isinstance(spec, SplitRangeController)
        target = spec.setpoint if setpoint_override is None else setpoint_override
        if target is None:
            raise ParameterError("setpoint", "a split_range controller needs a setpoint")
        setpoint = setpoint_at(target, step, baseline)
        span = spec.error_span(setpoint, baseline)
        scales = {name: knobs[name].scale for name in spec.driven()}
        key = (id(spec), *map(_exact, (setpoint, span, *scales.values())))
        law = self._splits.get(key)
        if law is None:
            law = SplitRange(spec.config(self._config(spec, setpoint, -1.0, 1.0, "linear", spec.max_step, span),
                                         scales))  # validates
            if len(self._splits) >= _PID_CACHE_SIZE:
                self._splits.clear()
            self._splits[key] = law
        return law

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
        reason = (f"guardrail {g.name}: {g.probe} {_fmt(value)} {side} threshold {_fmt(threshold)}{at} "
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

    def _usable(self, build: Any, spec: ControllerSpec, knob: KnobState, st: ControllerState, step: int,
                result: EngineResult) -> Any:
        """``build(spec, knob)``: a non-PID law in force, or None when it cannot run on this run's
        knob (reported once as unusable; the controller is skipped)."""
        try:
            return build(spec, knob)
        except ParameterError as exc:
            self._unusable(st, spec, step, str(exc), result)
            return None

    def _controllers(self, ctx: RunContext, obs: ObservationCreate, values: dict[str, float], result: EngineResult) -> None:
        # Highest priority first; a knob changed by one controller this observation is not
        # changed again by a lower-priority one (which instead tracks the new value bumplessly).
        taken: set[str] = set()
        for spec in self._ordered:
            if isinstance(spec, SplitRangeController):
                self._split(ctx, obs, result, spec, values.get(spec.probe), taken)
                continue
            knob = ctx.knobs.get(spec.knob)
            raw = values.get(spec.probe)
            if raw is None and knob is not None and spec.probe.startswith("train.") and "loss" in obs.metrics:
                # the trainer logs its step (a loss) without this input: never a silent idle controller
                self._unusable(ctx.controllers.setdefault(spec.name, ControllerState()), spec, obs.step,
                               f"{spec.probe} is not among the metrics the trainer logs "
                               f"({', '.join(sorted(obs.metrics))}): the run is not controlled on it", result)
            if knob is None or raw is None or not math.isfinite(raw):
                continue
            st = ctx.controllers.setdefault(spec.name, ControllerState())
            last = st.last_step
            if last is not None and obs.step <= last:
                continue  # stale or repeated step: never act twice on old data
            dt = float(obs.step - last) if last is not None else 1.0
            if spec.kind == "maximize":
                self._maximize(ctx, obs, values, result, spec, knob, st, raw, dt, taken)
                continue
            if spec.kind == "follow":
                self._follow(ctx, obs, result, spec, knob, st, raw, dt, taken)
                continue
            law_spec: ControllerSpec = spec
            if spec.gains == "auto":
                tuned = self._auto(ctx, obs, spec, st, raw, result)
                if tuned is None:  # the warm-up step test runs: the probe is tracked, the law waits
                    self._track(obs, spec, knob, st, raw, -math.inf, math.inf)
                    continue
                law_spec = tuned
            filt = self._filter(spec)
            filtered, fstate = filt.update(raw, filt.state_from_dict(st.filter) if st.filter else None)
            # the reference for relative setpoints ('+10%'): the first filtered value
            baseline = filtered if st.baseline is None else st.baseline
            try:
                pid = self._pid(law_spec, knob, obs.step, st.setpoint_override, baseline,
                                _integrating(st))  # before any state moves
            except ParameterError as exc:
                # A stored policy whose law cannot run on this run's knobs (validation against the
                # knobs prevents it; runs and policies stored before it may still meet it): the
                # controller is reported unusable and skipped, never a failed observation.
                self._unusable(st, spec, obs.step, str(exc), result)
                continue
            st.error = None
            prev_filtered, prev_components = st.filtered, st.components
            st.filter = fstate.to_dict()
            st.last_step = obs.step
            st.probe, st.knob, st.raw, st.filtered, st.baseline = spec.probe, spec.knob, raw, filtered, baseline
            cfg = pid.config
            st.setpoint = cfg.setpoint
            # Act from the value really in effect (the agent reports it: an operator, a rollback or a
            # custom setter may have moved it since our last decision), clamped into bounds. The
            # learning-rate knob is a LambdaLR schedule's peak, so a schedule's own warm-up and decay
            # never show up here as knob changes for the PID to undo.
            reported = obs.knobs.get(spec.knob)
            current = float(reported if reported is not None else knob.value)
            current = min(max(current, cfg.out_min), cfg.out_max)
            if cfg.scale == "integer":
                current = float(round(current))
            knob.value = current
            early = (st.auto or {}).get("ended_early") if spec.gains == "auto" else None
            if early is not None and early["step"] == obs.step and st.pid is None:
                # the test ended because the probe ran past its setpoint: the law acts on this very
                # reading (P on the error from the value in effect), not one reading later
                st.pid = pid.takeover(current)
            held, pstate = _handover(pid, st, current, filtered, knob.override is not None or spec.knob in taken)
            if held:
                continue
            out = pid.update(filtered, dt, current, pstate)
            st.pid = out.state
            st.components = {"p": out.p, "i": out.i, "d": out.d, "error": out.error, **_law_inputs(out)}
            result.controller_outputs[spec.name] = st.components
            if not out.changed:
                continue
            taken.add(spec.knob)
            if spec.kind == "constraint":
                reason = _constraint_reason(spec.name, spec.probe, filtered, prev_filtered, cfg.setpoint, spec.bound,
                                            spec.knob, current, out)
            else:
                reason = _reason(spec.probe, filtered, prev_filtered, cfg.setpoint, spec.knob, current, out,
                                 prev_components, cfg.setpoint_ramp)
            self._decide(
                ctx, result, step=obs.step + 1, knob=spec.knob, new=out.value, reason=reason,
                controller=spec.name,
                components={"p": out.p, "i": out.i, "d": out.d, "error": out.error},
                inputs={"probe": spec.probe, "raw": raw, "filtered": filtered, "setpoint": cfg.setpoint,
                        **_law_inputs(out), "dt": dt, "unclamped": out.unclamped, "limited_by": list(out.limited_by),
                        "bounds": [cfg.out_min, cfg.out_max], "max_step": cfg.max_step, "scale": cfg.scale},
            )

    # -- gains auto ---------------------------------------------------------------------------
    def _auto(self, ctx: RunContext, obs: ObservationCreate, spec: ControllerSpec, st: ControllerState, raw: float,
              result: EngineResult) -> ControllerSpec | None:
        """The spec a ``gains: auto`` controller's law runs with at this observation: the tuned
        one once its warm-up step test was fitted, the policy's (fallback gains) when the fit was
        refused or no test was declared, None while the test runs (this observation is recorded).
        At the first observation at or after the test's end the fit is made (identify, SIMC,
        replay: :func:`actuator.tune.tune_controller`) and its outcome recorded as an event."""
        auto = st.auto
        if auto is None:
            st.auto = {"status": "fallback", "problem": "no_window"}
            result.events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem="no_window", gains=_gains_set(spec),
                reason=f"gains auto: no warm-up step test was declared for {spec.name!r} at registration (an agent "
                       "that predates gains auto, or a run registered without one): it runs on its fallback gains"))
            return spec
        status = auto.get("status")
        if status == "tuned":
            return self._tuned_spec(spec, auto["gains"])
        if status == "fallback":
            return spec
        if obs.step < int(auto["start"]):
            return None
        samples = auto.setdefault("samples", [])
        if not samples:
            auto["initial"] = float(ctx.knobs[spec.knob].value)
            auto["first"] = raw
        samples.append([obs.seq, obs.step, raw, obs.knobs.get(spec.knob)])
        if len(samples) > AUTO_MAX_SAMPLES:
            del samples[1::2]
        if obs.step < int(auto["end"]):
            passed = self._passed(spec, st, auto, raw, obs.step)
            if passed is None:
                return None
            # The test holds the knob and the law waits; a probe past its setpoint (or budget) is
            # a run out of control for the rest of the window: the test ends here, and the law
            # acts from this observation on (the agent ends its test at this decision).
            auto["ended_early"] = {"step": obs.step, "value": raw, "setpoint": passed}
        return self._calibrate(ctx, obs, spec, st, auto, result)

    @staticmethod
    def _passed(spec: ControllerSpec, st: ControllerState, auto: dict[str, Any], raw: float,
                step: int) -> float | None:
        """The setpoint (a constraint's budget) when ``raw`` is past it: across it from where the
        test's first reading stood (a setpoint), on the side the bound limits (a constraint);
        else None."""
        target = spec.setpoint if st.setpoint_override is None else st.setpoint_override
        if target is None:
            return None
        baseline = st.baseline if st.baseline is not None else float(auto.get("first", raw))
        setpoint = setpoint_at(target, step, baseline)
        if not math.isfinite(setpoint):
            return None
        if spec.kind == "constraint":
            past = raw > setpoint if spec.bound == "upper" else raw < setpoint
        else:
            first = float(auto.get("first", raw))
            past = (first - setpoint) * (raw - setpoint) < 0
        return setpoint if past else None

    def _calibrate(self, ctx: RunContext, obs: ObservationCreate, spec: ControllerSpec, st: ControllerState,
                   auto: dict[str, Any], result: EngineResult) -> ControllerSpec:
        from .tune import tune_controller  # the tuner replays policies through this module's Engine

        knobs = {name: k.to_dict() for name, k in ctx.knobs.items()}
        knobs[spec.knob] = {**knobs[spec.knob], "value": auto["initial"]}
        in_metrics = spec.probe.startswith("train.")
        name = spec.probe.removeprefix("train.")
        observations = [ObservationCreate.model_construct(
            seq=seq, step=step, probes={} if in_metrics else {name: y}, metrics={name: y} if in_metrics else {},
            knobs={} if u is None else {spec.knob: u})
            for seq, step, y, u in auto.pop("samples")]
        early = auto.get("ended_early")
        window = (int(auto["start"]), int(early["step"]) if early else int(auto["end"]))
        ended = (f"the step test ended early at step {early['step']}: {spec.probe} {early['value']:.4g} passed "
                 f"{early['setpoint']:.4g}; " if early else "")
        try:
            tuned = tune_controller(self.policy, knobs, spec.name, observations)
        except (ValueError, ArithmeticError) as exc:  # NotIdentifiable, ParameterError, a PolicyError
            problem = getattr(exc, "problem", None) or type(exc).__name__
            st.auto = {**auto, "status": "fallback", "problem": problem}
            result.events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem=problem, gains=_gains_set(spec),
                reason=f"gains auto: {ended}the warm-up step test on {spec.knob} (steps {window[0]}-{window[1]}) "
                       f"could not be fitted ({exc}); {spec.name!r} keeps its fallback gains"))
            return spec
        doc = next(c for c in tuned["policy"]["controllers"] if c["name"] == spec.name)
        if spec.kind == "setpoint" and doc["direction"] != spec.direction:
            # The policy states how the knob acts; a fit of the other sign is the probe's own motion
            # during the test (a drift that goes on while the knob steps away) taken for the knob's
            # effect, and gains of that sign would push the probe away from its setpoint.
            model = tuned["model"]
            st.auto = {**auto, "status": "fallback", "problem": "wrong_direction"}
            says = "raises" if doc["direction"] == "direct" else "lowers"
            result.events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem="wrong_direction", gains=_gains_set(spec),
                reason=f"gains auto: {ended}the warm-up step test on {spec.knob} (steps {window[0]}-{window[1]}) fitted a "
                       f"{model['kind']} model (gain {model['gain']:+.4g}, R2 {model['r2']:.2f}) by which raising "
                       f"{spec.knob} {says} {spec.probe}, against the controller's direction {spec.direction!r}: the "
                       "probe's own motion during the test was taken for the knob's effect; "
                       f"{spec.name!r} keeps its fallback gains"))
            return spec
        gains = _gains_set(spec, "absolute").model_copy(update={
            "kp": doc["kp"], "ki": doc["ki"], "kd": doc["kd"], "direction": doc["direction"],
            "setpoint_weight": doc["setpoint_weight"]})
        model, predicted = tuned["model"], tuned["predicted"]
        st.auto = {**auto, "status": "tuned", "gains": gains.model_dump()}
        if model["kind"] == "integrating":  # the projection of a controller with a horizon
            st.auto["model"] = {"rate": model["rate"], "drift": model["drift"], "u_ref": model["u_ref"]}
        result.events.append(AutoGainsTuned(
            step=obs.step, controller=spec.name, knob=spec.knob, window=window,
            fit=AutoGainsFit(model=model["kind"], gain=model["gain"], tau=model["tau"], theta=model["theta"],
                             r2=model["r2"], nrmse=model["nrmse"], observations=model["observations"]),
            gains=gains, warnings=([ended.removesuffix("; ")] if early else []) + list(tuned["warnings"]),
            predicted=AutoGainsPrediction(settling_steps=predicted["proposed"]["settling_steps"],
                                          overshoot_pct=predicted["proposed"]["overshoot_pct"],
                                          horizon=predicted["horizon"])))
        return self._tuned_spec(spec, st.auto["gains"])

    def _tuned_spec(self, spec: ControllerSpec, gains: Mapping[str, Any]) -> ControllerSpec:
        """``spec`` with a run's tuned gains (absolute), one object per distinct gains (the laws are
        cached on the spec's identity)."""
        update = {k: v for k, v in gains.items() if k in type(spec).model_fields}
        key = (id(spec), *map(_exact, (update.get(k) for k in sorted(update))))
        tuned = self._tuned.get(key)
        if tuned is None:
            if len(self._tuned) >= _PID_CACHE_SIZE:
                self._tuned.clear()
                self._pids.clear()  # keyed on the specs' identities: none may outlive its spec
            tuned = self._tuned[key] = spec.model_copy(update={**update, "identify": None})
        return tuned

    def _track(self, obs: ObservationCreate, spec: ControllerSpec, knob: KnobState, st: ControllerState, raw: float,
               lo: float, hi: float) -> tuple[float, float | None, float]:
        """The bookkeeping of a law without a PID (maximize, follow) at an observation it acts on:
        the filtered probe, the controller's memory updated, and the knob value in effect (the
        agent's report, else the last known) clamped into ``[lo, hi]``. Returns ``(filtered, the
        previous filtered value, value in effect)``."""
        st.error = None
        filt = self._filter(spec)
        filtered, fstate = filt.update(raw, filt.state_from_dict(st.filter) if st.filter else None)
        prev_filtered = st.filtered
        st.filter = fstate.to_dict()
        st.last_step = obs.step
        st.probe, st.knob, st.raw, st.filtered = spec.probe, spec.knob, raw, filtered
        st.baseline = filtered if st.baseline is None else st.baseline
        reported = obs.knobs.get(spec.knob)
        current = min(max(float(reported if reported is not None else knob.value), lo), hi)
        knob.value = current
        return filtered, prev_filtered, current

    def _follow(self, ctx: RunContext, obs: ObservationCreate, result: EngineResult, spec: ControllerSpec,
                knob: KnobState, st: ControllerState, raw: float, dt: float, taken: set[str]) -> None:
        """One update of a ``kind: follow`` controller: the knob goes to the schedule's value at the
        filtered probe, within the bounds and at most ``max_step`` from the value in effect. The law
        has no state, so an override, another controller's move or control handed back needs no
        restart: the law only stands aside while the knob is someone else's."""
        law = self._usable(self._follow_law, spec, knob, st, obs.step, result)
        if law is None:
            return
        cfg = law.config
        # the value in effect as reported, even outside the bounds: the law brings it back at once
        filtered, prev_filtered, current = self._track(obs, spec, knob, st, raw, -math.inf, math.inf)
        st.reset = False
        if knob.override is not None or spec.knob in taken:
            return
        out = law.update(filtered, current)
        st.components = {"target": out.target}
        result.controller_outputs[spec.name] = st.components
        if not out.changed:
            return
        taken.add(spec.knob)
        reason = (f"follow {spec.name}: {spec.probe} {_fmt(filtered)}{_trend(filtered, prev_filtered)} -> "
                  f"{spec.knob} {_fmt(out.target)} ({law.where(out.segment)}): {spec.knob} {_fmt(current)} -> "
                  f"{_fmt(out.value)}{_limits(out)}")
        self._decide(
            ctx, result, step=obs.step + 1, knob=spec.knob, new=out.value, reason=reason, controller=spec.name,
            components={"target": out.target},
            inputs={"probe": spec.probe, "raw": raw, "filtered": filtered, "dt": dt,
                    "schedule": [list(p) for p in law.points], "segment": list(out.segment),
                    "limited_by": list(out.limited_by), "bounds": [cfg.out_min, cfg.out_max],
                    "max_step": cfg.max_step, "scale": cfg.scale},
        )

    def _split(self, ctx: RunContext, obs: ObservationCreate, result: EngineResult, spec: SplitRangeController,
               raw: float | None, taken: set[str]) -> None:
        """One update of a ``kind: split_range`` controller: the PID on the output u, from the u the
        two knobs in effect correspond to; one decision per knob that moved, its reason naming the
        knob that acted and why. While either knob is overridden or another controller moved it
        this observation, the law tracks the knobs bumplessly and decides nothing."""
        names = spec.driven()
        if raw is None or not math.isfinite(raw) or any(n not in ctx.knobs for n in names):
            return
        st = ctx.controllers.setdefault(spec.name, ControllerState())
        if st.last_step is not None and obs.step <= st.last_step:
            return
        dt = float(obs.step - st.last_step) if st.last_step is not None else 1.0
        filt = self._filter(spec)
        filtered, fstate = filt.update(raw, filt.state_from_dict(st.filter) if st.filter else None)
        baseline = filtered if st.baseline is None else st.baseline
        try:
            law = self._split_law(spec, ctx.knobs, obs.step, st.setpoint_override, baseline)
        except ParameterError as exc:
            self._unusable(st, spec, obs.step, str(exc), result)
            return
        st.error = None
        prev_filtered = st.filtered
        st.filter, st.last_step, st.baseline = fstate.to_dict(), obs.step, baseline
        st.probe, st.knob, st.raw, st.filtered = spec.probe, "+".join(names), raw, filtered
        st.setpoint = law.config.law.setpoint
        current = {}
        for name in names:
            reported = obs.knobs.get(name)
            current[name] = ctx.knobs[name].value = float(reported if reported is not None else ctx.knobs[name].value)
        held, pstate = _handover(law, st, current, filtered,
                                 any(ctx.knobs[n].override is not None or n in taken for n in names))
        if held:
            return
        out = law.update(filtered, dt, current, pstate, probe=spec.probe)
        st.pid = out.state
        st.components = {"p": out.law.p, "i": out.law.i, "d": out.law.d, "error": out.law.error, "u": out.u}
        result.controller_outputs[spec.name] = st.components
        reason = f"split_range {spec.name}: {out.reason}"
        for name in out.acted:
            taken.add(name)
            self._decide(
                ctx, result, step=obs.step + 1, knob=name, new=out.values[name], reason=reason, controller=spec.name,
                components=dict(st.components),
                inputs={"probe": spec.probe, "raw": raw, "filtered": filtered, "previous": prev_filtered,
                        "setpoint": st.setpoint, "dt": dt, "u": out.u, "unclamped": out.law.unclamped,
                        "projected": out.law.projected, "limited_by": list(out.law.limited_by), "knobs": current,
                        "legs": [{"knob": leg.knob, "range": [leg.lo, leg.hi], "values": [leg.at_lo, leg.at_hi],
                                  "acts": leg.acts, "scale": leg.scale} for leg in law.legs]},
            )

    def _maximize(self, ctx: RunContext, obs: ObservationCreate, values: dict[str, float], result: EngineResult,
                  spec: ControllerSpec, knob: KnobState, st: ControllerState, raw: float, dt: float,
                  taken: set[str]) -> None:
        """One update of a ``kind: maximize`` controller (extremum seeking); same bookkeeping as
        the PID path: filter, value in effect, override / another controller / reset handling."""
        cost = None
        if spec.cost is not None:
            cost = values.get(spec.cost)
            if cost is None or not math.isfinite(cost):
                return  # the objective needs both; wait for an observation that carries the cost
        law = self._usable(self._extremum, spec, knob, st, obs.step, result)
        if law is None:
            return
        cfg = law.config
        filtered, prev_filtered, current = self._track(obs, spec, knob, st, raw, cfg.out_min, cfg.out_max)
        state = ExtremumState.from_dict(st.law) if st.law else None
        if knob.override is not None or spec.knob in taken or st.reset:
            # An operator's value, another controller's move, or control handed back: start a new
            # search around the value in effect (a stale gradient estimate would be wrong there).
            st.reset = False
            st.law = law.restart(state).to_dict()
            if knob.override is not None or spec.knob in taken:
                return
            state = ExtremumState.from_dict(st.law)
        out = law.update(filtered, dt, current, state, cost=cost)
        st.law = out.state.to_dict()
        st.components = {"objective": out.objective, "gradient": out.gradient, "step": out.step,
                         "dither": out.dither, "centre": out.centre}
        result.controller_outputs[spec.name] = st.components
        if not out.changed:
            return
        taken.add(spec.knob)
        reason = _maximize_reason(spec, filtered, prev_filtered, cost, current, out)
        self._decide(
            ctx, result, step=obs.step + 1, knob=spec.knob, new=out.value, reason=reason, controller=spec.name,
            components=dict(st.components),
            inputs={"probe": spec.probe, "raw": raw, "filtered": filtered, "cost": cost, "cost_probe": spec.cost,
                    "highpass": out.highpass, "demodulated": out.demodulated, "estimates": out.state.estimates,
                    "dt": dt, "limited_by": list(out.limited_by), "bounds": [cfg.out_min, cfg.out_max],
                    "max_step": cfg.max_step, "dither": cfg.dither, "gain": cfg.gain, "scale": cfg.scale},
        )


def _maximize_reason(spec: ControllerSpec, filtered: float, prev: float | None, cost: float | None, current: float,
                     out: Any) -> str:
    """The maximiser's line: what it measured, what it estimates, how the centre moved, e.g.
    ``maximize max-acceptance: draft.acceptance 0.2612 and rising, d/d(onpolicy_fraction) ≈ +0.031
    (4 estimates): centre 0.5 -> 0.6 (+0.1, limited by rate), dither -0.15: onpolicy_fraction 0.65 -> 0.45``."""
    trend = _trend(filtered, prev)
    objective = "" if cost is None else f" (objective {_fmt(out.objective)} after cost {spec.cost} {_fmt(cost)})"
    if out.demodulated is None:
        estimate = f"estimating the gradient (needs 3 dithered readings, has {len(out.state.objectives)})"
    else:
        estimate = f"d/d({spec.knob}) ≈ {out.gradient:+.3g} ({out.state.estimates} estimates)"
    old_centre = "start" if out.state.estimates == 0 and out.step == 0 else None
    move = (f"centre {_fmt(out.centre)}" if old_centre else
            f"centre -> {_fmt(out.centre)} ({out.step:+.3g}{_limits(out)})")
    return (f"maximize {spec.name}: {spec.probe} {_fmt(filtered)}{trend}{objective}, {estimate}: {move}, "
            f"dither {out.dither:+.3g}: {spec.knob} {_fmt(current)} -> {_fmt(out.value)}")
