"""Split-range control: one controller output drives two knobs, each over its own range of it.

Some plants give a knob authority in one direction only. Under DPO the learning rate can stop the
KL rising but never bring it back (nothing in the loss pulls the policy towards the reference),
while a KL-anchor weight (or β) pulls it back but does nothing for a KL that is too low. Process
control's answer is split-range control: one law computes one output ``u``, and ``u``'s range is
split between the knobs. For the KL: ``u`` in [0, 1] moves the learning rate from its floor (at 0)
up to the user's configured peak (at 1) and never above it; ``u`` in [-1, 0] moves the anchor
weight from 0 (at 0) up to its largest value (at -1). "KL too low" is answered by the learning
rate, "KL too high" by the anchor, and one integral carries the loop across the hand-over.

* **The law** is the setpoint :class:`~.pid.PID` on ``u`` (linear scale, bounds = the legs' outer
  ends), with everything it has: rate limit on ``u``, anti-windup at both ends, deadband,
  cooldown, prediction (``horizon``) and the setpoint ramp. Its ``direction`` says how *raising
  u* acts on the measurement.
* **The legs.** Each :class:`Leg` maps its range ``[lo, hi]`` of ``u`` linearly (in the knob's
  scale: log for a learning rate) from ``at_lo`` to ``at_hi`` and holds the end value outside it.
  A knob therefore never leaves ``[min(at_lo, at_hi), max(at_lo, at_hi)]``: a learning-rate leg
  ending at the user's peak cannot exceed it.
* **Directions are checked.** Each leg states how its knob acts on the measurement (``acts``:
  ``"direct"``, raising the knob raises the probe, as the learning rate raises KL; ``"reverse"``,
  as an anchor weight or β lowers it). Moving ``u`` up moves each knob one way; the two together
  must act on the measurement the way the law's ``direction`` says, for both legs. Otherwise the
  loop would push one of them the wrong way: :class:`SplitRangeError` names the leg and says why.
* **Bumpless.** The ranges do not overlap, so at any ``u`` at most one knob is away from its rest
  end, and at the boundary both are at rest: crossing it moves each knob continuously (each
  moves by at most its slope times the rate limit on ``u``). The law's first update (and a
  hand-back, :meth:`SplitRange.bumpless`) starts from the ``u`` that the knobs in effect
  correspond to (:meth:`SplitRange.output_of`), so attaching the controller changes nothing.
* **Explanations** name the knob that acted, which way, over which range of the output, and why
  (the measurement against the setpoint in force): :attr:`SplitRangeOutput.reason`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._checks import ParameterError, require_finite
from .law import LawBase, LawOutput, Reading
from .pid import PID, Direction, PIDConfig, PIDOutput, PIDState, pid_config
from .registry import undeclared

__all__ = ["Leg", "SplitRangeConfig", "SplitRangeError", "SplitRangeOutput", "SplitRange"]

_SAME_VALUE_RTOL = 1e-12


class SplitRangeError(ParameterError):
    """A split-range configuration whose legs would not act the way its ranges say."""


@dataclass(frozen=True)
class Leg:
    """One knob's share of the output: ``u`` in ``[lo, hi]`` moves it from ``at_lo`` to ``at_hi``."""

    knob: str
    lo: float
    hi: float
    at_lo: float
    at_hi: float
    acts: Direction
    scale: Literal["linear", "log"] = "linear"

    def validate(self, where: str) -> None:
        for name in ("lo", "hi", "at_lo", "at_hi"):
            require_finite(f"{where}.{name}", getattr(self, name))
        if not self.lo < self.hi:
            raise SplitRangeError(f"{where}.lo", f"the range must be lo < hi, got [{self.lo}, {self.hi}]")
        if self.at_lo == self.at_hi:
            raise SplitRangeError(f"{where}.at_hi", f"{self.knob} does not move over its range (both ends "
                                                    f"{self.at_lo})")
        if self.acts not in ("direct", "reverse"):
            raise SplitRangeError(f"{where}.acts", f"must be 'direct' or 'reverse', got {self.acts!r}")
        if self.scale not in ("linear", "log"):
            raise SplitRangeError(f"{where}.scale", f"must be 'linear' or 'log', got {self.scale!r}")
        if self.scale == "log" and not (self.at_lo > 0 and self.at_hi > 0):
            raise SplitRangeError(f"{where}.at_lo", f"a log-scale knob's ends must be > 0, got {self.at_lo}, "
                                                    f"{self.at_hi}")

    @property
    def rises(self) -> bool:
        """Whether raising ``u`` raises this knob."""
        return self.at_hi > self.at_lo

    def _s(self, v: float) -> float:
        return math.log(v) if self.scale == "log" else v

    def value(self, u: float) -> float:
        """The knob's value at output ``u`` (held at the end values outside the range)."""
        share = min(1.0, max(0.0, (u - self.lo) / (self.hi - self.lo)))
        if share == 0.0:
            return self.at_lo
        if share == 1.0:
            return self.at_hi
        a, b = self._s(self.at_lo), self._s(self.at_hi)
        x = a + share * (b - a)
        return math.exp(x) if self.scale == "log" else x

    def outputs(self, v: float) -> tuple[float, float]:
        """The interval of ``u`` at which the knob has value ``v`` (``v`` clamped into the leg's
        values first): a point inside the range, a half-line at an end value."""
        lo_v, hi_v = min(self.at_lo, self.at_hi), max(self.at_lo, self.at_hi)
        v = min(max(v, lo_v), hi_v)  # > 0 on a log scale: both ends are
        share = (self._s(v) - self._s(self.at_lo)) / (self._s(self.at_hi) - self._s(self.at_lo))
        if share <= 0.0:
            return -math.inf, self.lo
        if share >= 1.0:
            return self.hi, math.inf
        u = self.lo + share * (self.hi - self.lo)
        return u, u


@dataclass(frozen=True)
class SplitRangeConfig:
    """The law on the output (``law``: its ``out_min``/``out_max`` and ``scale`` are set from the
    legs) and the two legs, in any order."""

    law: PIDConfig
    legs: tuple[Leg, Leg]

    def validate(self) -> None:
        if len(self.legs) != 2:
            raise SplitRangeError("legs", f"split-range control drives two knobs, got {len(self.legs)}")
        for k, leg in enumerate(self.legs):
            leg.validate(f"legs[{k}]")
        a, b = sorted(self.legs, key=lambda leg: leg.lo)
        if a.knob == b.knob:
            raise SplitRangeError("legs[1].knob", f"the two legs drive the same knob {a.knob!r}")
        if b.lo < a.hi:
            raise SplitRangeError("legs", f"the ranges overlap: {a.knob} [{a.lo}, {a.hi}] and {b.knob} "
                                          f"[{b.lo}, {b.hi}]; at most one knob may act at a time")
        want = 1.0 if self.law.direction == "direct" else -1.0
        for k, leg in enumerate(self.legs):
            effect = (1.0 if leg.rises else -1.0) * (1.0 if leg.acts == "direct" else -1.0)
            if effect != want:
                moves = "raises" if leg.rises else "lowers"
                acts = "raises" if leg.acts == "direct" else "lowers"
                net = "raises" if effect > 0 else "lowers"
                said = "raise" if want > 0 else "lower"
                raise SplitRangeError(
                    f"legs[{k}]", f"{leg.knob}: raising the output {moves} {leg.knob} (from {leg.at_lo:g} at "
                    f"{leg.lo:g} to {leg.at_hi:g} at {leg.hi:g}), and raising {leg.knob} {acts} the measurement, so "
                    f"this leg {net} the measurement as the output rises; the law's direction "
                    f"{self.law.direction!r} says raising the output must {said} it. Swap the leg's at_lo and "
                    f"at_hi, or fix its acts.")

    def pid_config(self) -> PIDConfig:
        a, b = sorted(self.legs, key=lambda leg: leg.lo)
        return replace(self.law, out_min=a.lo, out_max=b.hi, scale="linear")


@dataclass(frozen=True)
class SplitRangeOutput:
    """One decision of a split-range controller.

    ``values`` holds both knobs' new values (a knob that did not move keeps its current value
    exactly); ``acted`` the knobs that moved; ``law`` the PID's output record on ``u`` (its
    ``value`` is the new ``u``, its state the one to store); ``reason`` the explanation.
    """

    u: float
    values: dict[str, float]
    acted: tuple[str, ...]
    reason: str
    law: PIDOutput = field(repr=False)

    @property
    def state(self) -> PIDState:
        return self.law.state


class SplitRange:
    """A pure split-range law: ``update`` takes the state and the knobs in effect, returns both."""

    def __init__(self, config: SplitRangeConfig) -> None:
        config.validate()
        self.config = config
        self.legs: tuple[Leg, Leg] = tuple(sorted(config.legs, key=lambda leg: leg.lo))  # type: ignore[assignment]
        self._pid = PID(config.pid_config())

    @property
    def knobs(self) -> tuple[str, str]:
        return self.legs[0].knob, self.legs[1].knob

    def values(self, u: float) -> dict[str, float]:
        return {leg.knob: leg.value(u) for leg in self.legs}

    def output_of(self, current: dict[str, float]) -> float:
        """The output ``u`` the knobs in effect correspond to (bumpless start and hand-back).

        Each knob's value gives an interval of ``u``; where they meet, ``u`` is the middle of the
        common part (one point unless the ranges leave a gap). Where they do not (an operator set
        both knobs away from rest), the knob listed first in the config wins: the law starts from
        its position and the next move brings the other knob to rest, through the knob's own rate
        limit where the caller applies one.
        """
        for knob in self.knobs:
            if knob not in current:
                raise ParameterError("current", f"needs the value of {knob!r} in effect")
            require_finite(f"current[{knob!r}]", current[knob])
        lo, hi = self._pid.config.out_min, self._pid.config.out_max
        spans = {leg.knob: leg.outputs(current[leg.knob]) for leg in self.legs}
        a = max(lo, *(s[0] for s in spans.values()))
        b = min(hi, *(s[1] for s in spans.values()))
        if a <= b:
            return (a + b) / 2.0
        first = self.config.legs[0]
        s0, s1 = spans[first.knob]
        return min(max(s0 if math.isfinite(s0) else s1, lo), hi)

    def update(self, measurement: float, dt: float, current: dict[str, float],
               state: PIDState | None = None, *, probe: str = "the measurement") -> SplitRangeOutput:
        u_now = self.output_of(current)
        out = self._pid.update(measurement, dt, u_now, state)
        values = dict(current)
        acted: list[str] = []
        # Every update maps u to both knobs, moved or not: a knob found outside its leg's values
        # (an operator's learning rate above the peak) is brought back at once, as bounds are.
        for leg in self.legs:
            v = leg.value(out.value)
            if not math.isclose(v, current[leg.knob], rel_tol=_SAME_VALUE_RTOL, abs_tol=0.0):
                values[leg.knob] = v
                acted.append(leg.knob)
        previous = None if state is None else state.last_measurement
        return SplitRangeOutput(u=out.value, values={k: values[k] for k in self.knobs}, acted=tuple(acted),
                                reason=self._explain(out, u_now, current, values, acted, probe, previous), law=out)

    def bumpless(self, current: dict[str, float], measurement: float, state: PIDState | None = None) -> PIDState:
        """State for handing control back at the knob values ``current`` (see :meth:`PID.bumpless`)."""
        return self._pid.bumpless(self.output_of(current), measurement, state)

    # -- explanation ---------------------------------------------------------------------------
    def _explain(self, out: PIDOutput, u_now: float, current: dict[str, float], values: dict[str, float],
                 acted: list[str], probe: str, previous: float | None) -> str:
        sp = out.setpoint if out.setpoint is not None else self._pid.config.setpoint
        y = self._pid.config.setpoint - out.error
        where = "above" if y > sp else "below" if y < sp else "at"
        if previous is not None and y != previous:
            where = f"{'rising' if y > previous else 'falling'}, {where}"
        ahead = f" (projected {out.projected:.4g})" if out.projected is not None else ""
        head = f"{probe} {y:.4g}{ahead} {where} setpoint {sp:.4g}: output {u_now:+.3f} -> {out.value:+.3f}"
        if out.limited_by:
            head += f" (limited by {', '.join(out.limited_by)})"
        parts = []
        for leg in self.legs:
            span = f"its range [{leg.lo:g}, {leg.hi:g}] of the output"
            if leg.knob in acted:
                up = values[leg.knob] > current[leg.knob]
                goal = "raise" if up == (leg.acts == "direct") else "lower"
                parts.append(f"{leg.knob} {'raised' if up else 'lowered'} {current[leg.knob]:.4g} -> "
                             f"{values[leg.knob]:.4g} to {goal} {probe} ({span})")
            else:
                parts.append(f"{leg.knob} held at {current[leg.knob]:.4g} ({span} not in use)"
                             if not leg.lo < out.value < leg.hi else f"{leg.knob} held at {current[leg.knob]:.4g}")
        if not acted:
            return f"{head}; no knob moved: " + "; ".join(parts)
        return f"{head}; " + "; ".join(parts)



# -- the law seam (controllers/law.py) -------------------------------------------------------------

class SplitRangeLaw(LawBase):
    """``kind: split_range``: the PID on the output u in [-1, 1] and the legs on the run's knob
    scales, behind the law protocol; ``current`` is both knobs' values in effect. One decision per
    knob that moved, its reason naming the knob that acted and why."""

    def __init__(self, config: SplitRangeConfig, spec: Any) -> None:
        self.law = SplitRange(config)  # validates
        self.config, self.spec = config, spec
        self.setpoint = config.law.setpoint

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        target = spec.setpoint if at.setpoint_override is None else at.setpoint_override
        if target is None:
            raise ParameterError("setpoint", "a split_range controller needs a setpoint")
        setpoint = spec.setpoint_at(target, at.step, at.baseline)
        span = spec.error_span(setpoint, at.baseline)
        return (setpoint, span, *(knobs[name].scale for name in spec.driven()))

    @classmethod
    def build(cls, spec: Any, knobs: Any, inputs: tuple[Any, ...]) -> SplitRangeLaw:
        """Raises ParameterError (SplitRangeError) when it cannot run."""
        setpoint, span = inputs[:2]
        scales = {name: knobs[name].scale for name in spec.driven()}
        return cls(spec.config(pid_config(spec, setpoint, -1.0, 1.0, "linear", spec.max_step, span), scales), spec)

    def load(self, memory: Any) -> Any:
        return memory.pid

    def keep(self, memory: Any, state: Any) -> None:
        memory.pid = state

    def handover(self, state: Any, reading: Reading, current: Any) -> Any:
        return self.law.bumpless(current, reading.value, state)

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        spec = self.spec
        out = self.law.update(reading.value, dt, current, state, probe=spec.probe)
        law = out.law
        return LawOutput(
            value=out.u, changed=bool(out.acted), components={"p": law.p, "i": law.i, "d": law.d, "error": law.error,
                                                              "u": out.u},
            limits=law.limited_by, reason=(f"split_range {spec.name}: {out.reason}", ""), state=out.state,
            moves={name: out.values[name] for name in out.acted},
            inputs={"probe": spec.probe, "raw": reading.raw, "filtered": reading.value, "previous": reading.previous,
                    "setpoint": self.setpoint, "dt": dt, "u": out.u, "unclamped": law.unclamped,
                    "projected": law.projected, "limited_by": list(law.limited_by), "knobs": current,
                    "legs": [{"knob": leg.knob, "range": [leg.lo, leg.hi], "values": [leg.at_lo, leg.at_hi],
                              "acts": leg.acts, "scale": leg.scale} for leg in self.law.legs]})

    @classmethod
    def check(cls, i: int, spec: Any, knobs: Any, build: Any) -> list[dict[str, str]]:
        """Each leg's knob declared by the run, its values inside the knob's bounds, the law
        buildable on the run's knob scales."""
        errors: list[dict[str, str]] = []
        states = {}
        for k, leg in enumerate(spec.legs or ()):
            knob = knobs.get(leg.knob)
            if knob is None:
                errors.append(undeclared(f"controllers.{i}.legs.{k}.knob", spec.name, leg.knob, sorted(knobs)))
                continue
            states[leg.knob] = knob
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
                build(spec, states)
            except ParameterError as exc:
                errors.append({"loc": f"controllers.{i}.{spec.split_range_field(exc.field)}",
                               "msg": f"controller {spec.name!r} on the run's knobs: {exc}"})
        return errors
