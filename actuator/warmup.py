"""Gains auto's warm-up, the engine's collaborator: the step test's stages and the fit at its end.

A ``gains: auto`` controller starts with a warm-up step test: the agent moves the knob, the law
waits, the readings are recorded. :class:`Warmup` tells the engine which spec the controller's law
runs with at each observation (none while the test runs), moving the controller's typed state
(:mod:`actuator.run_state`: pending -> recording -> tuned | fallback). At the first observation at
or after the test's end (or at a reading past the setpoint, which ends it early) it hands the
recorded readings to the **tuner** the engine was built with, and records the outcome and its event.

The tuner is injected, never imported: in the service it is :func:`actuator.tune.fit_warmup`
(identify, SIMC, replay), which replays policies through the engine, so an engine importing it
would close an import cycle. The store wraps it in :class:`FitsOutsideLock`, so that the heavy fit
runs outside the run's lock (the ingest is retried with the fit made, the same decisions at the
same steps). An engine built without a tuner falls back, and says so.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from ._exceptions import ActuatorError
from .controllers.identify import FittedModel
from .policy import ControllerSpec, PolicyDocument, setpoint_at
from .run_state import (AutoFallback, AutoPending, AutoRecording, AutoTuned, ControllerState, EndedEarly,
                        IntegratingFit, RunContext)
from .schemas import (AutoGainsFallback, AutoGainsFit, AutoGainsPrediction, AutoGainsSet, AutoGainsTuned, Event,
                      ObservationCreate)

__all__ = ["AUTO_MAX_SAMPLES", "FitNeeded", "FitResult", "FitsOutsideLock", "Tuner", "Warmup", "fits_in_place",
           "gains_set"]

# The most observations a gains-auto controller records in its warm-up step test (beyond, every
# other one is dropped: the fit needs the step's shape, not every reading).
AUTO_MAX_SAMPLES = 1000
# Distinct tuned specs one engine keeps (beyond, it starts over, and so do the engine's laws, which
# are cached on the specs' identities).
_TUNED_CACHE_SIZE = 4096


class Prediction(Protocol):
    @property
    def settling_steps(self) -> int | None: ...
    @property
    def overshoot_pct(self) -> float | None: ...


class FitResult(Protocol):
    """What the warm-up reads of a tuner's answer (:class:`actuator.tune.Tuned` is one)."""

    @property
    def spec(self) -> ControllerSpec: ...  # the controller with the proposed gains (validated)
    @property
    def model(self) -> FittedModel: ...
    @property
    def proposed(self) -> Prediction: ...  # the proposed gains replayed on the model
    @property
    def horizon(self) -> int: ...
    @property
    def warnings(self) -> list[str]: ...


class Tuner(Protocol):
    """Fits ``controller`` of ``policy`` on the test's readings (``knobs`` as at the test's start);
    raises ``ValueError`` / ``ArithmeticError`` (NotIdentifiable, ...) when it cannot."""

    def __call__(self, policy: PolicyDocument, knobs: dict[str, dict[str, Any]], controller: str,
                 observations: Sequence[Any], /) -> FitResult: ...


def gains_set(spec: ControllerSpec) -> AutoGainsSet:
    """The gains ``spec`` states (its fallback gains), as an event reports them."""
    return AutoGainsSet(gains="absolute" if spec.gains == "absolute" else "relative",
                        kp=float(spec.kp or 0.0), ki=spec.ki, kd=spec.kd, direction=spec.direction,
                        setpoint_weight=spec.setpoint_weight)


class Warmup:
    """The warm-up of one policy's gains-auto controller(s), for every run of an engine."""

    def __init__(self, policy: PolicyDocument, tuner: Tuner | None, forget: Callable[[], None]) -> None:
        self.policy = policy
        self.tuner = tuner
        self._forget = forget  # the engine drops its laws (keyed on spec identities) with our specs
        self._tuned: dict[tuple[Any, ...], ControllerSpec] = {}

    @staticmethod
    def fit(st: ControllerState) -> tuple[float, float, float] | None:
        """A tuned controller's integrating fit (rate, drift, u_ref): its horizon's projection."""
        auto = st.auto
        if isinstance(auto, AutoTuned) and auto.fit is not None:
            return auto.fit.rate, auto.fit.drift, auto.fit.u_ref
        return None

    @staticmethod
    def ended_at(st: ControllerState, step: int) -> bool:
        """Whether the test ended early at this step's reading (the law acts on this very reading)."""
        auto = st.auto
        early = None if auto is None or isinstance(auto, AutoPending) else auto.ended_early
        return early is not None and early.step == step

    def spec(self, ctx: RunContext, obs: ObservationCreate, spec: ControllerSpec, st: ControllerState, raw: float,
             events: list[Event]) -> ControllerSpec | None:
        """The spec a ``gains: auto`` controller's law runs with at this observation: the tuned
        one once its warm-up step test was fitted, the policy's (fallback gains) when the fit was
        refused or no test was declared, None while the test runs (this observation is recorded).
        At the first observation at or after the test's end the fit is made and its outcome
        recorded as an event in ``events``."""
        auto = st.auto
        if auto is None:
            st.auto = AutoFallback(problem="no_window")
            events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem="no_window", gains=gains_set(spec),
                reason=f"gains auto: no warm-up step test was declared for {spec.name!r} at registration (an agent "
                       "that predates gains auto, or a run registered without one): it runs on its fallback gains"))
            return spec
        if isinstance(auto, AutoTuned):
            return self._tuned_spec(spec, auto.gains)
        if isinstance(auto, AutoFallback):
            return spec
        if obs.step < auto.window.start:
            return None
        if isinstance(auto, AutoPending):
            st.auto = auto = AutoRecording(window=auto.window, initial=float(ctx.knobs[spec.knob].value), first=raw)
        samples = auto.samples
        samples.append([obs.seq, obs.step, raw, obs.knobs.get(spec.knob)])
        if len(samples) > AUTO_MAX_SAMPLES:
            del samples[1::2]
        if obs.step < auto.window.end:
            passed = self._passed(spec, st, auto, raw, obs.step)
            if passed is None:
                return None
            # The test holds the knob and the law waits; a probe past its setpoint (or budget) is
            # a run out of control for the rest of the window: the test ends here, and the law
            # acts from this observation on (the agent ends its test at this decision).
            auto.ended_early = EndedEarly(obs.step, raw, passed)
        return self._calibrate(ctx, obs, spec, st, auto, events)

    @staticmethod
    def _passed(spec: ControllerSpec, st: ControllerState, auto: AutoRecording, raw: float,
                step: int) -> float | None:
        """The setpoint (a constraint's budget) when ``raw`` is past it: across it from where the
        test's first reading stood (a setpoint), on the side the bound limits (a constraint);
        else None."""
        target = spec.setpoint if st.setpoint_override is None else st.setpoint_override
        if target is None:
            return None
        first = auto.first
        baseline = st.baseline if st.baseline is not None else first
        setpoint = setpoint_at(target, step, baseline)
        if not math.isfinite(setpoint):
            return None
        if spec.kind == "constraint":
            past = raw > setpoint if spec.bound == "upper" else raw < setpoint
        else:
            past = (first - setpoint) * (raw - setpoint) < 0
        return setpoint if past else None

    def _calibrate(self, ctx: RunContext, obs: ObservationCreate, spec: ControllerSpec, st: ControllerState,
                   auto: AutoRecording, events: list[Event]) -> ControllerSpec:
        knobs = {name: k.to_dict() for name, k in ctx.knobs.items()}
        knobs[spec.knob] = {**knobs[spec.knob], "value": auto.initial}
        in_metrics = spec.probe.startswith("train.")
        name = spec.probe.removeprefix("train.")
        observations = [ObservationCreate.model_construct(
            seq=seq, step=step, probes={} if in_metrics else {name: y}, metrics={name: y} if in_metrics else {},
            knobs={} if u is None else {spec.knob: u})
            for seq, step, y, u in auto.samples]
        early = auto.ended_early
        window = (auto.window.start, early.step if early else auto.window.end)
        ended = (f"the step test ended early at step {early.step}: {spec.probe} {early.value:.4g} passed "
                 f"{early.setpoint:.4g}; " if early else "")
        try:
            if self.tuner is None:
                raise _NoTuner("this engine was built without a tuner (the service's engines have one)")
            tuned = self.tuner(self.policy, knobs, spec.name, observations)
        except (ValueError, ArithmeticError) as exc:  # NotIdentifiable, ParameterError, a PolicyError
            problem = getattr(exc, "problem", None) or type(exc).__name__
            st.auto = auto.fell_back(problem)
            events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem=problem, gains=gains_set(spec),
                reason=f"gains auto: {ended}the warm-up step test on {spec.knob} (steps {window[0]}-{window[1]}) "
                       f"could not be fitted ({exc}); {spec.name!r} keeps its fallback gains"))
            return spec
        proposed, model = tuned.spec, tuned.model
        if spec.kind == "setpoint" and proposed.direction != spec.direction:
            # The policy states how the knob acts; a fit of the other sign is the probe's own motion
            # during the test (a drift that goes on while the knob steps away) taken for the knob's
            # effect, and gains of that sign would push the probe away from its setpoint.
            st.auto = auto.fell_back("wrong_direction")
            says = "raises" if proposed.direction == "direct" else "lowers"
            events.append(AutoGainsFallback(
                step=obs.step, controller=spec.name, knob=spec.knob, problem="wrong_direction", gains=gains_set(spec),
                reason=f"gains auto: {ended}the warm-up step test on {spec.knob} (steps {window[0]}-{window[1]}) "
                       f"fitted a {model.kind} model (gain {model.gain:+.4g}, R2 {model.r2:.2f}) by which raising "
                       f"{spec.knob} {says} {spec.probe}, against the controller's direction {spec.direction!r}: the "
                       "probe's own motion during the test was taken for the knob's effect; "
                       f"{spec.name!r} keeps its fallback gains"))
            return spec
        gains = AutoGainsSet(gains="absolute", kp=float(proposed.kp or 0.0), ki=proposed.ki, kd=proposed.kd,
                             direction=proposed.direction, setpoint_weight=proposed.setpoint_weight)
        fit = IntegratingFit(model.rate, model.drift, model.u_ref) if model.kind == "integrating" else None
        st.auto = auto.tuned(gains, fit)
        events.append(AutoGainsTuned(
            step=obs.step, controller=spec.name, knob=spec.knob, window=window,
            fit=AutoGainsFit(model=model.kind, gain=model.gain, tau=model.tau, theta=model.theta,
                             r2=model.r2, nrmse=model.nrmse, observations=model.observations),
            gains=gains, warnings=([ended.removesuffix("; ")] if early else []) + list(tuned.warnings),
            predicted=AutoGainsPrediction(settling_steps=tuned.proposed.settling_steps,
                                          overshoot_pct=tuned.proposed.overshoot_pct, horizon=tuned.horizon)))
        return self._tuned_spec(spec, gains)

    def _tuned_spec(self, spec: ControllerSpec, gains: AutoGainsSet) -> ControllerSpec:
        """``spec`` with a run's tuned gains (absolute), one object per distinct gains (the laws are
        cached on the spec's identity); floats told apart by their repr, exact to the bit."""
        update = gains.model_dump()
        key = (id(spec), *((k, repr(v)) for k, v in update.items()))
        tuned = self._tuned.get(key)
        if tuned is None:
            if len(self._tuned) >= _TUNED_CACHE_SIZE:
                self._tuned.clear()
                self._forget()  # the engine's laws are keyed on the specs' identities: none may outlive its spec
            tuned = self._tuned[key] = spec.model_copy(update={**update, "identify": None})
        return tuned


class _NoTuner(ActuatorError, ValueError):
    """The engine has no tuner: the warm-up falls back as on a refused fit."""

    problem = "no_tuner"


# -- the fit outside the run's lock -----------------------------------------------------------------

class FitNeeded(ActuatorError):  # noqa: N818 - a signal to the ingest, not an error
    """Raised through the engine by :class:`FitsOutsideLock` when a warm-up fit is due and not made
    yet: the ingest gives up its lock (nothing stored), calls :meth:`fit`, and runs again."""

    def __init__(self, tuner: FitsOutsideLock, key: str, args: tuple[Any, ...]) -> None:
        super().__init__("a gains-auto warm-up fit is due: made outside the run's lock, then the ingest runs again")
        self._tuner, self._key, self._args = tuner, key, args

    def fit(self) -> None:
        """Make the fit (in the calling thread, which holds no lock) and keep its outcome for the retry."""
        self._tuner.make(self._key, self._args)


class FitsOutsideLock:
    """A tuner for engines that run under a run's lock (the store's ingest): called with a fit it
    has not made, it raises :class:`FitNeeded` instead of fitting; once :meth:`FitNeeded.fit` made
    it, the same call answers it (or raises the fit's refusal). The same readings give the same
    fit, so the retried ingest takes the decisions it would have taken fitting in place. Within
    :func:`fits_in_place` (a last attempt) it fits at once, as a plain tuner would."""

    _KEEP = 32  # fits made and not taken yet (an ingest that failed after its fit leaves one)

    def __init__(self, tuner: Tuner) -> None:
        self.tuner = tuner
        self._made: dict[str, tuple[bool, Any]] = {}
        self._guard = threading.Lock()

    @staticmethod
    def _key(knobs: dict[str, dict[str, Any]], controller: str, observations: Sequence[Any]) -> str:
        return repr((controller, sorted((k, sorted(v.items())) for k, v in knobs.items()),
                     [(o.seq, o.step, o.probes, o.metrics, o.knobs) for o in observations]))

    def __call__(self, policy: PolicyDocument, knobs: dict[str, dict[str, Any]], controller: str,
                 observations: Sequence[Any], /) -> FitResult:
        args = (policy, knobs, controller, observations)
        if getattr(_IN_PLACE, "on", False):
            return self.tuner(*args)
        key = self._key(knobs, controller, observations)
        with self._guard:
            made = self._made.pop(key, None)
        if made is None:
            raise FitNeeded(self, key, args)
        ok, outcome = made
        if not ok:
            raise outcome
        return outcome

    def make(self, key: str, args: tuple[Any, ...]) -> None:
        try:
            outcome: tuple[bool, Any] = (True, self.tuner(*args))
        except (ValueError, ArithmeticError) as exc:  # the refusal is the fit's outcome too
            outcome = (False, exc)
        with self._guard:
            while len(self._made) >= self._KEEP:
                del self._made[next(iter(self._made))]
            self._made[key] = outcome


_IN_PLACE = threading.local()


@contextmanager
def fits_in_place() -> Iterator[None]:
    """In this thread, :class:`FitsOutsideLock` tuners fit at once instead of asking for it."""
    _IN_PLACE.on = True
    try:
        yield
    finally:
        _IN_PLACE.on = False
