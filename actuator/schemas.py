"""Wire models (pydantic v2) shared by the service, the client and the agent.

Naming follows ``XCreate`` (what a client sends) / ``XPublic`` (what the service returns).
Every number that reaches the engine is finite: NaN and infinities are refused at the edge.
The service refuses fields a model does not declare; the client (actuator.client) reads the
service's answers ignoring them, so an agent keeps working with a newer service.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import catalogue

__all__ = [
    "DecisionAck",
    "KeptCheckpoint",
    "MAX_INT",
    "MAX_SEQ",
    "MAX_SEQ_GAP",
    "MAX_SETPOINT_POINTS",
    "Name",
    "FiniteFloat",
    "PositiveFinite",
    "WireInt",
    "PositiveWireInt",
    "Scale",
    "RunStateName",
    "KnobSpec",
    "IdentificationWindow",
    "RelBound",
    "CatalogueKnob",
    "CatalogueProbe",
    "CatalogueSpec",
    "RunCreate",
    "RunCreated",
    "RunPublic",
    "RunState",
    "ObservationCreate",
    "ObservationBatch",
    "Action",
    "DecisionChange",
    "Decision",
    "DecisionListed",
    "DecisionPublic",
    "DecisionPage",
    "IngestResult",
    "Notice",
    "AutoGainsTuned",
    "AutoGainsFallback",
    "ErrorItem",
    "ErrorDetail",
    "ErrorPublic",
    "HealthPublic",
    "PolicyPublic",
    "PolicyArchived",
    "PolicyValidation",
    "SimulationPublic",
    "TuneCreate",
    "FittedModelPublic",
    "TuningPublic",
    "PredictedResponse",
    "TunePrediction",
    "TunePublic",
    "EventPublic",
    "EventRecord",
    "Event",
    "EventKind",
    "EVENT",
    "GuardrailBreach",
    "GuardrailCleared",
    "ControllerUnusable",
    "KnobOverridden",
    "OverrideReleased",
    "SetpointChanged",
    "ControlPaused",
    "ControlResumed",
    "ObservationEvent",
    "DecisionEvent",
    "Acknowledged",
    "StateChanged",
    "PolicyMoved",
    "RunRegistered",
    "HistoryChanged",
    "Gap",
    "RUN_STATES",
    "FINAL_STATES",
    "SimulatedAction",
    "ControlResult",
    "ReportSampling",
    "ReportPublic",
]

# Probe, knob, metric and run names: short identifiers, dots allowed for namespacing
# ("hotpotqa.gold_logprob"). Bounded so they are safe as Prometheus label values.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")]


def _not_a_bool(value: Any) -> Any:
    """JSON true is not a number, though pydantic's lax mode takes it as 1. (Numeric strings stay
    accepted: YAML reads ``1e-6`` as a string.)"""
    if isinstance(value, bool):
        raise PydanticCustomError("number_type", "Input should be a number, not a boolean")
    return value


FiniteFloat = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(_not_a_bool)]
# A bound on FiniteFloat | None outside the annotation would not reach the JSON Schema (the
# validator hides the number type): such bounds go inside, as here.
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False), BeforeValidator(_not_a_bool)]
WireInt = Annotated[int, BeforeValidator(_not_a_bool)]
Scale = Literal["log", "linear", "integer"]
# A run's state: the one list of them (metrics, the routers' filters and the store read it from here).
RunStateName = Literal["running", "paused", "halted", "finished"]
RUN_STATES: tuple[RunStateName, ...] = get_args(RunStateName)
FINAL_STATES: tuple[RunStateName, ...] = ("halted", "finished")  # no way back to running

_MAX_VALUES = 256  # probes / metrics / knobs per observation

# The store's INTEGER columns (seq, step, versions, decision numbers) are 32-bit on Postgres and
# SQLite refuses ints past 64 bits: a larger number is refused here (a 422 at the service, a
# ValidationError in the client), never a database error.
MAX_INT = 2**31 - 1
# Sequence numbers live in 64-bit columns: an agent counting from 0 never runs out. A seq may
# run at most MAX_SEQ_GAP ahead of the run's last one (the store refuses a larger leap, 422), so
# no single observation can leave a run without room to append.
MAX_SEQ = 2**63 - 1
MAX_SEQ_GAP = 2**32
# Points of a setpoint schedule: the engine reads the schedule on every observation.
MAX_SETPOINT_POINTS = 1000
# A count in a request body (1 .. MAX_INT; the bounds inside the type, as for PositiveFinite).
PositiveWireInt = Annotated[int, Field(ge=1, le=MAX_INT), BeforeValidator(_not_a_bool)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KnobSpec(_Model):
    """A knob under control: current value, bounds, scale and the largest change per decision."""

    name: Name
    value: FiniteFloat
    min: FiniteFloat
    max: FiniteFloat
    scale: Scale = "linear"
    max_step: PositiveFinite | None = Field(
        None,
        description="Largest change per decision in the knob's scale (log units for 'log': "
        "0.5 allows at most x1.65 per decision). None = unlimited.",
    )

    @model_validator(mode="after")
    def _check(self) -> KnobSpec:
        if self.min > self.max:
            raise ValueError(f"knob {self.name!r}: min ({self.min}) is greater than max ({self.max})")
        if self.scale == "log" and self.min <= 0:
            raise ValueError(f"knob {self.name!r}: a log-scale knob needs min > 0, got {self.min}")
        if not self.min <= self.value <= self.max:
            raise ValueError(
                f"knob {self.name!r}: value {self.value} is outside its bounds [{self.min}, {self.max}]"
            )
        if self.scale == "integer" and self.value != int(self.value):
            raise ValueError(f"knob {self.name!r}: an integer knob needs an integer value")
        return self


class IdentificationWindow(_Model):
    """The warm-up step test the agent runs for a ``gains: auto`` controller: steps ``start`` (the
    first) to ``end`` (the first after it, where the knob is back at its nominal value); decisions
    on ``knob`` are set aside meanwhile. The service tunes the controller's gains at its first
    observation at or after ``end``."""

    controller: Name
    knob: Name
    start: WireInt = Field(ge=0, le=MAX_INT)
    end: WireInt = Field(ge=1, le=MAX_INT)
    size: FiniteFloat = Field(description="The move, in the knob's scale units.")

    @model_validator(mode="after")
    def _ordered(self) -> IdentificationWindow:
        if self.end <= self.start:
            raise ValueError(f"end ({self.end}) must come after start ({self.start})")
        return self


class RelBound(_Model):
    """A bound relative to the knob's starting value: ``value * rel``."""

    rel: PositiveFinite


_What = Annotated[str, StringConstraints(max_length=500)]


class CatalogueKnob(_Model):
    """A knob's catalogue entry (``actuator.catalogue.Knob``): its default bounds around the value a
    run starts with (absolute, or ``{"rel": f}``: the starting value times f), scale and largest
    change per decision."""

    name: Name
    scale: Scale
    min: FiniteFloat | RelBound
    max: FiniteFloat | RelBound
    max_step: PositiveFinite | None = None
    what: _What = ""

    @field_validator("min")
    @classmethod
    def _log_above_zero(cls, v: float | RelBound, info: ValidationInfo) -> float | RelBound:
        if info.data.get("scale") == "log" and isinstance(v, float) and v <= 0:
            raise ValueError(f"a log-scale knob needs min > 0 (or relative), got {v}")
        return v

    @field_validator("max")
    @classmethod
    def _above_min(cls, v: float | RelBound, info: ValidationInfo) -> float | RelBound:
        lo = info.data.get("min")
        if isinstance(v, float) and isinstance(lo, float) and lo > v:
            raise ValueError(f"max ({v}) is below min ({lo})")
        return v

    @classmethod
    def of(cls, knob: catalogue.Knob) -> CatalogueKnob:
        def bound(b: float | catalogue.Rel) -> float | RelBound:
            return RelBound(rel=b.factor) if isinstance(b, catalogue.Rel) else float(b)
        return cls(name=knob.name, scale=knob.scale, min=bound(knob.min), max=bound(knob.max),
                   max_step=knob.max_step, what=knob.what)

    def entry(self) -> catalogue.Knob:
        def bound(b: float | RelBound) -> float | catalogue.Rel:
            return catalogue.Rel(b.rel) if isinstance(b, RelBound) else b
        return catalogue.Knob(self.name, bound(self.min), bound(self.max), self.scale, self.max_step, self.what)


class CatalogueProbe(_Model):
    """An observation key's catalogue entry (``actuator.catalogue.Probe``): the values it can take
    (``null``: unbounded on that side), whether higher is better, whether it measures drift, and the
    probe (``probes[].name``) that produces it."""

    name: Name
    range: tuple[FiniteFloat | None, FiniteFloat | None] = (None, None)
    higher_is_better: bool
    drift: bool = False
    source: Name | None = None
    what: _What = ""

    @field_validator("range")
    @classmethod
    def _ordered(cls, v: tuple[float | None, float | None]) -> tuple[float | None, float | None]:
        if v[0] is not None and v[1] is not None and v[0] > v[1]:
            raise ValueError(f"range [{v[0]}, {v[1]}] is empty: its low end is above its high end")
        return v

    @classmethod
    def of(cls, probe: catalogue.Probe) -> CatalogueProbe:
        lo, hi = probe.range
        return cls(name=probe.name, range=(lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None),
                   higher_is_better=probe.higher_is_better, drift=probe.drift, source=probe.source, what=probe.what)

    def entry(self) -> catalogue.Probe:
        lo, hi = self.range
        return catalogue.Probe(self.name, (-math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)),
                               self.higher_is_better, self.drift, self.source, self.what)


class CatalogueSpec(_Model):
    """Knobs and probe keys a run's agent registered beyond what the service may ship (its own
    ``@knob_setter(Knob(...))``, a probe of its own): the service validates the run's policy with
    them beside its catalogue. A name the service ships must be declared as the service has it."""

    knobs: list[CatalogueKnob] = Field(default_factory=list, max_length=32)
    probes: list[CatalogueProbe] = Field(default_factory=list, max_length=64)

    @classmethod
    def travelling(cls) -> CatalogueSpec | None:
        """What this process registered beyond the shipped catalogue; None when nothing."""
        knobs, probes = catalogue.travelling()
        if not knobs and not probes:
            return None
        return cls(knobs=[CatalogueKnob.of(k) for k in knobs], probes=[CatalogueProbe.of(p) for p in probes])

    @field_validator("knobs", "probes")
    @classmethod
    def _unique(cls, entries: list[Any]) -> list[Any]:
        names = [e.name for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"names must be unique, repeated: {dup}")
        return entries

    def conflicts(self) -> list[dict[str, str]]:
        """Entries this process's catalogue has under another definition, as errors at
        ``catalogue.<knobs|probes>.<i>``."""
        ours: list[tuple[str, int, str, object, object]] = [
            *(("knobs", i, k.name, catalogue.KNOBS.own().get(k.name), k.entry()) for i, k in enumerate(self.knobs)),
            *(("probes", i, p.name, catalogue.PROBES.own().get(p.name), p.entry()) for i, p in enumerate(self.probes))]
        return [{"loc": f"catalogue.{field}.{i}",
                 "msg": f"{name!r} is in this service's catalogue as {known}; the run declares {entry}"}
                for field, i, name, known, entry in ours if known is not None and known != entry]

    def declared(self) -> Any:
        """:func:`actuator.catalogue.declared` with these entries (a context manager)."""
        return catalogue.declared([k.entry() for k in self.knobs], [p.entry() for p in self.probes])

    def merged(self, other: CatalogueSpec | None) -> CatalogueSpec:
        """These entries and ``other``'s not named here."""
        if other is None:
            return self
        knobs = {k.name for k in self.knobs}
        probes = {p.name for p in self.probes}
        return CatalogueSpec(knobs=[*self.knobs, *(k for k in other.knobs if k.name not in knobs)],
                             probes=[*self.probes, *(p for p in other.probes if p.name not in probes)])


def declared_catalogue(stored: dict[str, Any] | None) -> Any:
    """A stored :class:`CatalogueSpec` (a policy version's, as JSON) declared for the ``with`` block
    (:func:`actuator.catalogue.declared`); nothing declared for an empty one."""
    if not stored:
        return catalogue.declared()
    return CatalogueSpec.model_validate(stored).declared()


class RunCreate(_Model):
    """Register a run. ``policy`` is a stored policy's name (latest version, or ``name@version``),
    or an inline policy document that is stored as a new policy version."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "run"
    policy: str | dict[str, Any]
    knobs: list[KnobSpec] = Field(default_factory=list, max_length=32)
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    identification: list[IdentificationWindow] = Field(
        default_factory=list, max_length=1, description="The warm-up step test of the policy's gains-auto "
        "controller, as the agent runs it (left out of the request when there is none).")
    catalogue: CatalogueSpec | None = Field(
        None, description="Knobs and probe keys the agent registered beyond its shipped catalogue: the policy "
        "is validated with them (left out of the request when there are none).")

    @model_serializer(mode="wrap")
    def _without_empty(self, handler: SerializerFunctionWrapHandler):  # no return type: the schema stays the model's
        data = handler(self)
        if isinstance(data, dict):
            for field in ("identification", "catalogue"):
                if not data.get(field):
                    data.pop(field, None)  # a service that predates the field would refuse it
        return data

    @field_validator("knobs")
    @classmethod
    def _unique(cls, knobs: list[KnobSpec]) -> list[KnobSpec]:
        names = [k.name for k in knobs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"knob names must be unique, repeated: {sorted(dup)}")
        return knobs


class KeptCheckpoint(_Model):
    """The checkpoint a run keeps by its policy's ``rewind.keep_best`` probe, as the agent reported it."""

    step: int = Field(description="The step of the best reading (its checkpoint is the one kept).")
    value: float | None = Field(None, description="The keep-best probe's reading there: the best of the run.")
    loaded: bool = Field(False, description="True: loaded into the model at the end of training (at_end: load); "
                         "false: the last step's model stayed, or training has not ended.")
    saves: int | None = Field(None, description="Checkpoints the agent saved for rewinds and keep-best.")
    save_seconds: float | None = Field(None, description="What those saves cost, in seconds, in all.")
    probe: str | None = Field(None, description="The keep-best probe (the run's policy's rewind.keep_best.probe).")
    mode: Literal["max", "min"] | None = Field(None, description="max: the highest reading is the best; min: the "
                                               "lowest.")

    def why(self) -> str:
        """Which step is kept and why, in one line (``actuator runs``)."""
        probe = self.probe or "the keep-best probe"
        best = {"max": "highest", "min": "lowest"}.get(self.mode or "", "best")
        value = "" if self.value is None else f" {self.value:.6g}"
        where = ("loaded into the model at the end of training" if self.loaded else
                 "kept on disk (the model is the last step's, or training goes on)")
        cost = "" if self.saves is None else f"; {self.saves} rewind/keep-best saves" + (
            "" if self.save_seconds is None else f", {self.save_seconds:.3g} s in all")
        return f"keep-best: step {self.step} kept: {probe}{value} there is the {best} reading; {where}{cost}"

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any], keep_best: Any = None) -> KeptCheckpoint | None:
        """From a run's latest metrics (``keep_best.*``, ``checkpoint.*``) and its policy's
        ``rewind.keep_best`` (probe and mode, when given); None without a best."""
        step = metrics.get("keep_best.step")
        if step is None:
            return None
        saves = metrics.get("checkpoint.saves")
        return cls(step=int(step), value=metrics.get("keep_best.value"),
                   loaded=bool(metrics.get("keep_best.loaded", 0.0)), saves=None if saves is None else int(saves),
                   save_seconds=metrics.get("checkpoint.save_seconds_total"),
                   probe=getattr(keep_best, "probe", None), mode=getattr(keep_best, "mode", None))


class RunPublic(_Model):
    id: str
    name: str
    state: RunStateName
    policy_name: str
    policy_version: int
    knobs: dict[str, KnobSpec]
    last_step: int | None
    last_seq: int | None
    created_at: datetime
    updated_at: datetime
    starved: list[str] = Field(
        default_factory=list,
        description="Probes the agent's probe-time budget skipped, as its latest probe report says (a "
        "controller fed by one gets fewer readings: the run's state counts them in starved_readings). Empty: "
        "none starved, or no report yet.")
    knobs_in_effect: dict[str, float] = Field(
        default_factory=dict,
        description="Knob values in effect: the latest observation's, or a value the agent acknowledged "
        "applying at or after that observation's step (a decision never applied is not in effect: "
        "``knobs[].value`` is the value last ordered).")
    kept: KeptCheckpoint | None = Field(
        None, description="The policy's rewind.keep_best: the step whose checkpoint is kept (the best reading) and "
        "whether it was loaded at the end; null without keep-best or before a reading.")


class RunCreated(RunPublic):
    token: str = Field(description="Run-scoped agent token. Shown once; stored hashed.")
    policy: dict[str, Any] = Field(description="The policy document the run runs under.")
    identification: list[IdentificationWindow] = Field(
        default_factory=list, description="The warm-up step tests the service will tune gains from (the "
        "request's, accepted); empty: none (an agent that asked for one and finds it missing runs on the "
        "fallback gains).")


class RunState(RunPublic):
    """A run with its live picture: latest probes, controller states, decision count."""

    latest_probes: dict[str, float]
    latest_metrics: dict[str, float]
    controllers: dict[str, dict[str, Any]]
    guardrails: dict[str, dict[str, Any]] = Field(
        description="Per guardrail: baseline, threshold, the value it last compared, ``breaches`` (readings "
        "past the threshold in a row, reset by a reading back inside), ``active``, and ``fired`` (how many "
        "times it fired: its stored guardrail_breach events); under a policy with a rollback guardrail also "
        "``held_at`` (the last step at which every guardrail held) and, with a rewind ladder, ``rewinds`` (the "
        "steps it fired at within the ladder's window).")
    decisions: int
    starved_readings: dict[str, int] = Field(
        default_factory=dict, description="Per starved probe, the readings of it the service received "
        "(a starved probe is skipped when the budget is short, not necessarily every time).")


class ObservationCreate(_Model):
    """What the agent sends: probe values, training metrics and the knob values in effect."""

    seq: WireInt = Field(ge=0, le=MAX_SEQ, description="Per-run sequence number; (run, seq) is idempotent. At most "
                         f"{MAX_SEQ_GAP} past the run's last seq.")
    step: WireInt = Field(ge=0, le=MAX_INT, description="Optimizer step the values were taken at.")
    probes: dict[Name, FiniteFloat] = Field(default_factory=dict, max_length=_MAX_VALUES)
    metrics: dict[Name, FiniteFloat] = Field(default_factory=dict, max_length=_MAX_VALUES)
    knobs: dict[Name, FiniteFloat] = Field(default_factory=dict, max_length=_MAX_VALUES)
    time: FiniteFloat | None = Field(None, description="Agent wall clock (unix seconds).")


class DecisionAck(_Model):
    """The agent's word on one decision it received: applied at a step boundary (with the value
    it really set, after its own bounds and rate limit) or set aside, and why. The store records
    it on the decision, so the audit trail tells an applied decision from one that never was
    (e.g. ordered after the run's last step)."""

    number: PositiveWireInt = Field(description="The decision's number.")
    status: Literal["applied", "skipped"]
    step: WireInt = Field(ge=0, le=MAX_INT, description="The step from which the value was in effect "
                          "(applied), or at which the agent set the decision aside (skipped).")
    value: FiniteFloat | None = Field(None, description="The value the agent set (applied only).")
    reason: str | None = Field(None, max_length=500, description="Why it was set aside (skipped only).")

    @model_validator(mode="after")
    def _consistent(self) -> DecisionAck:
        if self.status == "applied" and self.value is None:
            raise ValueError("value: an applied decision says the value the agent set")
        if self.status == "skipped" and self.value is not None:
            raise ValueError("value: a skipped decision set no value")
        return self


# A decision numbering's identity (runs.decision_epoch: 16 random hex digits; "0" for runs from before epochs).
EPOCH_PATTERN = r"^[0-9a-f]{1,32}$"


class ObservationBatch(_Model):
    observations: list[ObservationCreate] = Field(min_length=1, max_length=1000)
    last_decision: WireInt = Field(
        0, ge=0, le=MAX_INT,
        description="Highest decision number the agent has applied; decisions after it are returned.",
    )
    epoch: str | None = Field(
        None, pattern=EPOCH_PATTERN,
        description="The decision numbering (IngestResult.epoch) last_decision and applied belong to; absent: "
                    "the agent has not heard one yet. Another epoch than the run's, or a last_decision past the "
                    "run's decisions (a restored store), resynchronises the agent: see IngestResult.resumed_after.")
    applied: list[DecisionAck] = Field(
        default_factory=list, max_length=1000,
        description="Decisions the agent applied or set aside since its last request (each at most once "
                    "recorded; a repeat is ignored). Every number must be a decision of this run that "
                    "existed before this request.")

    @model_validator(mode="after")
    def _ordered(self) -> ObservationBatch:
        seqs = [o.seq for o in self.observations]
        if len(set(seqs)) != len(seqs):
            raise ValueError("observations: sequence numbers repeat within the batch")
        return self


class Action(_Model):
    """A run-level order beside knob decisions: halt or roll back."""

    type: Literal["halt", "rollback", "alert"]
    reason: str
    decision: int | None = None


def _all_finite(value: Any) -> bool:
    """Whether every float in ``value`` (through dicts and lists) is finite."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is float:
            if v - v != 0.0:  # NaN for NaN and infinities
                return False
        elif t is dict:
            stack.extend(v.values())
        elif t is list or t is tuple:
            stack.extend(v)
    return True


class DecisionChange(_Model):
    """The change a decision orders, the part of :class:`Decision` every view of it shows (the
    live ``decision`` event, a report's list)."""

    number: int = Field(description="Per-run decision number, 1, 2, ...")
    step: int = Field(description="The step from which the new value applies.")
    knob: str
    old_value: FiniteFloat
    new_value: FiniteFloat
    reason: str


class Decision(DecisionChange):
    """A knob change the controller, a guardrail or an operator orders: the one decision record
    the engine makes, the store keeps (as :class:`DecisionPublic`), the API returns, simulate
    replays and the report lists (in part: :class:`DecisionListed`). Every number in it is
    finite: JSON and Postgres hold no others."""

    controller: str | None = Field(description="The controller that decided (None: a guardrail or an operator).")
    components: dict[str, FiniteFloat | None] = Field(description="P, I, D, error of the control law.")
    inputs: dict[str, Any] = Field(description="Raw and filtered probe value, setpoint, limits applied.")

    @field_validator("inputs")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not _all_finite(v):
            raise ValueError("every number must be finite (the store holds finite numbers only)")
        return v


class _Applied(_Model):
    """What the agent said it did with a decision (first among a model's bases: its fields come last)."""

    applied_step: int | None = Field(None, description="The step boundary at which the agent applied it (after "
                                     "step N: in effect from the next optimizer step).")
    applied_value: FiniteFloat | None = Field(
        None, description="The value the agent set (its own bounds and rate limit can clip new_value).")
    skipped: str | None = Field(None, description="Why the agent set it aside (no setter, identification...).")


class _Stored(Decision):
    id: int
    run_id: str
    policy_version: int
    created_at: datetime


class DecisionPublic(_Applied, _Stored):
    """A decision as stored: the record plus what the store assigns, and what the agent said it
    did with it (``applied_step``/``applied_value``, or ``skipped``; all None: not acknowledged —
    not received yet, or ordered after the run's last step and so never applied)."""


class DecisionListed(_Applied, DecisionChange):
    """A decision as a report lists it: the change and what the agent did with it (the audit
    trail's components and inputs stay in GET /v1/runs/{id}/decisions)."""


class DecisionPage(_Model):
    items: list[DecisionPublic]
    total: int
    offset: int
    limit: int


# -- events ------------------------------------------------------------------------------------
# What happens to a run beside its decisions, one model per kind: the engine's (guardrails,
# unusable controllers), the operator actions', the live stream's (observations, decisions,
# acknowledgements, state and policy changes, gaps) and the audit trail's. ``Event`` is their
# union, told apart by ``kind`` as on the wire; ``EVENT`` validates one.


class _Event(_Model):
    """One event. Fields named in ``_omit_none`` are left out, not written as null, when None
    (as they always were on the wire)."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True)
    _omit_none: ClassVar[tuple[str, ...]] = ()
    # The audit trail keeps most events whole as their row's payload; those in ``_RecordEvent``
    # keep their row's kind and step out of it.
    _payload_exclude: ClassVar[set[str]] = set()

    kind: str

    @model_serializer(mode="wrap")
    def _omit(self, handler: SerializerFunctionWrapHandler):  # no return type: the schema stays the model's
        data = handler(self)
        for name in self._omit_none:
            key = name if name in data else type(self).model_fields[name].alias
            if key in data and data[key] is None:
                del data[key]
        return data

    def row(self) -> dict[str, Any]:
        """The event as the store's events table keeps it: kind, step and the payload."""
        return {"kind": self.kind, "step": getattr(self, "step", None),
                "payload": self.model_dump(by_alias=True, exclude=self._payload_exclude)}


class GuardrailBreach(_Event):
    """A guardrail fired (after its consecutive breaches); ``action`` is what it does about it."""

    _omit_none = ("rung", "healthy_step")
    kind: Literal["guardrail_breach"] = "guardrail_breach"
    step: int
    guardrail: str
    action: Literal["alert", "adjust", "halt", "rollback"]
    value: float
    threshold: float
    reason: str
    rung: int | None = Field(None, description="The policy's rewind ladder: the rung this firing took (1-based); "
                             "absent without a ladder.")
    healthy_step: int | None = Field(None, description="A rollback: the last step at which every guardrail held; "
                                     "the agent rewinds to its newest checkpoint at or before it.")


class GuardrailCleared(_Event):
    kind: Literal["guardrail_cleared"] = "guardrail_cleared"
    step: int
    guardrail: str
    value: float
    threshold: float


class ControllerUnusable(_Event):
    """A controller's law cannot run on this run's knobs: it is skipped until that changes."""

    kind: Literal["controller_unusable"] = "controller_unusable"
    step: int
    controller: str
    knob: str
    reason: str


class KnobOverridden(_Event):
    kind: Literal["override"] = "override"
    step: int | None
    knob: str
    old: float
    new: float
    note: str


class OverrideReleased(_Event):
    kind: Literal["override_released"] = "override_released"
    step: int | None
    knob: str
    value: float


# An operator's setpoint: a number, or a schedule of [step, value] points.
_Setpoint = float | list[tuple[int, float]]


class SetpointChanged(_Event):
    kind: Literal["setpoint"] = "setpoint"
    step: int | None
    controller: str
    old: _Setpoint | None
    new: _Setpoint


class ControlPaused(_Event):
    kind: Literal["control_paused"] = "control_paused"
    step: int | None


class ControlResumed(_Event):
    kind: Literal["control_resumed"] = "control_resumed"
    step: int | None


class ObservationEvent(_Event):
    """An observation stored (live stream only: the observations themselves are the record)."""

    kind: Literal["observation"] = "observation"
    seq: int
    step: int
    probes: dict[str, float]
    knobs: dict[str, float]


class DecisionEvent(DecisionChange, _Event):
    """A decision made (live stream only: the decision itself is the record)."""

    kind: Literal["decision"] = "decision"


class Acknowledged(DecisionAck, _Event):
    """The agent's acknowledgement of a decision (live stream only: it is kept on the decision)."""

    _omit_none = ("value", "reason")
    kind: Literal["acknowledged"] = "acknowledged"


class _RecordEvent(_Event):
    """An event whose audit row keeps kind and step beside its payload, not in it."""

    _payload_exclude = {"kind", "step"}


class StateChanged(_RecordEvent):
    """The run's state changed. The live event says ``to`` and ``reason``; the audit row ``from``
    and ``to`` (and ``reason`` for a halt or finish by request)."""

    _omit_none = ("step", "from_", "reason")
    kind: Literal["state"] = "state"
    step: int | None = None
    from_: RunStateName | None = Field(None, alias="from")
    to: RunStateName
    reason: str | None = None


class PolicyMoved(_RecordEvent):
    """The run moved to another policy version (``name@version``)."""

    _omit_none = ("step", "from_", "reason")
    kind: Literal["policy_moved"] = "policy_moved"
    step: int | None = None
    from_: str | None = Field(None, alias="from")
    to: str
    reason: str | None = None


class RunRegistered(_RecordEvent):
    """The run registered (audit trail only): its policy version and the knobs it declared."""

    kind: Literal["run_registered"] = "run_registered"
    step: None = Field(None, exclude=True)
    policy: str
    version: int
    knobs: dict[str, KnobSpec]


class AutoGainsFit(_Model):
    """The plant fitted from a warm-up step test (knob in its scale, time in steps)."""

    model: Literal["fopdt", "integrating"]
    gain: float = Field(description="FOPDT: probe change per knob-scale unit; integrating: per unit per step.")
    tau: float
    theta: float
    r2: float = Field(description="Share of the probe's variance the model explains.")
    nrmse: float
    observations: int


class AutoGainsSet(_Model):
    """Gains a controller runs with: kp, ki, kd as ``gains`` states them."""

    gains: Literal["absolute", "relative"]
    kp: float
    ki: float
    kd: float
    direction: Literal["direct", "reverse"]
    setpoint_weight: float = 0.0


class AutoGainsPrediction(_Model):
    """The tuned loop replayed on the fitted model."""

    settling_steps: int | None
    overshoot_pct: float | None
    horizon: int


class AutoGainsTuned(_Event):
    """A ``gains: auto`` controller's warm-up step test was fitted and its gains tuned (SIMC,
    checked by replay): the controller runs with ``gains`` from ``step`` on."""

    kind: Literal["auto_gains"] = "auto_gains"
    step: int
    controller: str
    knob: str
    window: tuple[int, int]
    fit: AutoGainsFit
    gains: AutoGainsSet
    predicted: AutoGainsPrediction
    warnings: list[str] = Field(default_factory=list)


class AutoGainsFallback(_Event):
    """A ``gains: auto`` controller keeps its fallback gains: the fit was refused (``problem``: no
    response, too noisy, too few observations, wrong direction, ...) or no step test was declared."""

    kind: Literal["auto_gains_fallback"] = "auto_gains_fallback"
    step: int
    controller: str
    knob: str
    problem: str
    reason: str
    gains: AutoGainsSet


class HistoryChanged(_Event):
    """The agent had seen decisions the store does not have (a store restored from a backup, a
    failover to a lagging replica) or another numbering: its decisions now follow
    ``resumed_after`` in ``epoch`` (a new one when ``new_epoch``); the acknowledgements of the
    other history it sent (``acks_dropped``) were not recorded."""

    kind: Literal["history_changed"] = "history_changed"
    step: int | None
    epoch: str
    new_epoch: bool
    agent_epoch: str | None
    agent_last_decision: int
    decisions: int
    resumed_after: int
    acks_dropped: int

    def message(self) -> str:
        seen = (f"decision {self.agent_last_decision}" if self.agent_epoch in (None, self.epoch) else
                f"decision {self.agent_last_decision} of epoch {self.agent_epoch}")
        return (f"control resumed after the controller's history changed: the agent had seen {seen}, the "
                f"controller has {self.decisions} decisions (restored from a backup or failed over?); decisions "
                f"after {self.resumed_after} are applied (epoch {self.epoch}), {self.acks_dropped} "
                "acknowledgements of the other history were not recorded")


class Gap(_Event):
    """Live stream only: what the stream cannot resume. ``trimmed``: events ``first`` .. ``last``
    are no longer kept; ``restarted``: the id ``last_event_id`` belongs to a numbering the live
    state lost (re-read the run's report); ``unpublished``: ``missed`` events of the run were stored
    but never reached the live state (Redis down or slow; re-read the run's report); ``behind``: the
    client fell behind the run's events and this connection ends (reconnect after
    ``last_event_id``, the last event it was sent, if any)."""

    _omit_none = ("first", "last", "last_event_id", "missed")
    kind: Literal["gap"] = "gap"
    reason: Literal["trimmed", "restarted", "unpublished", "behind"]
    first: int | None = None
    last: int | None = None
    last_event_id: str | None = None
    missed: int | None = None

    @model_validator(mode="after")
    def _says_what(self) -> Gap:
        named = (self.first is not None, self.last is not None, self.last_event_id is not None, self.missed is not None)
        allowed = {"trimmed": {(True, True, False, False)}, "restarted": {(False, False, True, False)},
                   "unpublished": {(False, False, False, True)},
                   "behind": {(False, False, True, False), (False, False, False, False)}}[self.reason]
        if named not in allowed:
            raise ValueError("a trimmed gap names first and last, a restarted one last_event_id, an unpublished one "
                             "missed, a behind one at most last_event_id")
        return self

    @classmethod
    def trimmed(cls, first: int, last: int) -> Gap:
        return cls(reason="trimmed", first=first, last=last)

    @classmethod
    def restarted(cls, last_event_id: str) -> Gap:
        return cls(reason="restarted", last_event_id=last_event_id)

    @classmethod
    def unpublished(cls, missed: int) -> Gap:
        return cls(reason="unpublished", missed=missed)

    @classmethod
    def behind(cls, last_event_id: str | None) -> Gap:
        return cls(reason="behind", last_event_id=last_event_id)


Event = Annotated[
    GuardrailBreach | GuardrailCleared | ControllerUnusable | KnobOverridden | OverrideReleased | SetpointChanged
    | ControlPaused | ControlResumed | ObservationEvent | DecisionEvent | Acknowledged | StateChanged | PolicyMoved
    | RunRegistered | AutoGainsTuned | AutoGainsFallback | HistoryChanged | Gap,
    Field(discriminator="kind")]
EVENT: TypeAdapter[Event] = TypeAdapter(Event)
EventKind = Literal["guardrail_breach", "guardrail_cleared", "controller_unusable", "override", "override_released",
                    "setpoint", "control_paused", "control_resumed", "observation", "decision", "acknowledged",
                    "state", "policy_moved", "run_registered", "auto_gains", "auto_gains_fallback",
                    "history_changed", "gap"]


class Notice(_Model):
    """Something the agent should tell the user (``kind`` is an event kind, e.g. ``auto_gains``)."""

    kind: str
    controller: str | None = None
    message: str


class IngestResult(_Model):
    accepted: int = Field(description="Observations stored by this request.")
    duplicates: int = Field(description="Observations already stored (same run and seq): ignored.")
    decisions: list[DecisionPublic] = Field(
        description="Decisions after the agent's last_decision, oldest first; at most ACTUATOR_MAX_PENDING_DECISIONS.")
    more_decisions: bool = Field(
        False, description="True: more decisions follow the last one here; post again with last_decision set to "
        "its number to get them.")
    actions: list[Action] = Field(default_factory=list)
    state: RunStateName
    knobs: dict[str, float] = Field(
        default_factory=dict,
        description="Deprecated, read by no agent: the knob values the controller wants in effect now. Still sent, "
        "because agents released before it became optional require it; an agent must not rely on it (decisions and "
        "the run's knobs_in_effect are the source).")
    breached: list[str] = Field(default_factory=list,
                                description="Guardrails in breach after this batch (empty: every guardrail holds).")
    last_step: int | None = Field(None, description="Latest step the service has observed for this run.")
    notices: list[Notice] = Field(default_factory=list, description="What this batch changed about how the run "
                                  "is controlled that the agent should say: gains tuned at warm-up, or a refused fit "
                                  "and the fallback gains.")
    epoch: str | None = Field(None, description="The decision numbering the decisions here belong to: send it back "
                              "as ObservationBatch.epoch. It changes when the store's history did (a restore).")
    resumed_after: int | None = Field(
        None, description="Set when the agent's last_decision or epoch named a history the store does not have (a "
        "restored store): the decisions here follow this number; the agent takes it as its last decision.")


class _Public(BaseModel):
    """What the service answers that is built from a dict: keys beyond the declared fields are
    dropped, never an error (a response that fails its own model would be a 500)."""

    model_config = ConfigDict(extra="ignore")


class ErrorItem(_Model):
    """One thing wrong with a request: where (``body.observations.0.seq``, ``path.run_id``,
    ``query.limit``, ``header.authorization``) and what."""

    loc: str
    msg: str
    type: str | None = Field(None, description="Machine-readable kind (pydantic's error type), when known.")


class ErrorDetail(_Model):
    message: str = Field(description="Every problem in one line, each naming its field.")
    errors: list[ErrorItem] = Field(default_factory=list, description="One entry per problem (may be empty).")


class ErrorPublic(_Model):
    """Every 4xx and 5xx answer of the service: ``{"detail": {"message": ..., "errors": [...]}}``."""

    detail: ErrorDetail


class HealthPublic(_Model):
    status: Literal["ok", "degraded"]
    checks: dict[str, str] = Field(description="Per backend: 'ok' or 'error: <kind>'.")


class PolicyPublic(_Public):
    """One stored version of a policy."""

    id: int
    name: str
    version: int
    archived: bool
    created_at: datetime
    document: dict[str, Any] = Field(description="The policy document (see GET /v1/policies/schema).")


class PolicyArchived(_Public):
    name: str
    archived_versions: int = Field(description="How many versions were archived.")


class PolicyValidation(_Public):
    valid: bool
    errors: list[ErrorItem] = Field(description="Every error with its path in the document (empty when valid).")


class SimulatedAction(Action):
    """An action a replayed policy took, at the step of the observation that caused it."""

    step: int


class SimulationPublic(_Public):
    """What a policy would have done on a run's recorded observations."""

    decisions: list[Decision] = Field(description="The first `max_decisions` decisions (ACTUATOR_SIMULATE_DECISIONS "
                                      "at most); `decisions_total` counts all.")
    actions: list[SimulatedAction] = Field(description="The first actions (as many as decisions at most).")
    events: list[Event] = Field(description="The first events (as many as decisions at most).")
    trace: list[dict[str, Any]] = Field(description="Knob values after every `trace_every`-th replayed observation "
                                        "and the last (at most `trace_points`, ACTUATOR_SIMULATE_TRACE_POINTS).")
    decisions_total: int = Field(0, description="Decisions the replay took (listed or not).")
    actions_total: int = Field(0, description="Actions the replay took (listed or not).")
    events_total: int = Field(0, description="Events the replay raised (listed or not).")
    trace_every: int = Field(1, description="The trace has every k-th replayed observation (and the last).")
    final_state: RunStateName
    observations: int = Field(description="Observations replayed.")
    observations_total: int = Field(description="Observations the run has (more than replayed: `limit` or "
                                    "ACTUATOR_SIMULATE_OBSERVATIONS cut the replay).")


class EventRecord(_Public):
    """An audit event of a run as the store keeps it: breach, override, policy move, state change
    (the payload is the event, see :data:`Event`; a ``_RecordEvent`` without its kind and step)."""

    kind: str
    step: int | None
    payload: dict[str, Any]


class _EventId(_Public):
    id: int


class EventPublic(EventRecord, _EventId):
    """An audit event of a run with its id (page on it) and time."""

    created_at: datetime


class ControlResult(_Public):
    """The answer of an operator action: the run after it, the decisions and events it caused."""

    run: RunState
    decisions: list[DecisionPublic]
    events: list[Event]


class ReportSampling(_Public):
    """How a report's series were downsampled: every k-th observation and the last."""

    observations: int = Field(description="Observations the run has.")
    every: int = Field(description="k: one observation in k is in the series (1: all).")
    max_points: int | None = Field(None, description="Points per series at most (ACTUATOR_REPORT_POINTS, fewer "
                                   "when the run reports many series).")


class ReportPublic(_Public):
    """A run's report as JSON: series as ``[step, value]`` pairs, decisions and events."""

    run: dict[str, Any]
    probes: dict[str, list[list[float]]]
    knobs: dict[str, list[list[float]]]
    metrics: dict[str, list[list[float]]]
    setpoints: dict[str, Any]
    thresholds: dict[str, float]
    decisions: list[DecisionListed] = Field(description="The latest ACTUATOR_REPORT_DECISIONS decisions.")
    events: list[EventRecord] = Field(description="The latest ACTUATOR_REPORT_EVENTS events.")
    sampling: ReportSampling
    decisions_omitted: int = Field(description="Earlier decisions not listed (GET /v1/runs/{id}/decisions pages "
                                   "through all).")
    events_omitted: int = Field(description="Earlier events not listed (GET /v1/runs/{id}/events pages through all).")


class TuneCreate(_Model):
    """Identify a run's plant for one controller and propose gains (``POST /v1/policies/tune``)."""

    run_id: str = Field(max_length=64, pattern=r"^[A-Za-z0-9\-]+$",
                        description="The run whose observations (probe and knob values in effect) are fitted.")
    controller: Name = Field(description="The setpoint controller to tune, by name in the policy.")
    policy: str | dict[str, Any] | None = Field(
        None, description="A stored policy (name or name@version) or a document holding the controller; default: "
        "the run's own policy.")
    aggressiveness: float = Field(
        1.0, gt=0, le=10, allow_inf_nan=False,
        description="tau_c = effective dead time (its upper bound from the fit) / aggressiveness: 1 is SIMC's tight-control choice, 2 a loop "
        "twice as fast (less robust), 0.5 twice as slow.")
    horizon: PositiveWireInt | None = Field(
        None, description="Steps the predicted response covers (default: the run's span, at least 12 "
        "closed-loop time constants).")


class FittedModelPublic(_Public):
    """The fitted plant, knob in its scale (ln for log knobs), time in optimizer steps."""

    kind: Literal["fopdt", "integrating"]
    gain: float = Field(description="FOPDT: steady-state probe change per knob-scale unit; integrating: its rate "
                        "per step.")
    tau: float = Field(description="Time constant (steps); 0 for an integrating model.")
    theta: float = Field(description="Dead time (steps).")
    theta_hi: float = Field(0.0, description="The largest dead time the data cannot rule out (95% profile "
                            "likelihood): what tuning sizes the loop on.")
    rate: float
    offset: float
    transient: float
    drift: float = Field(description="Probe units per step the probe moves on its own: the integrating model's "
                         "drift at the first knob value, or a FOPDT's drift term (0 when not significant).")
    u_ref: float
    r2: float = Field(description="Share of the probe's variance the model explains.")
    nrmse: float = Field(description="RMS residual / the probe's range.")
    residual_sd: float
    observations: int
    steps: int
    knob_move: float = Field(description="The knob's recorded excursion (scale units).")


class TuningPublic(_Public):
    kp: float
    ki: float
    kd: float
    direction: Literal["direct", "reverse"]
    tau_c: float
    theta_eff: float
    tau_i: float = Field(description="Integral time (steps), parallel form: ki = kp / tau_i.")
    tau_d: float = Field(description="Derivative time (steps), parallel form: kd = kp * tau_d (0: a PI).")
    aggressiveness: float
    rule: str
    theta_hi_eff: float = Field(0.0, description="theta_hi plus the sampling hold: tau_c = theta_hi_eff / "
                                "aggressiveness.")
    setpoint_weight: float = Field(1.0, description="P on this share of the initial error (1: the structure SIMC "
                                   "assumes).")


class PredictedResponse(_Public):
    settling_steps: int | None = Field(description="Steps until the probe stays within +-10% of the setpoint "
                                       "(None: not within the horizon).")
    overshoot_pct: float | None
    final_error: float | None = None
    final_knob: float | None = None
    knob_range: list[float] | None = None
    decisions: int
    response: list[dict[str, float]] = Field(default_factory=list, description="A thinned trace: step, probe, "
                                             "setpoint, knob.")


class TunePrediction(_Public):
    horizon: int
    proposed: PredictedResponse
    current: PredictedResponse


class TunePublic(_Public):
    """The fitted model, the proposed gains, their predicted response (and the current gains'), the policy."""

    run_id: str
    controller: str
    probe: str
    knob: str
    scale: Scale
    interval: int = Field(description="Steps between two updates of the law: the policy's probe interval, else the "
                          "run's observations' median gap.")
    model: FittedModelPublic
    gains: TuningPublic
    noise_floor: dict[str, float] | None = Field(
        None, description="Set when probe noise slowed tau_c: the loop's own jitter (probe sd) before, the limit "
        "(half the +-10% band), and the tau_c that meets it.")
    current_gains: dict[str, Any]
    predicted: TunePrediction
    policy: dict[str, Any] = Field(description="The policy with the proposed gains (create it with POST /v1/policies).")
    policy_yaml: str
    warnings: list[str]
    within_limits: bool = Field(True, description="Whether the proposal's replay keeps tune's own limits: "
                                "overshoot within 15%, settling within +-10% inside the replay and inside the "
                                "recorded run's length.")
    outside_limits: list[str] = Field(default_factory=list, description="Each limit the proposal breaks, with "
                                      "the predicted numbers and what to change.")
    observations_used: int
    observations_total: int
