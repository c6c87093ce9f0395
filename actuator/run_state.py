"""A run's control state, typed: its knobs, each controller's memory, each guardrail's.

The store keeps them as three JSON columns of the run (``knobs``, ``controllers``,
``guardrails``); :class:`RunContext` is what the engine and the operator actions work on, decoded
from those columns by :meth:`RunContext.from_json` and encoded back by :meth:`RunContext.to_json`.
The encoding keeps the stored shape (the API's run state shows it as is): a field that was never
set is left out rather than written as ``null``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .controllers import PIDState
from .schemas import AutoGainsSet, RunStateName

__all__ = ["KnobState", "ControllerState", "GuardrailState", "RunContext", "PROBE_REPORT", "STARVED_PREFIX",
           "starved_probes", "knobs_in_effect", "StepWindow", "EndedEarly", "IntegratingFit", "AutoPending",
           "AutoRecording", "AutoTuned", "AutoFallback", "AutoState", "auto_state"]

# Every probe report of the agent's ProbeSuite carries ``probe_share`` among its metrics, and
# ``probe_starved.<name>`` (consecutive skips) for each probe the probe-time budget starves.
PROBE_REPORT = "probe_share"
STARVED_PREFIX = "probe_starved."

Json = dict[str, Any]


def _set(d: Json, **optional: Any) -> Json:
    """``d`` with the optional fields that are set."""
    d.update((k, v) for k, v in optional.items() if v is not None)
    return d


@dataclass
class KnobState:
    """A knob of the run: ``value`` is the controller's target; ``override`` an operator's pinned
    value (controllers track it while it is set). Numbers are kept as stored (an int bound stays
    an int), so a law is rebuilt from exactly what was stored."""

    name: str
    value: float
    min: float
    max: float
    scale: str = "linear"
    max_step: float | None = None
    override: float | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], name: str | None = None) -> KnobState:
        return cls(name=d.get("name", name or ""), value=d["value"], min=d["min"], max=d["max"],
                   scale=d.get("scale", "linear"), max_step=d.get("max_step"), override=d.get("override"))

    def to_dict(self) -> Json:
        return _set({"name": self.name, "value": self.value, "min": self.min, "max": self.max, "scale": self.scale,
                     "max_step": self.max_step}, override=self.override)


# -- gains auto: the warm-up step test's state, one type per stage --------------------------------
# pending (registered, no reading yet) -> recording (readings of the test) -> tuned | fallback.
# Stored as the JSON the code before these types wrote (``status`` and the fields below at the top
# level), and rows it wrote load unchanged; the one difference: it stored a recording test as
# ``pending`` with ``samples``, which loads as recording and is written back as ``recording``.

@dataclass(frozen=True)
class StepWindow:
    """The warm-up step test the agent declared at registration: steps ``start`` to ``end``, the
    knob moved by ``size`` (its scale units)."""

    start: int
    end: int
    size: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepWindow | None:
        return cls(int(d["start"]), int(d["end"]), d["size"]) if "start" in d else None

    def to_dict(self) -> Json:
        return {"start": self.start, "end": self.end, "size": self.size}


@dataclass(frozen=True)
class EndedEarly:
    """The reading that ended the test before its end: the probe ran past its setpoint (budget)."""

    step: int
    value: float
    setpoint: float

    def to_dict(self) -> Json:
        return {"step": self.step, "value": self.value, "setpoint": self.setpoint}


@dataclass(frozen=True)
class IntegratingFit:
    """An integrating plant fitted from the test (rate and drift per step, the knob's reference in
    its scale): the projection of a controller with a horizon."""

    rate: float
    drift: float
    u_ref: float

    def to_dict(self) -> Json:
        return {"rate": self.rate, "drift": self.drift, "u_ref": self.u_ref}


def _ended(d: Mapping[str, Any]) -> EndedEarly | None:
    e = d.get("ended_early")
    return None if not e else EndedEarly(int(e["step"]), e["value"], e["setpoint"])


@dataclass(kw_only=True)
class _Recorded:
    """What a test that ran recorded besides its readings (None where it never started)."""

    window: StepWindow | None = None
    initial: float | None = None  # the knob's value at the test's first reading
    first: float | None = None  # the test's first reading
    ended_early: EndedEarly | None = None

    def _encode(self, status: str, **rest: Any) -> Json:
        out = {} if self.window is None else self.window.to_dict()
        out["status"] = status
        _set(out, initial=self.initial, first=self.first,
             ended_early=None if self.ended_early is None else self.ended_early.to_dict())
        return _set(out, **rest)


@dataclass(kw_only=True)
class AutoPending:
    """Registered with a step test; no reading of it yet."""

    status: ClassVar[Literal["pending"]] = "pending"
    window: StepWindow

    def to_dict(self) -> Json:
        return {**self.window.to_dict(), "status": self.status}


@dataclass(kw_only=True)
class AutoRecording(_Recorded):
    """The test runs: ``samples`` are its readings, ``[seq, step, probe, knob reported]`` each."""

    status: ClassVar[Literal["recording"]] = "recording"
    window: StepWindow
    initial: float
    first: float
    samples: list[list[Any]] = field(default_factory=list)

    def to_dict(self) -> Json:
        return {**self._encode(self.status), "samples": self.samples}

    def tuned(self, gains: AutoGainsSet, fit: IntegratingFit | None) -> AutoTuned:
        """The test's end: fitted (its readings are done with)."""
        return AutoTuned(window=self.window, initial=self.initial, first=self.first, ended_early=self.ended_early,
                         gains=gains, fit=fit)

    def fell_back(self, problem: str) -> AutoFallback:
        """The test's end: not fitted (its readings are done with)."""
        return AutoFallback(window=self.window, initial=self.initial, first=self.first,
                            ended_early=self.ended_early, problem=problem)


@dataclass(kw_only=True)
class AutoTuned(_Recorded):
    """The test was fitted: the controller runs with ``gains`` (and, with a horizon, ``fit``)."""

    status: ClassVar[Literal["tuned"]] = "tuned"
    gains: AutoGainsSet
    fit: IntegratingFit | None = None

    def to_dict(self) -> Json:
        return self._encode(self.status, gains=self.gains.model_dump(),
                            model=None if self.fit is None else self.fit.to_dict())


@dataclass(kw_only=True)
class AutoFallback(_Recorded):
    """The controller keeps its fallback gains: ``problem`` says why (no test declared, the fit
    refused, a fit against the controller's direction, no tuner)."""

    status: ClassVar[Literal["fallback"]] = "fallback"
    problem: str

    def to_dict(self) -> Json:
        return self._encode(self.status, problem=self.problem)


AutoState = AutoPending | AutoRecording | AutoTuned | AutoFallback


def auto_state(d: Mapping[str, Any] | None) -> AutoState | None:
    """The typed state of a stored ``auto`` field, in the form this module writes or the one
    written before the types (a recording test was ``pending`` with ``samples``)."""
    if not d:
        return None
    status = d.get("status")
    window, initial, first, early = StepWindow.from_dict(d), d.get("initial"), d.get("first"), _ended(d)
    if status == "tuned":
        fit = d.get("model")
        return AutoTuned(window=window, initial=initial, first=first, ended_early=early,
                         gains=AutoGainsSet.model_validate(d["gains"]),
                         fit=None if not fit else IntegratingFit(fit["rate"], fit["drift"], fit["u_ref"]))
    if status == "fallback":
        return AutoFallback(window=window, initial=initial, first=first, ended_early=early,
                            problem=str(d.get("problem", "unknown")))
    if window is None:
        raise ValueError(f"a gains-auto state without its step test's window: {dict(d)}")
    if status == "recording" or d.get("samples"):
        return AutoRecording(window=window, initial=float(d["initial"]), first=float(d["first"]), ended_early=early,
                             samples=d.get("samples") or [])  # as decoded: no copy per ingest
    return AutoPending(window=window)


@dataclass
class ControllerState:
    """What a controller remembers between observations for one run.

    ``baseline`` is the first filtered value (the reference of a relative setpoint such as
    '+10%'); ``setpoint_override`` an operator's setpoint for this run; ``reset`` asks the next
    update to restart bumplessly from the value in effect (control handed back); ``error`` says
    why the controller cannot run on this run's knobs (it is skipped until that changes)."""

    pid: PIDState | None = None
    filter: Json | None = None  # the filter's own state (its kind decodes it)
    last_step: int | None = None
    probe: str | None = None
    knob: str | None = None
    raw: float | None = None
    filtered: float | None = None
    baseline: float | None = None
    setpoint: float | None = None
    components: dict[str, float] | None = None
    setpoint_override: Any = None  # a number or a schedule [[step, value], ...]
    reset: bool = False
    error: str | None = None
    law: Json | None = None  # a non-PID law's own state (kind maximize: ExtremumState.to_dict())
    # gains auto: the warm-up step test's stage (pending, recording, tuned, fallback)
    auto: AutoState | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ControllerState:
        pid = d.get("pid")
        return cls(pid=PIDState.from_dict(pid) if pid else None, filter=d.get("filter") or None,
                   last_step=d.get("last_step"), probe=d.get("probe"), knob=d.get("knob"), raw=d.get("raw"),
                   filtered=d.get("filtered"), baseline=d.get("baseline"), setpoint=d.get("setpoint"),
                   components=d.get("components"), setpoint_override=d.get("setpoint_override"),
                   reset=bool(d.get("reset", False)), error=d.get("error"), law=d.get("law") or None,
                   auto=auto_state(d.get("auto")))

    def to_dict(self) -> Json:
        return _set({"pid": None if self.pid is None else self.pid.to_dict(), "filter": self.filter,
                     "last_step": self.last_step},
                    probe=self.probe, knob=self.knob, raw=self.raw, filtered=self.filtered, baseline=self.baseline,
                    setpoint=self.setpoint, components=self.components, setpoint_override=self.setpoint_override,
                    reset=self.reset or None, error=self.error, law=self.law,
                    auto=None if self.auto is None else self.auto.to_dict())


@dataclass
class GuardrailState:
    """A guardrail's memory for one run: ``baseline`` is the probe's first value (the reference
    of a relative threshold), its best so far under ``reference: best``; ``breaches`` the consecutive breaches, ``active`` whether it has
    fired and not cleared; ``probe``, ``threshold`` and ``value`` what it last compared."""

    baseline: float | None = None
    breaches: int = 0
    active: bool = False
    probe: str | None = None
    threshold: float | None = None
    value: float | None = None
    # The policy's rewind ladder: the steps this guardrail fired at (within the ladder's window),
    # and the last step at which every guardrail held (what a rewind goes back to, at the latest).
    rewinds: list[int] = field(default_factory=list)
    held_at: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GuardrailState:
        return cls(baseline=d.get("baseline"), breaches=int(d.get("breaches", 0)), active=bool(d.get("active", False)),
                   probe=d.get("probe"), threshold=d.get("threshold"), value=d.get("value"),
                   rewinds=[int(s) for s in d.get("rewinds", [])], held_at=d.get("held_at"))

    def to_dict(self) -> Json:
        return _set({"baseline": self.baseline, "breaches": self.breaches, "active": self.active},
                    probe=self.probe, threshold=self.threshold, value=self.value,
                    rewinds=list(self.rewinds) or None, held_at=self.held_at)


@dataclass
class RunContext:
    """The mutable part of a run the engine and the operator actions read and write."""

    knobs: dict[str, KnobState]
    controllers: dict[str, ControllerState] = field(default_factory=dict)
    guardrails: dict[str, GuardrailState] = field(default_factory=dict)
    state: RunStateName = "running"
    decision_count: int = 0

    @classmethod
    def from_json(cls, knobs: Mapping[str, Mapping[str, Any]], controllers: Mapping[str, Mapping[str, Any]] | None = None,
                  guardrails: Mapping[str, Mapping[str, Any]] | None = None, state: RunStateName = "running",
                  decision_count: int = 0) -> RunContext:
        """From the run's stored JSON columns (nothing of them is shared: they may be reused)."""
        return cls(knobs={k: KnobState.from_dict(v, k) for k, v in knobs.items()},
                   controllers={k: ControllerState.from_dict(v) for k, v in (controllers or {}).items()},
                   guardrails={k: GuardrailState.from_dict(v) for k, v in (guardrails or {}).items()},
                   state=state, decision_count=decision_count)

    def to_json(self) -> dict[str, Json]:
        """The run's ``knobs``, ``controllers`` and ``guardrails`` columns."""
        return {"knobs": {k: v.to_dict() for k, v in self.knobs.items()},
                "controllers": {k: v.to_dict() for k, v in self.controllers.items()},
                "guardrails": {k: v.to_dict() for k, v in self.guardrails.items()}}


def starved_probes(report: Mapping[str, Any]) -> list[str]:
    """The probes a probe report's metrics say the budget starves, by name."""
    return sorted(k.removeprefix(STARVED_PREFIX) for k in report if k.startswith(STARVED_PREFIX))


def knobs_in_effect(observed: Mapping[str, float], last_step: int | None,
                    acknowledged: Iterable[tuple[str, int, float]]) -> dict[str, float]:
    """The knob values in effect: the latest observation's (``observed``, taken at ``last_step``),
    then each value the agent says it applied (``(knob, step, value)`` in decision order) at or
    after that step. The agent acknowledges a decision with its next request, which may carry no
    newer observation (a repeat of the last one, as at the end of a run): the observation alone
    would show the value the decision replaced."""
    out = dict(observed)
    for knob, step, value in acknowledged:
        if last_step is None or step >= last_step:
            out[knob] = value
    return out
