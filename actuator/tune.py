"""Tune a policy's controller from a recorded run: identify, apply SIMC, validate by replay.

Setpoint controllers (PID) and constraint controllers (PID-Lagrangian: a PI on the violation,
so SIMC's PI gains apply while the constraint binds; its direction is its bound's, and a
recorded response of the other sign is refused).

1. The controller's probe and the knob values in effect (as the agent reported them) are read
   from the run's observations, the knob in its scale (``ln`` for log-scale knobs), and a FOPDT
   or integrating model is fitted (:func:`controllers.identify.identify`, stdlib least squares).
2. SIMC gives gains for it (:func:`controllers.tuning.simc`): PI, plus derivative when the
   controller filters its probe (the EMA's lag is cancelled); the probe interval counts as dead time.
3. The policy with the proposed gains, and the one with the current gains, run closed loop
   against the fitted model through the engine (:func:`actuator.simulate.simulate_model`), and
   the predicted settling time (+-10% band) and overshoot are reported for both.

:func:`tune_controller` answers a :class:`Tuned` (``to_dict()``: the ``/tune`` answer). Used by
``POST /v1/policies/tune``, ``actuator policy tune``, ``benchmarks/control/tune.py`` and, as
:func:`fit_warmup`, by the service's engines for gains auto's warm-up (:mod:`actuator.warmup`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from ._exceptions import ActuatorError, PolicyError
from .controllers.identify import FittedModel, NotIdentifiable, identify
from .controllers.tuning import Tuning, noise_jitter, simc
from .policy import ControllerSpec, PolicyDocument, load_policy
from .run_state import KnobState
from .simulate import simulate_model

__all__ = ["NotIdentifiable", "Prediction", "Tuned", "UnknownController", "WrongDirection", "fit_warmup", "tune_report",
           "settling_steps", "overshoot_pct", "series", "tune_controller"]

# The replay's length: enough closed-loop time constants to see settling, within a bound on work
# (seven replays of an engine update per observation, about 0.1 ms each: 1000 observations bound
# them at about 0.7 CPU-s).
_HORIZON_TIME_CONSTANTS = 12.0
_MAX_REPLAY_STEPS = 100_000
_MAX_REPLAY_OBSERVATIONS = 1_000
SETTLING_BAND = 0.10
# The replay picks the setpoint weight, from 1 (P on the error, SIMC's structure) to 0 (I-P, the
# PID's bumpless default) in quarters: the fastest whose predicted overshoot stays within this (%).
MAX_OVERSHOOT_PCT = 15.0
_SETPOINT_WEIGHTS = (1.0, 0.75, 0.5, 0.25, 0.0)
_NOISE_SLOWDOWN = 1.25
_NOISE_ROUNDS = 20


class UnknownController(PolicyError):
    """The policy has no setpoint controller of that name."""


class WrongDirection(ActuatorError, NotIdentifiable):
    """A constraint's knob moved the probe the way its bound does not limit."""

    problem = "wrong_direction"


def settling_steps(values: Sequence[float], setpoints: Sequence[float], band: float = SETTLING_BAND) -> int | None:
    """Steps from the start until ``values`` stay within ``+-band * |setpoint|`` to the end; ``None``
    if they end outside (the definition ``benchmarks/control/plants.py`` scores with)."""
    settled: int | None = None
    for k, (y, sp) in enumerate(zip(values, setpoints)):
        if abs(y - sp) > band * abs(sp):
            settled = None
        elif settled is None:
            settled = k
    return settled


def overshoot_pct(values: Sequence[float], setpoints: Sequence[float]) -> float:
    """Largest excursion past the setpoint on the side away from the start, in % of the initial
    distance to it (as ``benchmarks/control/plants.py``)."""
    y0, sp0 = values[0], setpoints[0]
    side = 1.0 if sp0 >= y0 else -1.0
    scale = abs(sp0 - y0) or abs(sp0) or 1.0
    worst = max(side * (y - sp) for y, sp in zip(values, setpoints))
    return max(0.0, worst) / scale * 100.0


def _value(obs: Any, probe: str) -> float | None:
    if probe.startswith("train."):
        v = (obs.metrics or {}).get(probe.removeprefix("train."))
    else:
        v = (obs.probes or {}).get(probe)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None


def series(observations: Sequence[Any], probe: str, knob: str, initial: float,
           scale: str) -> tuple[list[float], list[float], list[float]]:
    """Steps, knob (scale units) and probe values of the observations that carry the probe; each
    knob value is the one the steps up to that observation ran at.

    The agent reads the knobs for an observation at the step boundary, after that boundary's
    decisions and identification moves: what it reports is in effect from the *next* step on. So
    the steps up to an observation ran at the value the previous observation reported (``initial``
    before the first; an observation without the knob keeps the last). Taking the reported value
    as the one that produced the probe would shift every knob move one interval early and add one
    interval of dead time to the fit (measured on SmolLM2's DPO KL: theta 1.5 steps, probing
    every step)."""
    steps: list[float] = []
    us: list[float] = []
    ys: list[float] = []
    current = initial
    for o in sorted(observations, key=lambda o: o.seq):
        ran_at = current
        reported = (o.knobs or {}).get(knob)
        if isinstance(reported, (int, float)) and math.isfinite(reported):
            current = float(reported)
        y = _value(o, probe)
        if y is None:
            continue
        if scale == "log" and ran_at <= 0:
            continue
        u = math.log(ran_at) if scale == "log" else ran_at
        if steps and o.step <= steps[-1]:
            if o.step == steps[-1]:  # a repeated step: the later reading stands
                ys[-1] = y
            continue
        steps.append(float(o.step))
        us.append(u)
        ys.append(y)
    return steps, us, ys


def _min_move(knob: KnobState, scale: str) -> float:
    """The smallest knob excursion worth identifying from: 5% for a log knob, 1% of the bounds'
    span for a linear one, one unit for an integer one."""
    if scale == "log":
        return 0.05
    if scale == "integer":
        return 0.5
    span = knob.max - knob.min
    return 0.01 * span if math.isfinite(span) and span > 0 else 0.0


def _controller(policy: PolicyDocument, name: str) -> tuple[int, ControllerSpec]:
    for i, c in enumerate(policy.controllers):
        if c.name == name:
            if c.kind not in ("setpoint", "constraint"):
                raise UnknownController(f"controller {name!r} is a {c.kind} controller; tune handles setpoint "
                                        "controllers (PID) and constraint controllers (PID-Lagrangian)",
                                        [{"loc": "controller", "msg": "not a setpoint or constraint controller"}])
            return i, c
    names = [c.name for c in policy.controllers]
    raise UnknownController(f"the policy {policy.name!r} has no controller {name!r} (controllers: {names})",
                            [{"loc": "controller", "msg": f"not in the policy (controllers: {names})"}])


@dataclass(frozen=True)
class Prediction:
    """A policy replayed closed loop on the fitted model: settling (+-10% band), overshoot, the
    final error, and (when the controller ran) the knob's end and range, the decisions and the
    response (at most about 50 points)."""

    settling_steps: int | None = None
    overshoot_pct: float | None = None
    final_error: float | None = None
    decisions: int = 0
    final_knob: float | None = None
    knob_range: tuple[float, float] | None = None
    response: tuple[dict[str, float], ...] | None = None  # None: the controller never ran in the replay

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"settling_steps": self.settling_steps, "overshoot_pct": self.overshoot_pct,
                               "final_error": self.final_error}
        if self.response is not None:
            out |= {"final_knob": self.final_knob, "knob_range": list(self.knob_range or ())}
        out["decisions"] = self.decisions
        if self.response is not None:
            out["response"] = [dict(r) for r in self.response]
        return out


def _predict(doc: PolicyDocument, knobs: dict[str, dict[str, Any]], model: FittedModel, spec: ControllerSpec,
             steps: int, every: int, start: int) -> Prediction:
    sim = simulate_model(doc, knobs, model, probe=spec.probe, knob=spec.knob, steps=steps, every=every,
                         start_step=start)
    trace = [t for t in sim["trace"] if spec.name in t["setpoints"]]
    if not trace:
        return Prediction()
    ys = [t["probe"] for t in trace]
    sps = [t["setpoints"][spec.name] for t in trace]
    knob_values = [t["knob"] for t in trace]
    return Prediction(
        settling_steps=settling_steps(ys, sps),
        overshoot_pct=overshoot_pct(ys, sps),
        final_error=sps[-1] - ys[-1],
        final_knob=knob_values[-1],
        knob_range=(min(knob_values), max(knob_values)),
        decisions=len(sim["decisions"]),
        response=tuple({"step": t["step"], "probe": y, "setpoint": sp, "knob": u}
                       for t, y, sp, u in zip(trace, ys, sps, knob_values))[:: max(1, len(trace) // 50)],
    )


@dataclass(frozen=True)
class Tuned:
    """What :func:`tune_controller` found: the fitted ``model``, the proposed ``tuning`` (SIMC, the
    setpoint weight the replay picked), the ``policy`` with those gains (validated; ``spec`` is
    its controller), their replay on the model (``proposed``; ``current``: the current gains',
    None when not asked for), and the warnings and limits the proposal breaks."""

    controller: str
    probe: str
    knob: str
    scale: str
    model: FittedModel
    tuning: Tuning
    policy: PolicyDocument
    index: int  # the controller's position in ``policy``
    current_spec: ControllerSpec  # the controller as given (its current gains)
    interval: int
    horizon: int
    proposed: Prediction
    current: Prediction | None
    noise_floor: dict[str, float] | None
    warnings: list[str] = field(default_factory=list)
    outside_limits: list[str] = field(default_factory=list)
    observations_used: int = 0

    @property
    def spec(self) -> ControllerSpec:
        """The controller with the proposed gains."""
        return self.policy.controllers[self.index]

    def to_dict(self) -> dict[str, Any]:
        """The ``POST /v1/policies/tune`` answer (without ``run_id`` and ``observations_total``)."""
        c = self.current_spec
        document = self.policy.model_dump(mode="json")
        return {
            "controller": self.controller,
            "probe": self.probe,
            "knob": self.knob,
            "scale": self.scale,
            "model": self.model.to_dict(),
            "gains": self.tuning.to_dict(),
            "noise_floor": self.noise_floor,
            "current_gains": {"kp": c.kp, "ki": c.ki, "kd": c.kd, "gains": c.gains, "direction": c.direction,
                              "setpoint_weight": c.setpoint_weight},
            "interval": self.interval,
            "predicted": {"horizon": self.horizon, "proposed": self.proposed.to_dict(),
                          "current": None if self.current is None else self.current.to_dict()},
            "policy": document,
            "policy_yaml": yaml.safe_dump(self.policy.model_dump(mode="json", exclude_none=True), sort_keys=False),
            "warnings": list(self.warnings),
            # the proposal against tune's own limits (MAX_OVERSHOOT_PCT, settling within the replay and
            # within the recorded run): each miss says what to change
            "within_limits": not self.outside_limits,
            "outside_limits": list(self.outside_limits),
            "observations_used": self.observations_used,
        }


def _setpoint_at_start(spec: ControllerSpec) -> float | None:
    """The controller's setpoint at its first point (``None`` when relative to the probe's start)."""
    if isinstance(spec.setpoint, (int, float)):
        return float(spec.setpoint)
    if isinstance(spec.setpoint, list) and spec.setpoint:
        return float(spec.setpoint[0][1])
    return None


def _with_gains(policy: PolicyDocument, index: int, controller: str, tuning: Tuning,
                aggressiveness: float) -> PolicyDocument:
    document = policy.model_dump(mode="json")
    document["controllers"][index].pop("identify", None)  # the step test of gains auto: done with
    if document["controllers"][index].get("kind") == "constraint":
        # The multiplier's direction is its bound's, and it starts at rest: only the gains change.
        document["controllers"][index].update(kp=tuning.kp, ki=tuning.ki, kd=tuning.kd, gains="absolute")
    else:
        document["controllers"][index].update(kp=tuning.kp, ki=tuning.ki, kd=tuning.kd, gains="absolute",
                                              direction=tuning.direction, setpoint_weight=tuning.setpoint_weight)
    document["description"] = (f"{policy.description} " if policy.description else "") + (
        f"[{controller}: gains from actuator policy tune, {tuning.rule.split(':')[0]}, aggressiveness "
        f"{aggressiveness:g}, setpoint weight {tuning.setpoint_weight:g}]")[:2000]
    try:
        return load_policy(document)
    except PolicyError as exc:  # gains past MAX_GAIN: a model with next to no gain
        raise NotIdentifiable(f"the gains for this model do not make a valid policy ({exc}); the knob's effect "
                              "is too small to control the probe with") from exc


def _check_bound(spec: ControllerSpec, model: FittedModel) -> None:
    """A constraint's multiplier pushes one way only (an upper bound needs a knob that lowers the
    probe): a recorded response the other way cannot be tuned for, whatever its fit."""
    lowers = model.gain < 0
    if lowers != (spec.bound == "upper"):
        moved = "lowered" if lowers else "raised"
        raise WrongDirection(
            f"in the recorded run raising {spec.knob} {moved} {spec.probe} (fitted gain {model.gain:+.4g}, "
            f"R2 {model.r2:.2f}), but a {spec.bound}-bound constraint needs a knob that "
            f"{'lowers' if spec.bound == 'upper' else 'raises'} it: identify where the constraint binds, with the "
            "probe past its start in the direction the budget limits")


def _rank(predicted: Prediction) -> tuple[bool, float, float]:
    """Within the overshoot limit first, then the faster settling, then the smaller overshoot."""
    over = predicted.overshoot_pct if predicted.overshoot_pct is not None else math.inf
    settle = predicted.settling_steps if predicted.settling_steps is not None else math.inf
    return (over > MAX_OVERSHOOT_PCT, settle, over)


def tune_controller(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], controller: str,
                    observations: Sequence[Any], *, aggressiveness: float = 1.0,
                    horizon: int | None = None, interval: int | None = None, compare: bool = True) -> Tuned:
    """Identify, tune and validate ``controller`` of ``policy`` on a run's ``observations``
    (``knobs`` as the run registered them). ``interval``: the run's steps between observations,
    when ``observations`` are a sample of it (every k-th); ``compare``: replay the current gains
    too. Raises :class:`UnknownController` (a :class:`PolicyError`), :class:`NotIdentifiable`, or
    ``ParameterError`` on bad arguments."""
    index, spec = _controller(policy, controller)
    if spec.knob not in knobs:
        raise UnknownController(f"controller {controller!r} drives knob {spec.knob!r}, which the run does not "
                                f"declare (knobs: {sorted(knobs)})",
                                [{"loc": "controller", "msg": f"its knob {spec.knob!r} is not the run's"}])
    knob = KnobState.from_dict(knobs[spec.knob], spec.knob)
    scale = spec.scale or knob.scale
    steps, us, ys = series(observations, spec.probe, spec.knob, float(knob.value), scale)
    model = identify(steps, us, ys, min_move=_min_move(knob, scale))
    # The law's interval is the policy's probe interval when it declares one (an identification
    # pre-run may probe more often than the loop will), else the run's (given when the
    # observations are a sample), else the recorded observations' median gap.
    gaps = sorted(b - a for a, b in zip(steps, steps[1:]))
    declared = next((p.every for p in policy.probes if p.name == spec.probe and p.every is not None), None)
    if declared is not None:
        every = declared
    elif interval is not None:
        every = interval
    else:
        every = max(1, int(round(gaps[len(gaps) // 2])))
    alpha = spec.filter.alpha if spec.filter.kind == "ema" else None
    tuning: Tuning = simc(model, aggressiveness=aggressiveness, interval=every, filter_alpha=alpha)
    if spec.kind == "constraint":
        _check_bound(spec, model)
    setpoint_now = _setpoint_at_start(spec)
    noise_floor = None
    if setpoint_now is not None:
        # Noise: a loop that moves the probe by its own reaction to probe noise cannot stay in the
        # band. Slow tau_c (x1.25 at a time) until two sd of that jitter fit inside it.
        limit = SETTLING_BAND * abs(setpoint_now) / 2.0
        slower = aggressiveness
        for _ in range(_NOISE_ROUNDS):
            jitter = noise_jitter(model, tuning, interval=every, filter_alpha=alpha)
            if jitter is None or jitter <= limit:
                break
            slower /= _NOISE_SLOWDOWN
            tuning = simc(model, aggressiveness=slower, interval=every, filter_alpha=alpha)
            noise_floor = {"jitter": jitter, "limit": limit, "tau_c": tuning.tau_c}

    # The replay starts where the recorded run started: the knob in effect at the first
    # observation, the model's own initial state.
    start_value = math.exp(model.u_ref) if scale == "log" else model.u_ref
    replay_knobs = {**knobs, spec.knob: {**knobs[spec.knob], "value": start_value}}
    span = int(steps[-1] - steps[0])
    closed_loop = tuning.tau_c + tuning.theta_eff + (model.tau if model.kind == "fopdt" else 0.0)
    length = horizon if horizon is not None else max(span, int(math.ceil(_HORIZON_TIME_CONSTANTS * closed_loop)),
                                                      10 * every)
    length = min(length, _MAX_REPLAY_STEPS, _MAX_REPLAY_OBSERVATIONS * every)
    start = int(steps[0])

    # The structure, by replay: SIMC assumes P on the error (setpoint weight 1), right for a probe
    # that starts at rest; a probe that starts moving on its own (KL from 0, drift that grows with
    # training: the model's transient or drift term) closes part of the initial error without the
    # knob, and P on all of that error then overshoots, while with none of it (I-P) the P on the
    # rising measurement brakes the approach (the KL plant's seed 3: 11 intervals at 0, 3 at 0.25).
    # Weights 1, 0.75, ..., 0 are replayed on the fitted model and the fastest within the overshoot
    # limit is proposed.
    candidates = []
    for weight in (_SETPOINT_WEIGHTS if spec.kind == "setpoint" else (0.0,)):
        t = replace(tuning, setpoint_weight=weight)
        doc = _with_gains(policy, index, controller, t, aggressiveness)
        candidates.append((t, doc, _predict(doc, replay_knobs, model, spec, length, every, start)))
    tuning, proposed, predicted = min(candidates, key=lambda c: _rank(c[2]))
    current = _predict(policy, replay_knobs, model, spec, length, every, start) if compare else None

    warnings = []
    if model.r2 < 0.5:
        warnings.append(f"the model explains only {model.r2:.0%} of the probe's variance: treat the gains as a "
                        "starting point")
    setpoint = predicted.response[-1]["setpoint"] if predicted.response else None
    if setpoint is not None:
        # A FOPDT with a drift term moves its balance point: check the replay's end as well.
        for at in (0, length) if model.kind == "fopdt" and model.drift else (0,):
            needed = model.steady_knob(setpoint, at_step=at)
            if needed is None:
                break
            value = math.exp(min(needed, 700.0)) if scale == "log" else needed
            lo = knob.min if spec.min is None else max(knob.min, spec.min)
            hi = knob.max if spec.max is None else min(knob.max, spec.max)
            if not lo <= value <= hi:
                when = (f" after {at} steps (the probe drifts {model.drift:+.3g} per step on its own)" if at
                        else "")
                warnings.append(f"by the model, holding {spec.probe} at {setpoint:.4g} needs {spec.knob} ~ "
                                f"{value:.4g}{when}, outside its bounds [{lo:.4g}, {hi:.4g}]: the setpoint is out "
                                "of reach")
                break
    outside = _outside_limits(predicted, aggressiveness, every, span,
                              spec.max_step if spec.max_step is not None else knob.max_step)
    if predicted.settling_steps is None:
        warnings.append(f"the replay does not settle within +-10% in {length} steps")
    return Tuned(controller=controller, probe=spec.probe, knob=spec.knob, scale=scale, model=model, tuning=tuning,
                 policy=proposed, index=index, current_spec=spec, interval=every, horizon=length, proposed=predicted,
                 current=current, noise_floor=noise_floor, warnings=warnings, outside_limits=outside,
                 observations_used=len(steps))


def tune_report(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], controller: str,
                observations: Sequence[Any], **options: Any) -> dict[str, Any]:
    """:func:`tune_controller`'s answer as ``POST /v1/policies/tune`` sends it (what its worker
    process returns: plain data)."""
    return tune_controller(policy, knobs, controller, observations, **options).to_dict()


def fit_warmup(policy: PolicyDocument, knobs: dict[str, dict[str, Any]], controller: str,
               observations: Sequence[Any], /) -> Tuned:
    """The fit at the end of a gains-auto warm-up step test (the tuner of :mod:`actuator.warmup`):
    :func:`tune_controller` at its defaults, without the current gains' replay, which the
    warm-up does not report."""
    return tune_controller(policy, knobs, controller, observations, compare=False)


def _outside_limits(predicted: Prediction, aggressiveness: float, every: int, span: int,
                    max_step: float | None) -> list[str]:
    """Where the proposed gains' replay breaks the limits tune states (overshoot within
    :data:`MAX_OVERSHOOT_PCT`, settling within +-10% inside the replay and inside the recorded
    run's length), one sentence each with the numbers and what to change; empty: within them."""
    out = []
    slower = f"--aggressiveness {aggressiveness / 2:g} (now {aggressiveness:g}: the closed loop twice as slow)"
    over, settle = predicted.overshoot_pct, predicted.settling_steps
    if over is not None and over > MAX_OVERSHOOT_PCT:
        rate = (f", a larger max_step if the knob's rate limit ({max_step:g} a decision) holds its cuts back"
                if max_step is not None else "")
        out.append(f"predicted overshoot {over:.0f}% is past the {MAX_OVERSHOOT_PCT:g}% limit (no setpoint weight "
                   f"from 1 to 0 kept it within): try {slower}{rate}, probe more often (every {every} steps counts "
                   "as dead time), or give the controller a setpoint_ramp or a horizon")
    if settle is None:
        out.append(f"the replay does not settle within +-{SETTLING_BAND:.0%}: try {slower}, or check the warnings "
                   "on the model (a setpoint out of reach does not settle at any gains)")
    elif span > 0 and settle > span:
        out.append(f"predicted settling in {settle} steps is longer than the recorded run ({span} steps): a run "
                   f"that long would end before it settles; try {slower} if the overshoot is what delays it, "
                   "else record a longer identification run")
    return out
