"""Policy documents: which probes run, which controllers turn which knobs, which guardrails protect.

A policy is a versioned document (YAML or JSON) validated here. ``load_policy`` accepts a dict,
a YAML/JSON string or a path and raises :class:`PolicyError` listing *every* error with its
JSON path, so ``actuator policy validate`` and ``POST /v1/policies/validate`` can show them all.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, Union, cast

import yaml
from pydantic import (BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, SerializationInfo,
                      SerializerFunctionWrapHandler, Tag, TypeAdapter, ValidationError, ValidationInfo, field_validator,
                      model_serializer, model_validator)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import InitErrorDetails, PydanticCustomError

from ._exceptions import PolicyError
from .catalogue import KNOBS, PROBES, TRAIN_SIGNALS
from .controllers import (ConstraintLaw, FollowLaw, Leg, MaximizeLaw, ParameterError, PIDConfig, SetpointLaw,
                          SplitRangeConfig, SplitRangeError, SplitRangeLaw, check_schedule, register, registry)
from .schemas import MAX_INT, MAX_SETPOINT_POINTS, FiniteFloat, Name, PositiveFinite, Scale

__all__ = [
    "KNOWN_PROBES",
    "KNOWN_KNOBS",
    "FilterSpec",
    "ProbeSpec",
    "ControllerSpec",
    "GuardrailSpec",
    "RewindSpec",
    "PolicyDocument",
    "load_policy",
    "policy_errors",
    "setpoint_at",
    "relative",
    "list_presets",
    "load_preset",
    "protect_policy",
    "constraint_controller",
    "probe_for_key",
]

# Observation keys the shipped probes produce and the knobs Actuator can turn: live views of the
# catalogue (actuator/catalogue.py), which defines each once. Policies may also name "train.<metric>"
# (a training metric the agent reports, e.g. train.loss) or "custom.<anything>" for user probes.
KNOWN_PROBES = PROBES.keys()
KNOWN_KNOBS = KNOBS.keys()


def _check_in_range(probe: str | None, value: float, what: str) -> None:
    # The values a probe can take: a setpoint or threshold outside them can never be met.
    known = PROBES.get(probe or "") or TRAIN_SIGNALS.get(probe or "")
    lo, hi = known.range if known is not None else (-math.inf, math.inf)
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is outside the range of {probe} [{lo}, {hi}]")
_FREE_PREFIXES = ("train.", "custom.")


def probe_for_key(key: str) -> str | None:
    """The shipped probe (its ``probes[].name``) that produces observation key ``key``:
    ``hotpotqa.gold_logprob`` -> ``hotpotqa``, ``answer_agreement`` -> ``embedding_drift``; None for
    the keys no probe produces (``train.*``, ``custom.*``; ``compression.*`` come from knob setters)."""
    known = PROBES.get(key)
    return known.source if known is not None else None


def _check_probe(name: str) -> str:
    if name in KNOWN_PROBES or name.startswith(_FREE_PREFIXES):
        return name
    raise ValueError(
        f"unknown probe {name!r}; known: {sorted(KNOWN_PROBES)} or a 'train.<metric>' / 'custom.<name>' key"
    )


def _check_knob(name: str) -> str:
    if name in KNOWN_KNOBS or name.startswith("custom."):
        return name
    raise ValueError(f"unknown knob {name!r}; known: {sorted(KNOWN_KNOBS)} or 'custom.<name>'")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FilterSpec(_Model):
    """Probes are noisy; a controller acts on the filtered value."""

    kind: Literal["none", "ema", "median"] = "none"
    alpha: float = Field(0.5, gt=0, le=1, description="EMA weight of the newest value.")
    window: int = Field(3, ge=1, le=100, description="Median window (observations).")


class ProbeSpec(_Model):
    """A probe the agent should run; fetched by the agent at run start."""

    name: Name
    every: int | None = Field(50, ge=1, description="Run every N optimizer steps.")
    on_evaluate: bool = False
    max_examples: int | None = Field(None, ge=1)


# Gains are knob-scale units per probe unit: past this no probe's units make a gain meaningful,
# and every term of the law would only sit at its overflow limit.
MAX_GAIN = 1e9

# A setpoint, budget or threshold relative to the probe's first value: '+10%', '-5%'.
_PERCENT = r"[+-]\d+(\.\d+)?%"

# The longest warm-up step test a policy may ask for (hold or length, in steps).
MAX_IDENTIFY_STEPS = 100_000


class IdentifySpec(_Model):
    """The warm-up step test of a ``gains: auto`` controller (``controllers/identify.py::StepTest``):
    hold the knob ``hold`` steps, move it by ``size`` (scale units: log units for a log knob, 0.5 is
    x1.65) for ``length`` steps, then restore it. A field left out is sized by the agent."""

    size: FiniteFloat | None = Field(None, description="The move, in the knob's scale units (non-zero).")
    hold: int | None = Field(None, ge=0, le=MAX_IDENTIFY_STEPS, description="Steps at the nominal value first.")
    length: int | None = Field(None, ge=1, le=MAX_IDENTIFY_STEPS, description="Steps at the moved value.")

    @field_validator("size")
    @classmethod
    def _moves(cls, v: float | None) -> float | None:
        if v is not None and v == 0:
            raise ValueError("a step test needs a non-zero size")
        return v


SetpointPoints = Annotated[list[tuple[Annotated[int, Field(ge=0)], FiniteFloat]],
                          Field(min_length=1, max_length=MAX_SETPOINT_POINTS)]


class ControllerSpec(_Model):
    """probe (filtered) → control law → knob: the fields every kind shares.

    A controller is one of three kinds, each its own model with its own fields and rules
    (``PolicyDocument.controllers`` picks the model by ``kind``; ``ControllerSpec.model_validate``
    does the same): :class:`SetpointController` (``kind: setpoint``, the default) holds the probe at
    ``setpoint`` with a PID; :class:`ConstraintController` (``kind: constraint``) keeps the probe
    within a budget (``setpoint`` is the budget; ``bound: upper`` means probe <= budget) with a
    PID-Lagrangian on a multiplier knob >= 0 such as ``kl_weight``: the weight rises only while the
    constraint is violated and returns to 0 once it holds (see ``controllers/lagrangian.py``), its
    direction following from ``bound``; :class:`MaximizeController` (``kind: maximize``) has no
    setpoint: extremum seeking moves the knob towards where the probe (minus ``cost_weight`` × the
    ``cost`` probe) peaks, with a square-wave ``dither``, a ``gain`` and a centre step of at most
    ``max_step`` per decision (see ``controllers/extremum.py``); :class:`FollowController` (``kind:
    follow``) has no setpoint either: the knob follows the probe through a monotone piecewise-linear
    ``schedule`` [[probe value, knob value], ...], at most ``max_step`` per decision (see
    ``controllers/follow.py``).

    A field of another kind is refused with a message saying whose it is (``PolicyDocument``
    reports it beside the document's other errors) unless it holds that field's unused value, as
    documents written before the kinds were separate do; read on a controller, another kind's
    field gives its unused value (``kp`` of a maximize controller is None).
    """

    name: Name
    kind: Literal["setpoint", "constraint", "maximize", "follow", "split_range"] = Field(
        "setpoint", description="setpoint: hold the probe at setpoint (PID); constraint: keep it within the "
        "budget given as setpoint, with a multiplier knob >= 0 (PID-Lagrangian); maximize: drive the knob to "
        "where the probe peaks (extremum seeking; no setpoint); follow: set the knob to a monotone schedule's "
        "value at the probe (no setpoint); split_range: one PID output drives two knobs over split ranges of it "
        "(legs).")
    probe: str
    knob: str
    filter: FilterSpec = Field(default_factory=FilterSpec)
    min: FiniteFloat | None = Field(None, description="Tighter lower bound than the run's knob.")
    max: FiniteFloat | None = Field(None, description="Tighter upper bound than the run's knob.")
    scale: Scale | None = Field(None, description="Override of the knob's scale.")
    max_step: PositiveFinite | None = Field(None, description="Largest change per decision (scale units).")
    priority: int = Field(0, description="When two controllers drive one knob, the higher priority acts.")

    # Fields of another kind found in the input (their values valid for the kind they belong to):
    # kind_errors reports those that are not the field's unused value.
    _foreign: dict[str, Any] = PrivateAttr(default_factory=dict)

    _probe = field_validator("probe")(classmethod(lambda cls, v: _check_probe(v)))
    _knob = field_validator("knob")(classmethod(lambda cls, v: _check_knob(v)))

    @field_validator("max")
    @classmethod
    def _bounds(cls, v: float | None, info: ValidationInfo) -> float | None:
        # A field validator (not a model one) so this error is reported beside any others.
        lo = info.data.get("min")
        if v is not None and lo is not None and lo > v:
            raise ValueError(f"min ({lo}) is greater than max ({v})")
        return v

    @model_validator(mode="wrap")
    @classmethod
    def _other_kinds_fields(cls, data: Any, handler: Any) -> Any:
        """Set another kind's fields aside, each checked as its own kind checks it, and report
        their errors together with this kind's own."""
        if not isinstance(data, dict):
            return handler(data)
        foreign = {k: v for k, v in data.items() if k in _KIND_FIELDS and k not in cls.model_fields}
        errors: list[InitErrorDetails] = []
        try:
            spec = handler({k: v for k, v in data.items() if k not in foreign})
        except ValidationError as exc:
            errors += _details(exc)
        for name, value in foreign.items():
            try:
                foreign[name] = _KIND_FIELDS[name].validate_python(value)
            except ValidationError as exc:
                errors += _details(exc, (name,))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        # kept only where it is not the field's unused value: a spec equals another of the same fields
        spec._foreign = {k: v for k, v in foreign.items() if v != _UNUSED[k]}
        return spec

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """A controller's document as stored and served: every kind's fields, another kind's at its
        unused value, in one order (the REST contract and the stored documents keep their shape)."""
        own = handler(self)
        if self.kind not in _FLAT_KINDS or not isinstance(own, dict) or info.exclude_defaults or info.exclude_unset or info.include or info.exclude:
            return own
        unused = {k: v for k, v in _UNUSED.items() if not (info.exclude_none and v is None)}
        return {k: own[k] if k in own else unused[k] for k in _DUMP_ORDER
                if (k in own and not (k in _OMIT_NONE and own[k] is None) and not (k in _OMIT_ZERO and own[k] == 0))
                or (k not in own and k in unused and k not in _OWN_ONLY)}

    @classmethod
    def model_validate(cls, obj: Any, *, strict: bool | None = None, extra: Any = None,
                       from_attributes: bool | None = None, context: Any | None = None,
                       by_alias: bool | None = None, by_name: bool | None = None) -> Self:
        """``ControllerSpec.model_validate`` gives the model of the document's kind."""
        if cls is ControllerSpec:
            return cast(Self, _CONTROLLER.validate_python(obj, strict=strict, extra=extra,
                                                          from_attributes=from_attributes, context=context,
                                                          by_alias=by_alias, by_name=by_name))
        return super().model_validate(obj, strict=strict, extra=extra, from_attributes=from_attributes,
                                      context=context, by_alias=by_alias, by_name=by_name)

    def __getattr__(self, name: str) -> Any:
        # Another kind's field reads as its unused value (kp of a maximize controller: None).
        if name in _KIND_FIELDS and name not in type(self).model_fields:
            return _UNUSED[name]
        return super().__getattr__(name)  # type: ignore[misc]

    def given(self, name: str) -> Any:
        """The value ``name`` was given: this kind's field, or another kind's found in the input."""
        return getattr(self, name) if name in type(self).model_fields else self._foreign.get(name)

    def kind_errors(self) -> list[tuple[str, str]]:
        """``(field, message)`` for every field this controller's kind requires or does not use."""
        return []

    def driven(self) -> list[str]:
        """The knobs this controller drives (a split_range controller's two legs' knobs)."""
        return [self.knob] if self.knob is not None else []

    @staticmethod
    def setpoint_at(target: Any, step: int, baseline: float | None = None) -> float:
        """A setpoint's value at ``step`` (see the module's :func:`setpoint_at`), for the laws."""
        return setpoint_at(target, step, baseline)


class _FeedbackController(ControllerSpec):
    """What the two PID kinds share: a setpoint (or budget), gains, direction, deadband, cooldown."""

    #: the setpoint is a budget (relative gains are per unit of its margin)
    budget: ClassVar[bool] = False

    setpoint: FiniteFloat | SetpointPoints | str | None = Field(
        None, description="Constant, a piecewise-linear schedule [[step, value], ...], or relative to the "
        "probe's first value: '+10%' (e.g. a perplexity budget). Required by setpoint and constraint "
        "controllers; a maximize controller has none."
    )
    gains: Literal["absolute", "relative", "auto"] = Field(
        "absolute", description="absolute: kp, ki, kd are knob-scale units per probe unit. relative: per unit of "
        "relative error, the same numbers for a probe of any magnitude: a setpoint controller's error divided by "
        "|setpoint| (a relative setpoint '+10%' resolved against the probe's first value), a constraint's "
        "violation divided by the budget's margin (0.10 × |first value| for '+10%', |budget| for an absolute "
        "one). auto: the agent runs a step test on the knob at warm-up and the service tunes the gains from it "
        "(identify, SIMC, replay); kp, ki, kd are then the fallback gains, stated relative, used until the test "
        "ends and whenever its fit is refused. At most one controller of a policy has auto gains.")
    identify: IdentifySpec | None = Field(
        None, description="gains auto only: the warm-up step test (size in the knob's scale units, hold and "
        "length in steps). Default: sized by the agent to fit the scheduler's warm-up, else the first 10% of "
        "max_steps.")
    kp: FiniteFloat | None = Field(None, ge=0, le=MAX_GAIN, description="Required by setpoint and constraint "
                                   "controllers.")
    ki: FiniteFloat = Field(0.0, ge=0, le=MAX_GAIN)
    kd: FiniteFloat = Field(0.0, ge=0, le=MAX_GAIN)
    direction: Literal["direct", "reverse"] = Field(
        "direct",
        description="direct: raising the knob raises the probe (learning_rate → kl_drift); "
        "reverse: raising the knob lowers it (kl_beta → kl_drift).",
    )
    deadband: FiniteFloat = Field(0.0, ge=0)
    cooldown: int = Field(0, ge=0, description="Optimizer steps between two changes.")
    horizon: FiniteFloat = Field(
        0.0, ge=0, le=100, description="Prediction for an integrating plant, in probe intervals (0: off): P, I and "
        "the deadband act on the projected value y + horizon·(y − previous y), or, with gains auto and an "
        "integrating fit, on the fitted model's projection.")

    @field_validator("setpoint")
    @classmethod
    def _sorted(cls, v: Any) -> Any:
        if isinstance(v, str):
            if not re.fullmatch(_PERCENT, v.strip()):
                raise ValueError("a relative setpoint looks like '+10%' or '-5%'")
            return v.strip()
        if isinstance(v, list):
            steps = [s for s, _ in v]
            if steps != sorted(steps) or len(set(steps)) != len(steps):
                raise ValueError("setpoint schedule steps must be strictly increasing")
        return v

    def _points(self) -> list[float]:
        """The setpoint's values: a constant's, a schedule's points'; none for a relative one."""
        return [self.setpoint] if isinstance(self.setpoint, (int, float)) else (
            [p[1] for p in self.setpoint] if isinstance(self.setpoint, list) else [])

    @model_validator(mode="after")
    def _reachable(self) -> Self:
        for value in self._points():
            _check_in_range(self.probe, value, "setpoint")
        return self

    def kind_errors(self) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        for name in ("setpoint", "kp"):
            if getattr(self, name) is None:
                errors.append((name, f"a {self.kind} controller needs {name}"))
        for name in ("dither", "gain", "cost"):
            if self.given(name) is not None:
                errors.append((name, f"only a maximize controller has {name} (this one is kind {self.kind})"))
        if self.given("schedule") is not None:
            errors.append(("schedule", f"only a follow controller has schedule (this one is kind {self.kind})"))
        if "legs" not in type(self).model_fields and self.given("legs") is not None:
            errors.append(("legs", f"only a split_range controller has legs (this one is kind {self.kind})"))
        if self.given("cost_weight"):
            errors.append(("cost_weight", f"only a maximize controller has cost_weight (kind {self.kind})"))
        if "release" not in type(self).model_fields and self.given("release"):
            errors.append(("release", f"release makes a setpoint controller's knob one-sided (this one is kind "
                                      f"{self.kind})"))
        if self.identify is not None and self.gains != "auto":
            errors.append(("identify", "identify sizes the warm-up step test of gains auto (this controller's gains "
                                       f"are {self.gains})"))
        points = self._points()
        if self.gains != "absolute" and points and min(points) <= 0 <= max(points):
            errors.append(("gains", "relative gains divide the error by |setpoint|, which is 0 here (or on the way): "
                                    "state the gains as absolute"))
        return errors

    def error_span(self, setpoint: float, baseline: float | None) -> float:
        """What kp, ki and kd divide by so they act on the error as ``gains`` states them: 1.0 for
        absolute gains; for relative ones the setpoint's magnitude (``setpoint``: the one in force,
        a relative one already resolved against the probe's first value ``baseline``) or, for a
        constraint, the budget's margin. Raises ParameterError (field ``gains``) when that span is
        zero or not finite, or needs a baseline not known yet."""
        if self.gains == "absolute":
            return 1.0  # relative, and auto's fallback gains (stated relative)
        span, what = self._span(setpoint, baseline)
        if not (math.isfinite(span) and span > 0):
            raise ParameterError("gains", f"relative gains divide the error by {what}, here {span:g}: state the "
                                          "gains as absolute")
        return span

    def _span(self, setpoint: float, baseline: float | None) -> tuple[float, str]:
        return abs(setpoint), "|setpoint|"

    def gains_text(self) -> str:
        """The gains as stated and, for relative ones, what they are per probe unit: the numbers
        where the span is known without a run (a constant setpoint, an absolute budget), else the
        formula in the probe's first reading ``b`` (``kp 0.5 per +10% margin = 0.5/(0.1·b) per
        perplexity unit``)."""
        terms = [(n, float(getattr(self, n) or 0.0)) for n in ("kp", "ki", "kd")]
        terms = [t for t in terms if t[1]] or terms[:1]
        stated = " ".join(f"{n} {v:g}" for n, v in terms)
        unit = f"per {self.probe} unit"
        if self.gains == "absolute":
            return f"{stated} {unit}"
        if isinstance(self.setpoint, str):
            formula = self._span_formula(float(self.setpoint.rstrip("%")) / 100.0)
            per = f"per {self.setpoint} margin" if self.budget else "per unit of |setpoint|"
            return f"{stated} {per} = " + " ".join(f"{n} {v:g}/({formula})" for n, v in terms) + \
                f" {unit}, b the first {self.probe} reading"
        if isinstance(self.setpoint, list):
            ends = sorted(abs(v) for _, v in self.setpoint)
            return (f"{stated} per unit of |setpoint| = " + " ".join(f"{n} {v:g}/|setpoint|" for n, v in terms)
                    + f" {unit}, |setpoint| {ends[0]:g}…{ends[-1]:g} on the schedule")
        what = "margin |budget|" if self.budget else "|setpoint|"
        try:
            span = self.error_span(float(self.setpoint or 0.0), None)
        except ParameterError as exc:
            return f"{stated} relative: {exc}"
        return f"{stated} per unit of {what} {span:g} = " + " ".join(f"{n} {v / span:.4g}" for n, v in terms) + \
            f" {unit}"

    def _span_formula(self, pct: float) -> str:
        # |setpoint| for a first reading b > 0: b·(1 + pct)
        return f"{1 + pct:g}·b"


_SETPOINT_RAMP = Field(0.0, ge=0, le=10000, description="setpoint and split_range only: the setpoint in force "
                       "moves from the probe's first reading to the target over this many probe intervals (0: "
                       "steps to it at once).")


class SetpointController(_FeedbackController):
    """``kind: setpoint`` (the default): hold the probe at ``setpoint`` with a PID."""

    kind: Literal["setpoint"] = Field("setpoint", description="setpoint: hold the probe at setpoint (PID).")
    setpoint_ramp: FiniteFloat = _SETPOINT_RAMP
    release: FiniteFloat = Field(
        0.0, ge=0, le=10, description="setpoint only: a one-sided knob (an entropy bonus, which can only push "
        "its probe one way and feeds on itself past the target). While the filtered reading is past the setpoint "
        "by more than this fraction of |setpoint| on the side the knob pushes toward (above it for direction "
        "direct), the knob goes to its minimum at once, this controller's max_step aside (the run's own rate limit on "
        "the knob still holds); back inside, it climbs from there at max_step. 0: off. Needs a finite minimum.")
    setpoint_weight: FiniteFloat = Field(
        0.0, ge=0, le=1, description="setpoint only: how much of the error found at the controller's first "
        "update the proportional term acts on (0: bumpless start, the integral alone closes the initial gap; 1: "
        "P on the error from the start, the structure SIMC gains assume; `actuator policy tune` sets 1).")


class ConstraintController(_FeedbackController):
    """``kind: constraint``: keep the probe within the budget ``setpoint`` with a PID-Lagrangian on a
    multiplier knob >= 0 (linear scale); the direction follows from ``bound``."""

    kind: Literal["constraint"] = Field("constraint", description="constraint: keep the probe within the budget given as "
                                        "setpoint, with a multiplier knob >= 0 (PID-Lagrangian).")
    budget: ClassVar[bool] = True
    bound: Literal["upper", "lower"] = Field(
        "upper", description="constraint only: upper = probe <= budget (drift, perplexity); lower = probe >= "
        "budget (gold log-prob, accuracy).")

    @model_validator(mode="after")
    def _constraint(self) -> Self:
        if self.scale not in (None, "linear"):
            raise ValueError(f"a constraint's knob is a multiplier on a linear scale, not {self.scale!r}")
        if self.min is not None and self.min < 0:
            raise ValueError(f"a constraint's multiplier is >= 0: min {self.min} is negative")
        # Raising a restoring-force weight pushes the probe back inside its bound.
        self.direction = "reverse" if self.bound == "upper" else "direct"
        return self

    def _span(self, setpoint: float, baseline: float | None) -> tuple[float, str]:
        # the margin: pct x |first value| for a relative budget ('+10%'), |budget| for an absolute one
        if not isinstance(self.setpoint, str):
            return abs(setpoint), "the budget's margin |budget|"
        if baseline is None:
            raise ParameterError("gains", f"relative gains on the budget {self.setpoint!r} need the probe's first "
                                          "value")
        pct = abs(float(self.setpoint.rstrip("%"))) / 100.0
        return pct * abs(baseline), f"the budget's margin ({self.setpoint} of |{baseline:g}|)"

    def _span_formula(self, pct: float) -> str:
        return f"{abs(pct):g}·|b|"

    def kind_errors(self) -> list[tuple[str, str]]:
        errors = super().kind_errors()
        if self.given("setpoint_weight"):
            errors.append(("setpoint_weight", "a constraint's multiplier starts at rest: setpoint_weight is a "
                                              "setpoint controller's"))
        if self.given("setpoint_ramp"):
            errors.append(("setpoint_ramp", "a constraint holds its budget from the start: setpoint_ramp is a "
                                            "setpoint controller's"))
        return errors


class MaximizeController(ControllerSpec):
    """``kind: maximize``: no setpoint; extremum seeking climbs to where the probe peaks.
    ``kp``/``ki``/``kd``, ``direction``, ``deadband`` and ``cooldown`` are not its fields."""

    kind: Literal["maximize"] = Field("maximize", description="maximize: drive the knob to where the probe peaks (extremum "
                                      "seeking; no setpoint).")
    dither: PositiveFinite | None = Field(None, description="maximize only (required): the square-wave "
                                          "perturbation's amplitude, in the knob's scale units.")
    gain: FiniteFloat | None = Field(None, ge=0, le=MAX_GAIN, description="maximize only (required): centre "
                                     "move per unit of estimated d(probe)/d(knob), scale units.")
    smoothing: FiniteFloat = Field(0.5, gt=0, le=1, description="maximize only: weight of the newest sample in "
                                   "the gradient estimate (1: no low-pass).")
    cost: str | None = Field(None, description="maximize only: a probe or train.<metric> subtracted from the "
                             "probe, times cost_weight (e.g. train.step_seconds).")
    cost_weight: FiniteFloat = Field(0.0, ge=0, le=MAX_GAIN, description="maximize only: weight of cost.")

    @field_validator("cost")
    @classmethod
    def _cost_probe(cls, v: str | None) -> str | None:
        return None if v is None else _check_probe(v)

    def kind_errors(self) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        for name in ("dither", "gain"):
            if getattr(self, name) is None:
                errors.append((name, f"a maximize controller needs {name}"))
        if self.given("setpoint") is not None:
            errors.append(("setpoint", "a maximize controller has no setpoint: it climbs to where the probe peaks "
                                       "(use kind setpoint to hold a value)"))
        for name in ("kp", "ki", "kd"):
            if self.given(name):
                errors.append((name, f"a maximize controller has no {name}: its step size is gain (and max_step)"))
        if self.given("gains") in ("relative", "auto"):
            errors.append(("gains", f"a maximize controller has no kp, ki, kd to state {self.given('gains')}: its "
                                    "step size is gain (and max_step)"))
        if self.given("identify") is not None:
            errors.append(("identify", "a maximize controller has no gains to identify"))
        for name in ("deadband", "cooldown"):
            if self.given(name):
                errors.append((name, f"a maximize controller does not use {name}: the dither moves every decision"))
        if self.given("setpoint_weight"):
            errors.append(("setpoint_weight", "a maximize controller has no setpoint to weigh"))
        for name in ("horizon", "setpoint_ramp", "release"):
            if self.given(name):
                errors.append((name, f"a maximize controller has no setpoint: {name} is a feedback controller's"))
        if self.scale == "integer":
            errors.append(("scale", "a maximize controller needs a linear or log scale (a dither must be able to "
                                    "move the knob by less than one unit)"))
        if self.given("schedule") is not None:
            errors.append(("schedule", "only a follow controller has schedule (this one is kind maximize)"))
        if self.given("legs") is not None:
            errors.append(("legs", "only a split_range controller has legs (this one is kind maximize)"))
        if self.cost is not None and not self.cost_weight:
            errors.append(("cost_weight", f"cost {self.cost!r} is named but cost_weight is 0"))
        if self.cost_weight and self.cost is None:
            errors.append(("cost", "cost_weight > 0 needs the cost probe to weigh"))
        return errors


class FollowController(ControllerSpec):
    """``kind: follow``: no setpoint; the knob is set to a monotone schedule's value at the
    (filtered) probe: ``schedule`` [[probe value, knob value], ...], probe values strictly
    increasing, knob values all rising or all falling, interpolated linearly between the points and
    held at the end points' values outside them. Bounds, ``max_step`` and ``scale`` as for the
    other kinds. E.g. the LK hybrid loss's TV weight rising with the measured draft acceptance."""

    kind: Literal["follow"] = Field("follow", description="follow: set the knob to the schedule's value at the "
                                    "probe (no setpoint).")
    schedule: list[tuple[FiniteFloat, FiniteFloat]] | None = Field(
        None, max_length=MAX_SETPOINT_POINTS, description="follow only (required): "
        "[[probe value, knob value], ...], probe values strictly increasing, knob values monotone; the knob "
        "follows the line through them (flat beyond the end points).")

    @field_validator("schedule")
    @classmethod
    def _monotone(cls, v: list[tuple[float, float]] | None, info: ValidationInfo) -> list[tuple[float, float]] | None:
        if v is None:
            return v
        try:
            check_schedule(v)
        except ParameterError as exc:
            raise ValueError(str(exc).removeprefix("schedule: ")) from None
        probe = info.data.get("probe")
        for x, _ in v:
            _check_in_range(probe, x, "schedule probe value")
        # the knob's bounds where the catalogue states them absolutely, and the controller's own
        name = info.data.get("knob") or ""
        knob = KNOBS.get(name)
        bounds = [(knob.min if isinstance(knob.min, (int, float)) else -math.inf,
                   knob.max if isinstance(knob.max, (int, float)) else math.inf, f"the bounds of {name}")
                  ] if knob is not None else []
        own = info.data.get("min"), info.data.get("max")
        if own != (None, None):
            bounds.append((-math.inf if own[0] is None else own[0], math.inf if own[1] is None else own[1],
                           "the controller's min/max"))
        for _, y in v:
            for lo, hi, what in bounds:
                if not lo <= y <= hi:
                    raise ValueError(f"schedule knob value {y:g} is outside {what} [{lo:g}, {hi:g}]")
        return v

    def kind_errors(self) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        if self.schedule is None:
            errors.append(("schedule", "a follow controller needs schedule: [[probe value, knob value], ...]"))
        if self.given("setpoint") is not None:
            errors.append(("setpoint", "a follow controller has no setpoint: its schedule maps the probe to the knob "
                                       "(use kind setpoint to hold a value)"))
        for name in ("kp", "ki", "kd"):
            if self.given(name):
                errors.append((name, f"a follow controller has no {name}: the schedule sets the knob (max_step "
                                     "limits each move)"))
        if self.given("gains") in ("relative", "auto"):
            errors.append(("gains", f"a follow controller has no gains to state {self.given('gains')}"))
        if self.given("identify") is not None:
            errors.append(("identify", "a follow controller has no gains to identify"))
        for name in ("dither", "gain", "cost"):
            if self.given(name) is not None:
                errors.append((name, f"only a maximize controller has {name} (this one is kind follow)"))
        if self.given("legs") is not None:
            errors.append(("legs", "only a split_range controller has legs (this one is kind follow)"))
        for name in ("cost_weight", "deadband", "cooldown", "setpoint_weight", "horizon", "setpoint_ramp", "release"):
            if self.given(name):
                errors.append((name, f"a follow controller does not use {name}"))
        if self.given("direction") == "reverse":
            errors.append(("direction", "a follow controller's direction is its schedule's: knob values falling "
                                        "with the probe"))
        return errors


class LegSpec(_Model):
    """One knob of a split-range controller: over ``range`` [lo, hi] of the controller's output the
    knob moves from ``values[0]`` (at lo) to ``values[1]`` (at hi), linearly in its scale, and holds
    the end value outside it; ``acts`` says how raising the knob acts on the probe."""

    knob: str
    range: tuple[FiniteFloat, FiniteFloat] = Field(description="[lo, hi] of the output, within [-1, 1], lo < hi.")
    values: tuple[FiniteFloat, FiniteFloat] = Field(description="[knob at lo, knob at hi]: the knob never leaves "
                                                    "them (a learning rate ending at its peak never exceeds it).")
    acts: Literal["direct", "reverse"] = Field(description="direct: raising the knob raises the probe "
                                               "(learning_rate -> kl_drift); reverse: lowers it (kl_weight, kl_beta).")

    _knob = field_validator("knob")(classmethod(lambda cls, v: _check_knob(v)))

    @field_validator("range")
    @classmethod
    def _in_unit(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not -1.0 <= v[0] < v[1] <= 1.0:
            raise ValueError(f"a leg's range is [lo, hi] with -1 <= lo < hi <= 1, got [{v[0]:g}, {v[1]:g}]")
        return v

    def leg(self, scale: str | None = None) -> Leg:
        """The controllers' Leg, on the knob's scale (the catalogue's when ``scale`` is None)."""
        known = KNOBS.get(self.knob)
        scale = scale or (known.scale if known is not None else "linear")
        return Leg(knob=self.knob, lo=self.range[0], hi=self.range[1], at_lo=self.values[0], at_hi=self.values[1],
                   acts=self.acts, scale="log" if scale == "log" else "linear")


def split_range_field(field: str) -> str:
    """A SplitRangeError's field (``legs[1].at_lo``) as the document's (``legs.1.values``)."""
    m = re.fullmatch(r"legs(?:\[(\d+)\](?:\.(\w+))?)?", field)
    if m is None:
        return field
    index, name = m.groups()
    sub = {"lo": "range", "hi": "range", "at_lo": "values", "at_hi": "values"}.get(name or "", name)
    return ".".join(p for p in ("legs", index, sub) if p)


class SplitRangeController(_FeedbackController):
    """``kind: split_range``: one PID output u in [-1, 1] drives two knobs, each over its own range
    of u (``legs``), for a plant where each knob has authority one way only: under DPO the learning
    rate over [0, 1] (up to the configured peak) for "KL too low", the anchor weight over [-1, 0]
    for "KL too high" (see ``controllers/split_range.py``). ``direction`` says how raising u acts on
    the probe; each leg's ``acts`` must agree with it. ``max_step`` limits u's move per decision."""

    kind: Literal["split_range"] = Field("split_range", description="split_range: one PID output drives two "
                                         "knobs over split ranges of it (legs).")
    knob: str | None = Field(None, description="split_range: none (the legs name the knobs).")  # type: ignore[assignment]
    setpoint_ramp: FiniteFloat = _SETPOINT_RAMP
    legs: list[LegSpec] | None = Field(None, description="split_range only (required): two legs [{knob, range: "
                                       "[lo, hi], values: [at lo, at hi], acts}], ranges not overlapping.")

    @field_validator("knob")
    @classmethod
    def _knob(cls, v: str | None) -> str | None:  # type: ignore[override]
        return None if v is None else _check_knob(v)

    def driven(self) -> list[str]:
        return [leg.knob for leg in self.legs or ()]

    @staticmethod
    def split_range_field(field: str) -> str:
        """A SplitRangeError's field as the document's (see the module's :func:`split_range_field`)."""
        return split_range_field(field)

    def config(self, law: PIDConfig, scales: dict[str, str] | None = None) -> SplitRangeConfig:
        """The controllers' SplitRangeConfig (legs on the run's knob scales, the catalogue's where
        not given); raises SplitRangeError where the legs would not act as their ranges say."""
        legs = tuple(leg.leg((scales or {}).get(leg.knob)) for leg in self.legs or ())
        cfg = SplitRangeConfig(law=law, legs=legs)
        cfg.validate()
        return cfg

    def kind_errors(self) -> list[tuple[str, str]]:
        errors = super().kind_errors()
        if self.legs is None:
            errors.append(("legs", "a split_range controller needs legs: [{knob, range, values, acts}, ...] (two)"))
        elif len(self.legs) != 2:
            errors.append(("legs", f"a split_range controller drives two knobs, got {len(self.legs)} legs"))
        else:
            try:
                self.config(PIDConfig(setpoint=0.0, kp=0.0, direction=self.direction))
            except SplitRangeError as exc:
                errors.append((split_range_field(exc.field), str(exc).removeprefix(f"{exc.field}: ")))
        if self.knob is not None:
            errors.append(("knob", "a split_range controller names its knobs in legs, not knob"))
        if self.gains == "auto":
            errors.append(("gains", "a split_range controller's gains are written (absolute or relative): a step "
                                    "test identifies one knob"))
        for name in ("min", "max", "scale"):
            if getattr(self, name) is not None:
                errors.append((name, f"a split_range controller's knobs are bounded by their legs' values: {name} "
                                     "does not apply"))
        return errors


# The kinds there are: the law registry's (controllers/registry.py), the shipped ones registered below.
_KINDS: dict[str, type[ControllerSpec]] = {}
# Every kind's own fields, each with a validator of its type and constraints and its unused value.
_KIND_FIELDS: dict[str, TypeAdapter[Any]] = {}
_UNUSED: dict[str, Any] = {}


# The kinds whose documents were written before the kinds were separate models: each of their
# fields is read on any of them (its unused value) and accepted at its unused value. A kind
# registered later keeps its own fields to itself (another kind's document naming them is refused).
_FLAT_KINDS = frozenset({"setpoint", "constraint", "maximize", "follow", "split_range"})

# The order of a controller's fields in its document (the order of the one model before the kinds).
_DUMP_ORDER: tuple[str, ...] = (
    "name", "kind", "bound", "probe", "knob", "setpoint", "gains", "kp", "ki", "kd", "direction", "filter", "min", "max",
    "scale", "max_step", "deadband", "setpoint_weight", "cooldown", "priority", "dither", "gain", "smoothing", "cost",
    "cost_weight", "schedule", "identify", "horizon", "setpoint_ramp", "legs")
# Fields added after the flat shape was fixed: in their own kind's documents only, so the documents
# of the kinds before them (stored, served, compared) keep their shape.
_OWN_ONLY = {"schedule", "identify", "horizon", "setpoint_ramp", "legs"}
# ... and left out where unset (None; 0 for those in _OMIT_ZERO), so a document without them keeps
# its shape in every kind (a split_range controller has no knob of its own: left out too).
_OMIT_NONE = frozenset({"identify", "knob"})
_OMIT_ZERO = frozenset({"horizon", "setpoint_ramp", "release"})


def _kind_of(value: Any) -> str:
    if not isinstance(value, (dict, ControllerSpec)):
        return "?"  # refused as not a controller (a mapping or ControllerSpec), as before the kinds
    kind = value.get("kind", "setpoint") if isinstance(value, dict) else value.kind
    return kind if isinstance(kind, str) and kind in _KINDS else "?"


def _union() -> Any:
    """A controller document: the model of its kind (no kind: setpoint). An unknown kind is
    validated by the shared fields alone, whose `kind` then names the kinds there are."""
    tagged = [Annotated[model, Tag(kind)] for kind, model in _KINDS.items()]
    return Annotated[Union[*tagged, Annotated[SkipJsonSchema[ControllerSpec], Tag("?")]],  # noqa: UP007
                     Discriminator(_kind_of)]


Controller: Any = None
_CONTROLLER: TypeAdapter[ControllerSpec]
_TAGS: set[str] = {"?"}
def _add_kind(reg: registry.Registration) -> None:
    """A law registered (controllers/registry.py): documents of its kind are validated by its model.

    The kind's own fields join the document's (after the shipped kinds' fields, and only in its own
    documents), and the models that hold controllers are rebuilt with the new kind."""
    global Controller, _CONTROLLER, _TAGS
    model = reg.spec
    if not (isinstance(model, type) and issubclass(model, ControllerSpec)):
        raise TypeError(f"the spec of kind {reg.kind!r} is a ControllerSpec model, got {model!r}")
    _KINDS[reg.kind] = model
    global _DUMP_ORDER
    for name, info in model.model_fields.items():
        if name in ControllerSpec.model_fields:
            continue
        if name not in _KIND_FIELDS and reg.kind in _FLAT_KINDS:
            _KIND_FIELDS[name] = TypeAdapter(cast(Any, Annotated[info.annotation, info]))
            _UNUSED[name] = info.get_default(call_default_factory=True)
        if name not in _DUMP_ORDER:
            _DUMP_ORDER = (*_DUMP_ORDER, name)
            _OWN_ONLY.add(name)
    Controller = _union()
    _CONTROLLER = TypeAdapter(Controller)
    _TAGS = {*_KINDS, "?"}
    if "PolicyDocument" in globals():
        PolicyDocument.model_fields["controllers"].annotation = list[Controller]
        PolicyDocument.model_rebuild(force=True)


def _shipped_kinds() -> None:
    register("setpoint", spec=SetpointController, law=SetpointLaw)
    register("constraint", spec=ConstraintController, law=ConstraintLaw)
    register("maximize", spec=MaximizeController, law=MaximizeLaw)
    register("follow", spec=FollowController, law=FollowLaw)
    register("split_range", spec=SplitRangeController, law=SplitRangeLaw)


registry.on_register(_add_kind)
_shipped_kinds()


def _details(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[InitErrorDetails]:
    """A ValidationError's errors, to raise again (under ``prefix``) with others."""
    return [{"type": PydanticCustomError(e["type"], str(e["msg"])), "loc": (*prefix, *e["loc"]), "input": e["input"]}
            for e in exc.errors(include_url=False)]


class GuardrailSpec(_Model):
    """A protected probe: when it crosses its threshold ``consecutive`` times, act."""

    name: Name
    probe: str
    bound: Literal["lower", "upper"] = Field(
        description="lower: the probe must stay >= threshold (e.g. gold_logprob); upper: <= threshold (drift)."
    )
    threshold: FiniteFloat | str = Field(
        description="Absolute value, or relative to the run's first value: '-5%' / '+20%' (to its best "
        "reading so far with reference: best)."
    )
    reference: Literal["first", "best"] = Field(
        "first", description="What a relative threshold is relative to: the run's first reading, or its best "
        "reading so far (the lowest for an upper bound, the highest for a lower bound): '+50%' with 'best' fires "
        "when a probe that training improves falls back 50% from its best, the fall a rewind undoes.")
    action: Literal["alert", "adjust", "halt", "rollback"] = "alert"
    knob: str | None = Field(None, description="Knob scaled by 'adjust' / damped after 'rollback'.")
    factor: FiniteFloat = Field(0.5, gt=0, description="Multiplier applied to the knob by adjust/rollback.")
    consecutive: int = Field(1, ge=1, le=1000)
    hysteresis: FiniteFloat = Field(0.0, ge=0, description="Clear only once back inside by this margin.")

    _probe = field_validator("probe")(classmethod(lambda cls, v: _check_probe(v)))

    @field_validator("knob")
    @classmethod
    def _knob_ok(cls, v: str | None) -> str | None:
        return None if v is None else _check_knob(v)

    @field_validator("threshold")
    @classmethod
    def _threshold(cls, v: float | str) -> float | str:
        if isinstance(v, str) and not re.fullmatch(_PERCENT, v.strip()):
            raise ValueError("a relative threshold looks like '-5%' or '+20%'")
        return v.strip() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _needs_knob(self) -> GuardrailSpec:
        if self.action == "adjust" and self.knob is None:
            raise ValueError("action 'adjust' needs 'knob'")
        if self.reference == "best" and not isinstance(self.threshold, str):
            raise ValueError("reference 'best' is for a relative threshold ('+50%'); an absolute threshold is "
                             "the same at every reading")
        if not isinstance(self.threshold, str):
            _check_in_range(self.probe, float(self.threshold), "threshold")
        return self

    def resolve_threshold(self, baseline: float | None) -> float | None:
        """Absolute threshold; None while a relative one has no baseline yet."""
        if not isinstance(self.threshold, str):
            return float(self.threshold)
        if baseline is None:
            return None
        return relative(self.threshold, baseline)


class HealthySaves(_Model):
    """Checkpoints where a rollback needs them: the agent saves at a probe reading and keeps the
    save once the service says every guardrail held there."""

    keep: int = Field(description="How many of the agent's healthy saves to keep (the newest); older ones are "
                      "deleted. The user's own checkpoints (save_steps) are never touched.", ge=1, le=100)
    every: int = Field(1, ge=1, le=MAX_INT, description="At most one save per this many steps (a save is made only "
                       "at a step whose probes ran).")


class KeepBest(_Model):
    """Keep the model with the best reading of one probe."""

    probe: str = Field(description="The probe (an observation key) whose best reading is kept.")
    mode: Literal["max", "min"] = Field(description="max: the highest reading is the best; min: the lowest.")
    at_end: Literal["load", "last"] = Field("load", description="load: at the end of training the model is the "
                                            "best reading's; last: the last step's stays (the best is kept on disk).")

    _probe = field_validator("probe")(classmethod(lambda cls, v: _check_probe(v)))


class LadderRung(_Model):
    """One rung of the escalation ladder: what a firing does, and for how many firings."""

    action: Literal["adjust", "rollback", "halt"] = Field(
        description="adjust: damp the guardrail's knob by its factor; rollback: rewind to the last healthy "
        "checkpoint and damp; halt: stop the run.")
    times: int = Field(1, ge=1, le=1000, description="Firings this rung takes before the next rung.")


class Ladder(_Model):
    """What the guardrails with ``action: rollback`` do as they fire again: the n-th firing within
    ``window`` steps takes the rung its count reaches; the last rung must be ``halt``."""

    window: int = Field(ge=1, le=MAX_INT, description="Firings are counted within this many steps before the "
                        "current one (older ones are forgotten).")
    rungs: list[LadderRung] = Field(min_length=1, max_length=10,
                                    description="In order; e.g. adjust, then rollback twice, then halt.")

    @field_validator("rungs")
    @classmethod
    def _ends_in_halt(cls, rungs: list[LadderRung]) -> list[LadderRung]:
        if rungs[-1].action != "halt":
            raise ValueError(f"the last rung must be 'halt' (a ladder with a defined end), not {rungs[-1].action!r}")
        return rungs

    def rung(self, earlier: int) -> tuple[int, LadderRung]:
        """The rung (1-based number, rung) of a firing after ``earlier`` firings within the window."""
        seen = 0
        for i, r in enumerate(self.rungs[:-1]):
            seen += r.times
            if earlier < seen:
                return i + 1, r
        return len(self.rungs), self.rungs[-1]


_REPLAY = ("'replay' is not supported: the Trainer's batch iterator lives inside its training loop, so a callback "
           "cannot move it back; batches consumed since the rewound checkpoint are not seen again ('skip'). To "
           "replay them, stop and resume with trainer.train(resume_from_checkpoint=...)")


class RewindSpec(_Model):
    """Rewind: checkpoints at healthy readings, the best model by a probe, and an escalation
    ladder for the guardrails that roll back."""

    healthy_saves: HealthySaves | None = Field(None, description="Save at probe readings where every guardrail "
                                               "holds (the agent's own checkpoints). Default: off.")
    keep_best: KeepBest | None = Field(None, description="Keep the checkpoint with the best reading of a probe.")
    ladder: Ladder | None = Field(None, description="Escalation for the guardrails with action rollback: each "
                                  "firing counted, the rung its count reaches acts. Default: every firing rolls back.")
    data: str = Field("skip", description="The data after a rewind: 'skip' (the only choice): the batches consumed "
                      "since the checkpoint are not seen again; training goes on with the next batch.")

    @field_validator("data")
    @classmethod
    def _data(cls, v: str) -> str:
        if v == "replay":
            raise ValueError(_REPLAY)
        if v != "skip":
            raise ValueError(f"{v!r}: the data after a rewind is 'skip'")
        return v


class PolicyDocument(_Model):
    """A policy: probes to run, controllers, guardrails."""

    name: Name
    description: str = Field("", max_length=2000)
    probes: list[ProbeSpec] = Field(default_factory=list, max_length=32)
    controllers: list[Controller] = Field(
        default_factory=list, max_length=32, description="ControllerSpec documents, each the model of its kind: "
        "SetpointController (no kind: setpoint), ConstraintController, MaximizeController or FollowController.")
    guardrails: list[GuardrailSpec] = Field(default_factory=list, max_length=64)
    rewind: RewindSpec | None = Field(None, description="Healthy checkpoints, keep-best by a probe and the "
                                      "escalation ladder of rollbacks (see how-to 'Undo a bad stretch of training').")

    @model_validator(mode="after")
    def _ladder_knobs(self) -> PolicyDocument:
        ladder = self.rewind.ladder if self.rewind else None
        if ladder is not None and any(r.action == "adjust" for r in ladder.rungs):
            bare = [g.name for g in self.guardrails if g.action == "rollback" and g.knob is None]
            if bare:
                raise ValueError(f"rewind.ladder.rungs: an 'adjust' rung damps the guardrail's knob, and guardrail(s) "
                                 f"{bare} with action rollback name no 'knob'")
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> PolicyDocument:
        for field in ("probes", "controllers", "guardrails"):
            names = [item.name for item in getattr(self, field)]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise ValueError(f"{field}: names must be unique, repeated: {dup}")
        return self

    @model_validator(mode="after")
    def _computable(self) -> PolicyDocument:
        """What the fields' own validation lets through but the engine and the store cannot
        compute with: integers past the store's range (a cooldown of 10**400 overflows float() at
        every observation) and relative setpoints/thresholds whose percentage is not a finite
        number ('+999...9%' is inf). Each error names its field."""
        errors: list[InitErrorDetails] = []

        def walk(value: Any, loc: tuple[str | int, ...]) -> None:
            if len(loc) == 2 and loc[0] == "controllers":  # a controller's errors carry its kind, as pydantic's do
                loc = (*loc, self.controllers[int(loc[1])].kind)
            if isinstance(value, bool):
                return
            if isinstance(value, int) and abs(value) > MAX_INT:
                errors.append({"type": PydanticCustomError("int_range", "integer out of range (at most {max})",
                                                           {"max": MAX_INT}), "loc": loc, "input": value})
            elif isinstance(value, dict):
                for k, v in value.items():
                    walk(v, (*loc, k))
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    walk(v, (*loc, i))

        walk(self.model_dump(), ())
        for i, c in enumerate(self.controllers):
            for name, msg in c.kind_errors():
                errors.append({"type": PydanticCustomError("controller_kind", msg),
                               "loc": ("controllers", i, c.kind, name), "input": c.given(name)})
        auto = [i for i, c in enumerate(self.controllers)
                if registry.registration(c.kind).law.identifies and c.gains == "auto"]
        for i in auto[1:]:
            c = self.controllers[i]
            same = [self.controllers[j].name for j in auto if j < i and self.controllers[j].knob == c.knob]
            why = (f"controller {same[0]!r} already identifies knob {c.knob!r}" if same else
                   f"controller {self.controllers[auto[0]].name!r} already has them")
            errors.append({"type": PydanticCustomError("auto_gains", "at most one controller of a policy has gains "
                                                       "auto: the warm-up runs one step test on one knob ({why}); "
                                                       "state this one's gains relative", {"why": why}),
                           "loc": ("controllers", i, c.kind, "gains"), "input": c.gains})
        relatives: list[tuple[tuple[str | int, ...], Any]] = [
            (("controllers", i, c.kind, "setpoint"), c.setpoint) for i, c in enumerate(self.controllers)]
        relatives += [(("guardrails", i, "threshold"), g.threshold) for i, g in enumerate(self.guardrails)]
        for loc, value in relatives:
            if isinstance(value, str) and not math.isfinite(float(value.rstrip("%"))):
                errors.append({"type": PydanticCustomError("finite_percentage", "the percentage must be a finite "
                                                           "number"), "loc": loc, "input": value})
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


def relative(spec: str, baseline: float) -> float:
    """'+10%' of ``baseline``: baseline + |baseline| * 0.10, kept finite (a baseline near the
    float range would otherwise make an infinite setpoint or threshold, which no law can use and
    no store can hold)."""
    value = baseline + abs(baseline) * float(spec.strip().rstrip("%")) / 100.0
    return min(max(value, -sys.float_info.max), sys.float_info.max)


def setpoint_at(setpoint: float | list[tuple[int, float]] | str, step: int, baseline: float | None = None) -> float:
    """Value of a constant, piecewise-linear (held flat outside the points) or relative setpoint."""
    if isinstance(setpoint, str):
        if baseline is None:
            raise ValueError("a relative setpoint needs the probe's baseline")
        return relative(setpoint, baseline)
    if not isinstance(setpoint, list):
        return float(setpoint)
    pts = setpoint
    if step <= pts[0][0]:
        return float(pts[0][1])
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if s0 <= step <= s1:
            return float(v0 + (v1 - v0) * (step - s0) / (s1 - s0))
    return float(pts[-1][1])


def policy_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic errors as ``{"loc": "controllers.0.kp", "msg": ..., "type": ...}``."""
    out = []
    for err in exc.errors(include_url=False):
        parts = list(err["loc"])
        if len(parts) >= 3 and parts[0] == "controllers" and parts[2] in _TAGS:
            del parts[2]  # the kind pydantic adds to a controller's errors: the document has no such level
        loc = ".".join(str(p) for p in parts)
        msg = str(err["msg"]).removeprefix("Value error, ")
        out.append({"loc": loc or "(document)", "msg": msg, "type": err["type"]})
    return out


def load_policy(source: PolicyDocument | dict[str, Any] | str | Path) -> PolicyDocument:
    """Parse and validate a policy from a dict, a YAML/JSON string or a file path."""
    if isinstance(source, PolicyDocument):
        return source
    data: Any = source
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith((".yaml", ".yml", ".json"))):
        path = Path(source)
        if not path.exists():
            raise PolicyError(f"policy file not found: {path}")
        source = path.read_text()
    if isinstance(source, str):
        try:
            data = json.loads(source) if source.lstrip().startswith("{") else yaml.safe_load(source)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise PolicyError(f"policy is not valid YAML/JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PolicyError("a policy document must be a mapping", [{"loc": "(document)", "msg": "not a mapping"}])
    try:
        return PolicyDocument.model_validate(data)
    except ValidationError as exc:
        errors = policy_errors(exc)
        lines = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        raise PolicyError(f"invalid policy: {lines}", errors) from exc


_PRESETS = Path(__file__).parent / "presets"


def list_presets() -> list[str]:
    """Names of the shipped policy presets."""
    return sorted(p.stem for p in _PRESETS.glob("*.yaml"))


def load_preset(name: str) -> PolicyDocument:
    """A shipped preset by name: sft-capability, dpo-kl, draft-distill, compress-ppl, compress-threshold,
    compress-width, protect-capability."""
    path = _PRESETS / f"{name}.yaml"
    if not path.exists():
        raise PolicyError(f"no preset {name!r}; presets: {list_presets()}")
    return load_policy(path)


def protect_policy(
    protect: dict[str, float | str],
    *,
    on_drift: str = "adjust",
    on_breach: str = "rollback",
    knob: str = "learning_rate",
    factor: float = 0.5,
    consecutive: int = 2,
    every: int | None = None,
    anchor: bool = False,
) -> PolicyDocument:
    """The one-line form: ``{"hotpotqa.gold_logprob": "-5%", "kl_drift": 0.1}`` → a policy with
    one guardrail per entry. Drift probes (``kl_drift``, ``answer_kl``, ``policy_kl``, ``embedding_drift``) get an upper bound
    and the ``on_drift`` action; other probes get ``on_breach``. Probes where higher is better
    (HotpotQA, draft acceptance, agreement) are protected from below, the rest from above.
    ``adjust`` and ``rollback`` scale ``knob`` by ``factor``.

    ``anchor=True`` (the run has a KL anchor, knob ``kl_weight``): every entry with an absolute
    budget also gets a constraint controller on ``kl_weight`` (the ``protect-capability`` preset's
    law, gains scaled by the budget), its guardrail only alerts (the restoring force holds the
    budget, so rolling back at the budget would fight it), and probes run every 10 steps, not 50. Relative budgets ('-5%') keep their
    guardrails (their scale is only known once the run has a baseline)."""
    if not protect:
        raise PolicyError("protect: name at least one probe", [{"loc": "protect", "msg": "empty"}])
    # A guardrail can look rarely; a controller holding a budget needs a reading every few steps.
    every = every if every is not None else (10 if anchor else 50)
    guardrails = []
    controllers: list[dict[str, Any]] = []
    probes: dict[str, dict[str, Any]] = {}
    for probe, threshold in protect.items():
        known = PROBES.get(probe)  # the catalogue says which probes measure drift and which are better higher
        is_drift = known is not None and known.drift
        lower = known is not None and known.higher_is_better
        action = on_drift if is_drift else on_breach
        if anchor and not isinstance(threshold, str) and float(threshold) != 0:
            controllers.append(constraint_controller(f"hold-{probe}".replace(".", "-")[:64], probe, float(threshold),
                                                     bound="lower" if lower else "upper"))
            action = "alert"
        guardrails.append({
            "name": f"protect-{probe}".replace(".", "-")[:64],
            "probe": probe, "bound": "lower" if lower else "upper", "threshold": threshold,
            "action": action, "knob": knob if action in ("adjust", "rollback") else None,
            "factor": factor, "consecutive": consecutive,
        })
        pname = probe_for_key(probe) or probe
        probes[pname] = {"name": pname, "every": every}
    digest = hashlib.sha1(json.dumps([protect, on_drift, on_breach, knob, factor, anchor], sort_keys=True,
                                     default=str).encode()).hexdigest()[:8]
    return load_policy({"name": f"protect-{digest}", "description": f"protect {sorted(protect)}",
                        "probes": list(probes.values()), "controllers": controllers, "guardrails": guardrails})


# The constraint law's default gains, per unit of budget (so they carry across probes and
# budgets): a violation the size of the budget asks for CONSTRAINT_KP of weight at once and adds
# CONSTRAINT_KI per step while it lasts. Picked on seed 0 of the forgetting scenario among three
# sets (BENCHMARKS.md): larger gains answer Adam's lagging rise with a weight that undoes the task.
CONSTRAINT_KP = 0.5
CONSTRAINT_KI = 0.05


def constraint_controller(name: str, probe: str, budget: float, *, bound: str = "upper", knob: str = "kl_weight",
                          kp: float = CONSTRAINT_KP, ki: float = CONSTRAINT_KI, priority: int = 10) -> dict[str, Any]:
    """A ``kind: constraint`` controller document with gains scaled by ``|budget|``."""
    scale = abs(budget) or 1.0
    return {"name": name, "kind": "constraint", "bound": bound, "probe": probe, "knob": knob,
            "setpoint": budget, "kp": kp / scale, "ki": ki / scale, "priority": priority}

