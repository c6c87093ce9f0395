"""PID-Lagrangian: a constraint controller whose output is a Lagrange multiplier w >= 0.

"Keep probe y within budget B" (``y <= B`` for an upper bound, ``y >= B`` for a lower one) with
a restoring-force weight as the actuator (a KL-anchor weight, a KL coefficient): the multiplier
rises while the constraint is violated and falls back to 0 once it holds with room to spare.
This is Stooke, Achiam & Abbeel 2020 ("Responsive Safety in RL by PID Lagrangian Methods"),
Algorithm 2, in our controllers' shape (config, serialisable state, ``dt`` as an argument):

    violation   Δ = y − B            (B − y for a lower bound)
    integral    I ← proj[0, I_max](I + ki·Δ·dt)
    derivative  D = kd · max(0, Δ − Δ_prev) / dt      (only a *rising* violation adds weight)
    multiplier  w = clip(kp·Δ + I + D, out_min ≥ 0, out_max), then the per-decision rate limit

Why a law of its own rather than the setpoint PID on ``w``:

* The setpoint PID is in velocity form (its proportional term acts on the change of the error
  since control started, see ``pid.py``), which is right for holding a probe *at* a setpoint but
  wrong for a constraint: a probe rising from 0 towards a budget it never reaches would still be
  charged a weight proportional to its rise. Here the proportional term acts on the violation
  itself, so a constraint that holds costs nothing: w = 0 and, with a KL anchor, no forward pass.
* The integral is projected at 0 (Stooke's ``I ← (I + Δ)+``): slack time is not banked as
  negative integral that would delay the response to a later violation.
* Anti-windup at the top is conditional integration as in the PID: the integral never grows
  past the point where the output is held by ``out_max`` or the rate limit.
* The derivative term only counts a rising violation (Stooke's ``(J − J_prev)+``), which damps
  the overshoot of a lagging plant (Adam's momentum carries drift on for a few steps after the
  weight rises) without releasing the weight early when the probe turns down.
* Prediction (``horizon`` in probe intervals, off at 0), as in the PID: P, I and the deadband act on
  the projected violation ``y + h·(y − y_prev) − B``, so the multiplier rises while the probe is
  still heading for the budget (an integrating plant with Adam's lag crosses it otherwise). A
  ``setpoint_ramp`` is refused: a budget holds from the start.
* First update = bumpless start, as in the PID: the integral is seeded so that the output equals
  the weight in effect (an operator's value after an override). At the floor (w = 0, a fresh
  run) the integral starts at 0, not at the slack, so a constraint that holds keeps w at 0 and a
  run that starts in violation is answered at once.

The config is a :class:`~.pid.PIDConfig` so that every caller that reads bounds, setpoint (the
budget), scale and rate limit treats both laws alike; ``direction`` encodes the bound:
``"reverse"`` = upper bound (raising w lowers the probe), ``"direct"`` = lower bound (raising w
raises the probe, e.g. a gold-answer log-prob floor). The scale must be ``"linear"`` and
``out_min >= 0``: a multiplier is projected at zero.
"""

from __future__ import annotations

import math

from ._checks import ParameterError, finite_term, require_finite, require_positive, saturate
from .limits import limited
from typing import Any

from .law import Reading, fmt, limits_text, trend
from .pid import PIDConfig, PIDOutput, PIDState, SetpointLaw, pid_inputs, projection

__all__ = ["PIDLagrangian", "lagrangian_config"]

_COOLDOWN_TOLERANCE = 1e-9
_SAME_VALUE_RTOL = 1e-12


def lagrangian_config(budget: float, kp: float, ki: float = 0.0, kd: float = 0.0, *, bound: str = "upper",
                      out_min: float = 0.0, out_max: float = math.inf, max_step: float | None = None,
                      deadband: float = 0.0, cooldown: float = 0.0, horizon: float = 0.0) -> PIDConfig:
    """The :class:`PIDConfig` of a constraint ``probe <= budget`` (``bound="upper"``) or ``>=``."""
    if bound not in ("upper", "lower"):
        raise ParameterError("bound", f"must be 'upper' or 'lower', got {bound!r}")
    return PIDConfig(setpoint=budget, kp=kp, ki=ki, kd=kd, out_min=out_min, out_max=out_max, scale="linear",
                     direction="reverse" if bound == "upper" else "direct", max_step=max_step,
                     deadband=deadband, cooldown=cooldown, horizon=horizon)


class PIDLagrangian:
    """A pure PID-Lagrangian law: ``update`` takes the state and returns the next one.

    Same interface as :class:`~.pid.PID` (``config``, ``update``, ``bumpless``) and the same
    output record, so the service's engine, ``simulate`` and the audit trail treat both alike.
    In the output, ``error`` is ``budget − y`` as for the PID; ``p``, ``i`` and ``d`` are the
    multiplier's components (``p`` is negative while the constraint holds).
    """

    def __init__(self, config: PIDConfig) -> None:
        config.validate()
        if config.scale != "linear":
            raise ParameterError("scale", f"a multiplier is linear (projected at 0), got {config.scale!r}")
        if not config.out_min >= 0:
            raise ParameterError("out_min", f"a multiplier is >= 0, got out_min {config.out_min}")
        if config.setpoint_ramp:
            raise ParameterError("setpoint_ramp", "a constraint holds its budget from the start: a setpoint ramp is "
                                                  "a setpoint controller's")
        self.config = config
        # violation = sign * (y - budget): upper bound -> y - B, lower bound -> B - y
        self._sign = 1.0 if config.direction == "reverse" else -1.0

    @property
    def bound(self) -> str:
        return "upper" if self._sign > 0 else "lower"

    def violation(self, measurement: float) -> float:
        """Δ: positive when the constraint is violated, by how much (probe units)."""
        return self._sign * (measurement - self.config.setpoint)

    def _i_max(self) -> float:
        # The integral alone never needs to exceed the largest multiplier.
        return self.config.out_max

    def update(self, measurement: float, dt: float, current: float, state: PIDState | None = None) -> PIDOutput:
        cfg = self.config
        y = require_finite("measurement", measurement)
        dt = require_positive("dt", dt)
        cur = require_finite("current", current)
        st = state if state is not None else PIDState()
        limits: set[str] = set()
        fin = finite_term  # every term saturates at the largest float, as in the PID ("overflow")
        delta = fin(self.violation(y), limits)
        # P, I and the deadband act on the projected violation when a horizon is set (D stays on
        # the measurement's rise): weight arrives while the probe is still heading for the budget.
        y_law = projection(cfg, y, st.last_measurement, cur, dt, limits)
        delta_law = delta if y_law == y else fin(self.violation(y_law), limits)
        p = fin(cfg.kp * delta_law, limits)
        d = 0.0
        if st.last_measurement is not None and cfg.kd:
            rise = fin(delta - fin(self.violation(st.last_measurement), limits), limits)
            d = fin(cfg.kd * max(0.0, rise) / dt, limits)
        since = st.since_change + dt
        first = st.last_output is None
        hold: str | None = None
        if cfg.deadband > 0 and abs(delta_law) <= cfg.deadband:
            hold = "deadband"
        elif since + _COOLDOWN_TOLERANCE * max(1.0, cfg.cooldown) < cfg.cooldown:
            hold = "cooldown"

        if first:
            integral = self._seed(cur, fin(p + d, limits))
            raw = fin(fin(p + integral, limits) + d, limits)
            value = self._limited(raw, cur, limits)
        elif hold is not None:
            integral = st.integral
            raw = fin(fin(p + integral, limits) + d, limits)
            limits.add(hold)
            value = self._bounded(cur, limits)
        else:
            integral, raw = self._integrate(st.integral, p, d, delta_law, dt, cur, limits)
            value = self._limited(fin(fin(p + integral, limits) + d, limits), cur, limits)
        if math.isclose(value, cur, rel_tol=_SAME_VALUE_RTOL, abs_tol=0.0):
            value = cur
        changed = value != cur
        new_state = PIDState(integral=integral, last_measurement=y, last_output=value,
                             since_change=0.0 if changed else since, updates=st.updates + 1)
        order = ("bounds", "rate", "deadband", "cooldown", "overflow")
        return PIDOutput(value=value, changed=changed, error=fin(cfg.setpoint - y, limits), p=p, i=integral, d=d,
                         unclamped=raw, limited_by=tuple(r for r in order if r in limits), state=new_state,
                         projected=y_law if cfg.horizon > 0 else None)

    def takeover(self, current: float) -> PIDState:
        """State for taking over at once at weight ``current`` (see :meth:`PID.takeover`)."""
        cur = require_finite("current", current)
        return PIDState(integral=self._seed(cur, 0.0), last_measurement=None, last_output=cur)

    def bumpless(self, current: float, measurement: float, state: PIDState | None = None) -> PIDState:
        """State for handing control back at weight ``current`` (see :meth:`PID.bumpless`)."""
        y = require_finite("measurement", measurement)
        cur = require_finite("current", current)
        st = state if state is not None else PIDState()
        return PIDState(integral=self._seed(cur, saturate(self.config.kp * saturate(self.violation(y)))),
                        last_measurement=y,
                        last_output=None, since_change=st.since_change, updates=st.updates)

    # -- helpers -------------------------------------------------------------------------------
    def _seed(self, cur: float, pd: float) -> float:
        """The smallest integral that makes the output ``cur``. At the floor that is 0: a slack
        constraint must not bank its slack (which would charge weight before any violation)."""
        if cur <= self.config.out_min:
            return 0.0
        return self._project(saturate(cur - pd))

    def _project(self, integral: float) -> float:
        return min(max(integral, 0.0), self._i_max())

    def _integrate(self, integral: float, p: float, d: float, delta: float, dt: float, cur: float,
                   limits: set[str]) -> tuple[float, float]:
        """Projected integration with conditional anti-windup at the top (as the PID's)."""
        fin = finite_term
        asked = fin(integral + fin(fin(self.config.ki * delta, limits) * dt, limits), limits)
        candidate = self._project(asked)
        raw = fin(fin(p + asked, limits) + d, limits)
        if candidate < asked:
            limits.add("bounds")  # the integral is capped at the largest multiplier
        if candidate <= integral:
            return candidate, raw  # falling (or projected at 0): no limit is in the way
        held: set[str] = set()
        wanted = fin(fin(p + candidate, limits) + d, limits)
        applied = self._limited(wanted, cur, held)
        if applied >= wanted:
            return candidate, raw
        limits.update(held)
        return max(integral, min(candidate, fin(fin(applied - p, limits) - d, limits))), raw

    def _bounded(self, w: float, limits: set[str]) -> float:
        if w > self.config.out_max:
            limits.add("bounds")
            return self.config.out_max
        if w < self.config.out_min:
            # Projection at the floor is the law (a slack constraint), not a limit worth reporting,
            # unless an operator's floor above 0 holds it.
            if self.config.out_min > 0:
                limits.add("bounds")
            return self.config.out_min
        return w

    def _limited(self, u: float, cur: float, limits: set[str]) -> float:
        return limited(u, cur, self.config.max_step, self._bounded, limits)


class ConstraintLaw(SetpointLaw):
    """``kind: constraint``: the PID-Lagrangian on a multiplier knob (linear scale), behind the law
    protocol; its reason line says whether the constraint is active or slack."""

    law_class = PIDLagrangian

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        return (*pid_inputs(spec, knobs[spec.knob], at.step, at.setpoint_override, at.baseline, scale="linear"),
                *(at.model or ()))

    def reason(self, out: PIDOutput, reading: Reading, current: float) -> tuple[str, str]:
        """E.g. ``constraint keep-drift active: kl_drift 0.62 > budget 0.5 and rising: kl_weight 0
        -> 0.24 (levels P +0.12 I +0.12)``: the multiplier is the sum of the terms' levels, so the
        levels are what explains its value (labelled, not to be read as moves)."""
        filtered, budget, upper = reading.value, self.config.setpoint, self.spec.bound == "upper"
        violated = filtered > budget if upper else filtered < budget
        sign = (">" if upper else "<") if violated else ("<=" if upper else ">=")
        terms = " ".join(f"{n.upper()} {getattr(out, n):+.3g}" for n in ("p", "i", "d") if getattr(out, n))
        state = "active" if violated else ("slack, releasing" if out.value < current else "slack")
        return (f"constraint {self.name} {state}: {self.probe} {fmt(filtered)} {sign} budget {fmt(budget)}"
                f"{trend(reading)}", (f" (levels {terms})" if terms else "") + limits_text(out.limited_by))
