"""Wire models (pydantic v2) shared by the service, the client and the agent.

Naming follows ``XCreate`` (what a client sends) / ``XPublic`` (what the service returns).
Every number that reaches the engine is finite: NaN and infinities are refused at the edge.
The service refuses fields a model does not declare; the client (actuator.client) reads the
service's answers ignoring them, so an agent keeps working with a newer service.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

__all__ = [
    "DecisionAck",
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
    "RunCreate",
    "RunCreated",
    "RunPublic",
    "RunState",
    "ObservationCreate",
    "ObservationBatch",
    "Action",
    "Decision",
    "DecisionPublic",
    "DecisionPage",
    "IngestResult",
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
RunStateName = Literal["running", "paused", "halted", "finished"]

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


class RunCreate(_Model):
    """Register a run. ``policy`` is a stored policy's name (latest version, or ``name@version``),
    or an inline policy document that is stored as a new policy version."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] = "run"
    policy: str | dict[str, Any]
    knobs: list[KnobSpec] = Field(default_factory=list, max_length=32)
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

    @field_validator("knobs")
    @classmethod
    def _unique(cls, knobs: list[KnobSpec]) -> list[KnobSpec]:
        names = [k.name for k in knobs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"knob names must be unique, repeated: {sorted(dup)}")
        return knobs


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
        "controller fed by one gets no readings). Empty: none starved, or no report yet.")


class RunCreated(RunPublic):
    token: str = Field(description="Run-scoped agent token. Shown once; stored hashed.")
    policy: dict[str, Any] = Field(description="The policy document the run runs under.")


class RunState(RunPublic):
    """A run with its live picture: latest probes, controller states, decision count."""

    latest_probes: dict[str, float]
    latest_metrics: dict[str, float]
    knobs_in_effect: dict[str, float] = Field(
        description="Knob values in effect: the latest observation's, or a value the agent acknowledged "
        "applying at or after that observation's step.")
    controllers: dict[str, dict[str, Any]]
    guardrails: dict[str, dict[str, Any]]
    decisions: int


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


class ObservationBatch(_Model):
    observations: list[ObservationCreate] = Field(min_length=1, max_length=1000)
    last_decision: WireInt = Field(
        0, ge=0, le=MAX_INT,
        description="Highest decision number the agent has applied; decisions after it are returned.",
    )
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


class Decision(_Model):
    """A knob change the controller, a guardrail or an operator orders: the one decision record
    the engine makes, the store keeps (as :class:`DecisionPublic`), the API returns and the
    report lists. Every number in it is finite: JSON and Postgres hold no others."""

    number: int = Field(description="Per-run decision number, 1, 2, ...")
    step: int = Field(description="The step from which the new value applies.")
    knob: str
    old_value: FiniteFloat
    new_value: FiniteFloat
    reason: str
    controller: str | None = Field(description="The controller that decided (None: a guardrail or an operator).")
    components: dict[str, FiniteFloat | None] = Field(description="P, I, D, error of the control law.")
    inputs: dict[str, Any] = Field(description="Raw and filtered probe value, setpoint, limits applied.")

    @field_validator("inputs")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not _all_finite(v):
            raise ValueError("every number must be finite (the store holds finite numbers only)")
        return v


class DecisionPublic(Decision):
    """A decision as stored: the record plus what the store assigns, and what the agent said it
    did with it (``applied_step``/``applied_value``, or ``skipped``; all None: not acknowledged —
    not received yet, or ordered after the run's last step and so never applied)."""

    id: int
    run_id: str
    policy_version: int
    created_at: datetime
    applied_step: int | None = Field(None, description="The step boundary at which the agent applied it (after "
                                     "step N: in effect from the next optimizer step).")
    applied_value: FiniteFloat | None = Field(
        None, description="The value the agent set (its own bounds and rate limit can clip new_value).")
    skipped: str | None = Field(None, description="Why the agent set it aside (no setter, identification...).")


class DecisionPage(_Model):
    items: list[DecisionPublic]
    total: int
    offset: int
    limit: int


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
    knobs: dict[str, float] = Field(description="Knob values the controller wants in effect now.")
    breached: list[str] = Field(default_factory=list,
                                description="Guardrails in breach after this batch (empty: every guardrail holds).")
    last_step: int | None = Field(None, description="Latest step the service has observed for this run.")


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


class SimulationPublic(_Public):
    """What a policy would have done on a run's recorded observations."""

    decisions: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    events: list[dict[str, Any]]
    trace: list[dict[str, Any]] = Field(description="Knob values after each replayed observation.")
    final_state: RunStateName
    observations: int = Field(description="Observations replayed.")
    observations_total: int = Field(description="Observations the run has (more than replayed: `limit` or "
                                    "ACTUATOR_SIMULATE_OBSERVATIONS cut the replay).")


class EventPublic(_Public):
    """An audit event of a run: breach, override, policy move, state change."""

    id: int
    kind: str
    step: int | None
    payload: dict[str, Any]
    created_at: datetime


class ControlResult(_Public):
    """The answer of an operator action: the run after it, the decisions and events it caused."""

    run: RunState
    decisions: list[DecisionPublic]
    events: list[dict[str, Any]]


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
    decisions: list[dict[str, Any]] = Field(description="The latest ACTUATOR_REPORT_DECISIONS decisions.")
    events: list[dict[str, Any]] = Field(description="The latest ACTUATOR_REPORT_EVENTS events.")
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
    observations_used: int
    observations_total: int
