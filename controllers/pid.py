"""PID control law for one knob, in the knob's own scale.

Why the pieces are the way they are:

* **Scale.** Learning rate and KL beta act multiplicatively (halving LR matters the same at 1e-4
  as at 1e-5), so for ``scale="log"`` every PID quantity -- the integral, the components, the
  rate limit -- lives in ``ln(knob)``. ``"integer"`` (a compression rank) runs linearly and
  rounds the final value only, so the integral keeps the fractional part and small errors still
  add up to a rank change eventually.
* **Sign.** Gains are magnitudes; ``direction`` carries the sign. ``"direct"`` means raising the
  knob raises the measurement (LR -> drift), so a measurement above setpoint lowers the knob;
  ``"reverse"`` means raising the knob lowers the measurement (beta -> KL).
* **Position form with the integral as bias.** ``output = P + I + D`` in scale units and the
  integral term carries the knob's operating point. That keeps the state to a handful of numbers
  and makes bumpless transfer a one-line re-seed of the integral.
* **Derivative on measurement.** ``D = -sign * kd * d(measurement)/dt``, never on the error, so a
  setpoint change (schedules are common) causes no derivative kick.
* **Anti-windup by conditional integration (clamping form).** An integration step is cut
  where the output would cross the limit that holds it back (bounds or rate limit), and a limit
  never pushes the integral backwards. The integral therefore never accumulates error the knob
  cannot act on, and when the setpoint becomes reachable again the output leaves saturation as
  soon as the error turns, instead of first unwinding a large integral. Deadband and cooldown
  holds do not integrate either: the knob is not following the law during a hold.
* **First update = bumpless start.** A state without ``last_output`` (fresh, or from
  :meth:`PID.bumpless`) seeds the integral so that the output equals the knob value in effect;
  that update changes nothing and the law applies from the next one. Proportional action is
  therefore relative to the first error seen, which is what makes attaching a controller to a
  running job safe. Summed over updates this is the incremental ("velocity") PID of Astrom &
  Hagglund: ``du = kp * d(error) + ki * error * dt``, so P brakes a probe that is *moving*
  towards its setpoint before it gets there -- a direct knob can be cut while the probe is still
  below the setpoint and rising (the engine's reason text says "and rising" and shows each
  term's move). The alternative, seeding the integral with the current value so that P acts on
  the error itself ("bias form"), was tried and measured worse on both simulated plants in
  ``benchmarks/control/plants.py`` after re-tuning its gains on a grid: KL plant settling 34+
  steps and 110%+ overshoot (best gains) against 6-7 steps and <= 8%; drift plant 8-15 steps
  over budget against 0. Training probes start far from the setpoint (drift starts at 0) and
  the plants are lagging or integrating, so the anticipation of the velocity form is what holds
  them.
* **Setpoint weight on the start.** ``setpoint_weight`` (``b``) says how much of the error found at
  the first update P acts on: the start is a setpoint step from the measurement to the setpoint,
  and the law is ``P = kp * (b * r - y)`` on it. ``b = 0`` (the default) is the bumpless start
  above (I-P: the initial error reaches the knob through the integral only); ``b = 1`` puts P on
  the error from the start, the structure the SIMC rules assume (``tau_I = tau`` cancels the plant
  pole only when P sees the setpoint; under I-P that pole stays in the response and the loop
  settles in ~2.5 tau). The kick ``b * kp * error`` goes through the limits like any move, and
  the integral carries the unrealised part, so the velocity form stays bumpless under a rate
  limit. Only a fresh state (no update yet) kicks: a hand-back (:meth:`PID.bumpless`) never does.
  Later setpoint changes act on P in full, whatever ``b``.
* **Order of limits.** bounds -> rate -> bounds again -> integer rounding. Bounds win over the rate
  limit: a knob found outside its bounds (an operator typed a bad value) is brought back at once,
  because bounds are the user's hard statement of what is safe.
* **Prediction for integrating plants** (``horizon``, off at 0). KL under DPO or GRPO integrates
  its knob, and Adam's momentum carries it on for a few steps after the knob is cut: a law that
  acts on where the probe *is* winds up its integral during that lag and overshoots. With
  ``horizon = h`` (in probe intervals, i.e. updates) P, I and the deadband act on the projected
  measurement ``y + h * (y - y_prev)``, the slope taken from the (filtered) measurement over the
  last interval; D stays on the measurement. The integral then stops growing when the probe is
  *heading* for the setpoint, not once it is there. The first update after a fresh start or a
  hand-back has no slope and projects nothing. With a fitted integrating model in the config
  (``model_rate``, ``model_drift``, ``model_u_ref``: ``controllers.identify``'s ``FittedModel``)
  the projection is the model's instead: ``y + h * dt * (drift + rate * (u - u_ref))``, where the
  probe is heading at the knob in effect, from the first update on and without the slope's noise.
* **Setpoint ramp** (``setpoint_ramp``, off at 0). The setpoint in force starts at the
  measurement found at the controller's first update and reaches the target linearly over
  ``setpoint_ramp`` updates (probe intervals), instead of stepping to it: the error the integral
  sees stays small on the way up, so it does not bank the whole initial gap while the plant lags.
  The ramp is the start's setpoint step spread out, so P sees ``setpoint_weight`` of it (none in
  the default bumpless start); a schedule moves the ramp's end, and its changes reach P in full.
* **Every number finite.** Finite inputs can still overflow (a probe of 1e308 minus a setpoint of
  -1e308; ``exp()`` of a log-scale output past 709): each term saturates at the largest finite
  float instead, and ``limited_by`` says ``"overflow"``. The components, the unclamped output and
  the state are therefore always finite, so they can be stored (JSON and Postgres have no
  infinities) and ``inf - inf`` never becomes a NaN knob value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .law import LawBase, LawOutput, Reading, bounds, fmt, limits_text, trend
from .limits import KnobLimits
from .registry import At, undeclared
from ._checks import (
    ParameterError,
    finite_term,
    float_from_json,
    json_float,
    require_finite,
    require_non_negative,
    require_positive,
    saturate,
)

__all__ = ["Scale", "Direction", "LimitReason", "PIDConfig", "PIDState", "PIDOutput", "PID", "projected_measurement",
           "projection"]

Scale = Literal["log", "linear", "integer"]
Direction = Literal["direct", "reverse"]
LimitReason = Literal["bounds", "rate", "deadband", "cooldown", "integer", "overflow"]

_SCALES = ("log", "linear", "integer")
_DIRECTIONS = ("direct", "reverse")
_LIMIT_ORDER: tuple[str, ...] = ("release", "bounds", "rate", "deadband", "cooldown", "integer", "overflow")
# Float noise in dt accumulation (0.1 + 0.2 != 0.3) must not delay a change by one whole decision.
_COOLDOWN_TOLERANCE = 1e-9
# setpoint 1.0, measurement 1.1, deadband 0.1 is "on the edge" to a user, but 1.0 - 1.1 is
# -0.10000000000000009 to a float: the edge must count as inside.
_DEADBAND_TOLERANCE = 1e-12
# A recomputed value this close to the current one is the current one: avoids "changed" decisions
# that only move the last bit of a float after a log/exp round trip.
_SAME_VALUE_RTOL = 1e-12


def projected_measurement(y: float, previous: float | None, horizon: float, limits: set[str]) -> float:
    """``y + horizon * (y - previous)``: where the measurement will be ``horizon`` probe intervals on
    if it keeps the slope of the last one. ``y`` itself without a previous measurement or horizon."""
    if horizon <= 0 or previous is None:
        return y
    slope = finite_term(y - previous, limits)
    return finite_term(y + finite_term(horizon * slope, limits), limits)


def projection(cfg: PIDConfig, y: float, previous: float | None, knob_s: float, dt: float, limits: set[str]) -> float:
    """The measurement a law acts on: ``y`` without a horizon; with one, the slope projection
    (:func:`projected_measurement`) or, when the config carries a fitted integrating model
    (``model_rate``), the model's: ``y + horizon * dt * (model_drift + model_rate * (knob_s -
    model_u_ref))``, where the probe heads at the knob in effect (``knob_s``, scale units)."""
    if cfg.horizon <= 0 or cfg.model_rate is None:
        return projected_measurement(y, previous, cfg.horizon, limits)
    fin = finite_term
    rate = fin(cfg.model_drift + fin(cfg.model_rate * fin(knob_s - cfg.model_u_ref, limits), limits), limits)
    return fin(y + fin(fin(cfg.horizon * dt, limits) * rate, limits), limits)


@dataclass(frozen=True)
class PIDConfig:
    """Everything that defines one controller's law. Immutable: a schedule builds a new one.

    Bounds are in knob units (e.g. learning rate 1e-6 .. 1e-3); ``max_step``, ``integral_limit``
    and the gains work in scale units (log units for ``scale="log"``: ``max_step=0.5`` allows at
    most a factor e**0.5 ~ 1.65 per decision). ``deadband`` is in measurement units (0 disables
    it), ``cooldown`` in the same units as the ``dt`` passed to :meth:`PID.update`.
    ``integral_limit`` bounds ``|integral term|`` around zero; since the integral carries the
    operating point, it must leave room for it (for ``scale="log"``, |ln(knob)| ~ 9 for LR 1e-4).
    ``horizon`` (projection of the measurement) and ``setpoint_ramp`` are in probe intervals
    (updates); 0 turns each off. ``model_rate``/``model_drift``/``model_u_ref`` (probe units per
    scale unit per ``dt`` unit, probe units per ``dt`` unit, scale units: an integrating
    ``FittedModel``'s ``rate``, ``drift`` and ``u_ref``) make the projection the model's instead of
    the slope's. ``release`` (a fraction of ``|setpoint|``, 0: off) makes the knob one-sided: while
    the measurement is past the setpoint by more than that on the side the knob pushes it toward
    (above it for ``direct``), the output is the knob's floor ``out_min``, at once or, with
    ``release_step`` (the run's own rate limit on the knob, scale units), as fast as that allows —
    the controller's ``max_step`` aside —, as TRL's adaptive entropy applies its bonus only at or
    under the target; the integral is
    the law's as without it (the anti-windup holds it at the floor), and once back the knob climbs
    from the floor toward the law's value at the rate limit.
    """

    setpoint: float
    kp: float
    ki: float = 0.0
    kd: float = 0.0
    out_min: float = -math.inf
    out_max: float = math.inf
    scale: Scale = "linear"
    direction: Direction = "direct"
    max_step: float | None = None
    deadband: float = 0.0
    cooldown: float = 0.0
    integral_limit: float | None = None
    setpoint_weight: float = 0.0
    horizon: float = 0.0
    setpoint_ramp: float = 0.0
    model_rate: float | None = None
    model_drift: float = 0.0
    model_u_ref: float = 0.0
    release: float = 0.0
    release_step: float | None = None

    def validate(self) -> None:
        """Raise :class:`ParameterError` (a ``ValueError``) naming the first invalid field."""
        require_finite("setpoint", self.setpoint)
        for name in ("kp", "ki", "kd"):
            # Negative gains would silently invert the loop: the sign belongs to ``direction``.
            require_non_negative(name, getattr(self, name))
        for name in ("out_min", "out_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                raise ParameterError(name, f"must be a number, got {v!r}")
        if self.out_min == math.inf:
            raise ParameterError("out_min", "must not be +inf")
        if self.out_max == -math.inf:
            raise ParameterError("out_max", "must not be -inf")
        if self.out_min > self.out_max:
            raise ParameterError("out_min", f"out_min ({self.out_min}) is greater than out_max ({self.out_max})")
        if self.scale not in _SCALES:
            raise ParameterError("scale", f"must be one of {_SCALES}, got {self.scale!r}")
        if self.direction not in _DIRECTIONS:
            raise ParameterError("direction", f"must be one of {_DIRECTIONS}, got {self.direction!r}")
        if self.scale == "log" and not self.out_min > 0:
            raise ParameterError("out_min", f"a log-scale knob needs out_min > 0, got {self.out_min}")
        if self.scale == "integer" and math.ceil(self.out_min) > math.floor(self.out_max):
            raise ParameterError("out_min", f"no integer lies in [{self.out_min}, {self.out_max}]")
        if self.max_step is not None:
            require_positive("max_step", self.max_step)
        require_non_negative("deadband", self.deadband)
        require_non_negative("cooldown", self.cooldown)
        if self.integral_limit is not None:
            require_non_negative("integral_limit", self.integral_limit)
        b = require_finite("setpoint_weight", self.setpoint_weight)
        if not 0.0 <= b <= 1.0:
            raise ParameterError("setpoint_weight", f"must be in [0, 1], got {b}")
        require_non_negative("horizon", self.horizon)
        require_non_negative("setpoint_ramp", self.setpoint_ramp)
        if self.model_rate is not None:
            require_finite("model_rate", self.model_rate)
        require_finite("model_drift", self.model_drift)
        require_finite("model_u_ref", self.model_u_ref)
        require_non_negative("release", self.release)
        if self.release_step is not None:
            require_positive("release_step", self.release_step)
        if self.release > 0 and self.out_min == -math.inf:
            raise ParameterError("release", "a released knob goes to its floor: the knob needs a finite minimum")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: infinite bounds travel as ``None``."""
        d = asdict(self)
        d["out_min"], d["out_max"] = json_float(self.out_min), json_float(self.out_max)
        return d

    def release_edge(self) -> float:
        """The reading past which the knob lets go: the setpoint ± ``release × |setpoint|``, on the side
        the knob pushes toward (above it for ``direct``)."""
        sign = 1.0 if self.direction == "direct" else -1.0
        return self.setpoint + sign * self.release * abs(self.setpoint)

    def released(self, y: float) -> bool:
        """Whether ``y`` is past :meth:`release_edge` (never with ``release`` 0)."""
        if self.release <= 0:
            return False
        edge = self.release_edge()
        return y > edge if self.direction == "direct" else y < edge

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PIDConfig:
        d = dict(d)
        d["out_min"] = float_from_json(d.get("out_min"), -math.inf)
        d["out_max"] = float_from_json(d.get("out_max"), math.inf)
        return cls(**d)


@dataclass
class PIDState:
    """What a PID remembers between decisions; stored by the service as JSON.

    ``integral`` is the integral *term* in scale units (already multiplied by ``ki``). It carries
    the knob's operating point, so ``output = P + I + D``. ``last_output is None`` marks a state
    that has not produced an output yet (fresh, or just handed back by :meth:`PID.bumpless`): the
    next update then re-seeds the integral so that it outputs the knob value in effect.
    """

    integral: float = 0.0
    last_measurement: float | None = None
    last_output: float | None = None
    since_change: float = math.inf
    updates: int = 0
    #: the setpoint ramp's gap (setpoint − measurement at its first update) and that update's
    #: count; None while no ramp runs
    ramp_gap: float | None = None
    ramp_start: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON dict; ``since_change`` = infinity ("never changed") is written as ``None``.
        The ramp's keys are written only once a ramp has started."""
        d: dict[str, Any] = {
            "integral": self.integral,
            "last_measurement": self.last_measurement,
            "last_output": self.last_output,
            "since_change": json_float(self.since_change),
            "updates": self.updates,
        }
        if self.ramp_gap is not None:
            d["ramp_gap"], d["ramp_start"] = self.ramp_gap, self.ramp_start
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PIDState:
        return cls(
            integral=float(d.get("integral", 0.0)),
            last_measurement=None if d.get("last_measurement") is None else float(d["last_measurement"]),
            last_output=None if d.get("last_output") is None else float(d["last_output"]),
            since_change=float_from_json(d.get("since_change"), math.inf),
            updates=int(d.get("updates", 0)),
            ramp_gap=None if d.get("ramp_gap") is None else float(d["ramp_gap"]),
            ramp_start=int(d.get("ramp_start", 0)),
        )


@dataclass(frozen=True)
class PIDOutput:
    """One decision with everything needed to explain it in the audit trail.

    ``error`` is the raw ``setpoint - measurement`` (never sign-flipped for ``reverse``); the
    direction shows up in ``p``, ``i`` and ``d``, which are the signed contributions in scale units
    so that ``p + i + d`` is the unclamped output in scale units. ``i`` is the integral term after
    this update's integration (equal to ``state.integral``). ``projected`` is the measurement the
    law acted on when ``horizon`` is set, ``setpoint`` the setpoint in force when a ramp is set
    (both ``None`` when off).
    """

    value: float
    changed: bool
    error: float
    p: float
    i: float
    d: float
    unclamped: float
    limited_by: tuple[str, ...]
    state: PIDState = field(repr=False)
    projected: float | None = None
    setpoint: float | None = None


class PID:
    """A pure PID law: ``update`` takes the state and returns the next one, no hidden memory."""

    def __init__(self, config: PIDConfig) -> None:
        config.validate()
        self.config = config
        self._sign = 1.0 if config.direction == "direct" else -1.0
        # The output clamp (bounds, rate limit, integer rounding) is the one every knob value goes
        # through (controllers/limits.py); the law keeps it in scale units for anti-windup.
        self._limits = KnobLimits(config.out_min, config.out_max, config.scale, config.max_step)
        self._to_scale = self._limits.to_scale
        self._from_scale = self._limits.from_scale
        self._bounded = self._limits.bounded
        self._limited = self._limits.limited
        self._to_knob = self._limits.to_knob
        self._round = self._limits.round

    _finite = staticmethod(finite_term)

    # -- law -----------------------------------------------------------------------------------

    def update(self, measurement: float, dt: float, current: float, state: PIDState | None = None) -> PIDOutput:
        """One decision: new knob value from the (filtered) measurement.

        ``current`` is the knob value in effect now (knob units); it anchors the rate limit and
        holds, and seeds the integral on a first update (bumpless start: that update outputs
        ``current`` and only later updates follow the law). ``dt`` is the time since the previous
        update in the caller's unit (optimizer steps in the service); gains are per that unit.
        """
        cfg = self.config
        y = require_finite("measurement", measurement)
        dt = require_positive("dt", dt)
        cur = require_finite("current", current)
        if cfg.scale == "log" and cur <= 0:
            raise ParameterError("current", f"a log-scale knob must be > 0, got {cur}")
        st = state if state is not None else PIDState()
        cur_s = self._to_scale(cur)

        limits: set[str] = set()
        fin = self._finite
        error = fin(cfg.setpoint - y, limits)
        # What the law acts on: the projected measurement against the setpoint in force (both
        # exactly the measurement and the setpoint when prediction and ramp are off).
        y_law = projection(cfg, y, st.last_measurement, cur_s, dt, limits)
        r, p_off, ramp_gap, ramp_start = self._setpoint_in_force(y, st, limits)
        e_law = error if (y_law == y and r == cfg.setpoint) else fin(r - y_law, limits)
        p = fin(self._sign * cfg.kp * (e_law if p_off == 0.0 else fin(e_law - p_off, limits)), limits)
        d = 0.0 if st.last_measurement is None else fin(
            -self._sign * cfg.kd * (fin(y - st.last_measurement, limits) / dt), limits)
        since = st.since_change + dt
        first = st.last_output is None
        hold: str | None = None
        if cfg.deadband > 0 and abs(e_law) <= cfg.deadband + _DEADBAND_TOLERANCE * max(abs(r), abs(y_law), 1.0):
            hold = "deadband"
        elif since + _COOLDOWN_TOLERANCE * max(1.0, cfg.cooldown) < cfg.cooldown:
            hold = "cooldown"

        if first:
            # Bumpless start: whatever the error, the first output is the knob value in effect,
            # plus, on a fresh state, the setpoint weight's share of P on the initial error.
            kick = cfg.setpoint_weight * p if st.updates == 0 else 0.0
            seed = fin(fin(cur_s - (p - kick), limits) - d, limits)
            integral = self._clamp_integral(seed)
            raw = self._sum(p, integral, d, limits)
        else:
            integral = st.integral
            raw = self._sum(p, integral, d, limits)
            if hold is None:
                integral, raw = self._integrate(integral, p, d, e_law, dt, cur_s, limits)

        u = self._sum(p, integral, d, limits)
        if first:
            # u is cur_s up to float noise (far from it when huge terms swallow cur_s), unless
            # integral_limit cut the seed short.
            value_s = self._limited(cur_s if integral == seed and kick == 0.0 else u, cur_s, limits)
        elif hold is not None:
            limits.add(hold)
            value_s = self._bounded(cur_s, limits)
        else:
            value_s = self._limited(u, cur_s, limits)
        if cfg.released(y_law):  # one-sided: past the setpoint the knob pushes away from, it lets go at once
            limits.add("release")
            floor = self._limits.lo
            value_s = floor if cfg.release_step is None else max(floor, cur_s - cfg.release_step)
        value = self._to_knob(value_s, cur_s, cur)
        if cfg.scale == "integer":
            value = self._round(value, cur, limits)
        if math.isclose(value, cur, rel_tol=_SAME_VALUE_RTOL, abs_tol=0.0):
            value = cur
        changed = value != cur

        new_state = PIDState(
            integral=integral,
            last_measurement=y,
            last_output=value,
            since_change=0.0 if changed else since,
            updates=st.updates + 1,
            ramp_gap=ramp_gap,
            ramp_start=ramp_start,
        )
        unclamped = fin(self._from_scale(raw), limits)  # exp() of a log-scale output may overflow
        return PIDOutput(
            value=value,
            changed=changed,
            error=error,
            p=p,
            i=integral,
            d=d,
            unclamped=unclamped,
            limited_by=tuple(reason for reason in _LIMIT_ORDER if reason in limits),
            state=new_state,
            projected=y_law if cfg.horizon > 0 else None,
            setpoint=r if cfg.setpoint_ramp > 0 else None,
        )

    def takeover(self, current: float) -> PIDState:
        """State for taking over at once from a knob held open loop at ``current`` while the probe
        ran past its setpoint (a ``gains: auto`` step test ended early): the integral holds the
        value in effect, so the next update outputs it plus P and I's step on the error, within the
        rate limit, where a bumpless start would output it unchanged and act one reading later."""
        cur = require_finite("current", current)
        if self.config.scale == "log" and cur <= 0:
            raise ParameterError("current", f"a log-scale knob must be > 0, got {cur}")
        return PIDState(integral=self._clamp_integral(self._to_scale(cur)), last_measurement=None, last_output=cur)

    def bumpless(self, current: float, measurement: float, state: PIDState | None = None) -> PIDState:
        """State for handing control back after a manual override at knob value ``current``.

        The integral absorbs the gap so that the next update with the same measurement outputs
        ``current`` exactly; ``last_measurement = measurement`` so there is no derivative kick.
        ``last_output`` is cleared, which makes the next update re-seed the integral from the knob
        value actually in effect then -- robust to the override being changed once more before
        the next observation. The cooldown clock and update count carry over.
        """
        y = require_finite("measurement", measurement)
        cur = require_finite("current", current)
        if self.config.scale == "log" and cur <= 0:
            raise ParameterError("current", f"a log-scale knob must be > 0, got {cur}")
        st = state if state is not None else PIDState()
        p = saturate(self._sign * self.config.kp * saturate(self.config.setpoint - y))
        return PIDState(
            integral=self._clamp_integral(saturate(self._to_scale(cur) - p)),
            last_measurement=y,
            last_output=None,
            since_change=st.since_change,
            updates=st.updates,
            ramp_gap=st.ramp_gap,
            ramp_start=st.ramp_start,
        )

    # -- helpers -------------------------------------------------------------------------------

    def _setpoint_in_force(self, y: float, st: PIDState, limits: set[str]) -> tuple[float, float, float | None, int]:
        """The setpoint the law holds at this update, P's share of the ramp, and the ramp's state.

        Without a ramp: the setpoint, 0, no state. With one: the gap ``G`` = setpoint − measurement
        at the ramp's first update closes linearly over ``setpoint_ramp`` updates, ``r = setpoint −
        (1 − share)·G`` (a ramp switched on mid-run starts at that update). The ramp is the start's
        setpoint step spread out, so P sees ``setpoint_weight`` of it, as it sees that share of the
        step (the rest, ``(1 − b)·share·G``, is returned to be taken off P's error); a schedule's
        change of the setpoint passes through in full.
        """
        cfg = self.config
        if cfg.setpoint_ramp <= 0:
            return cfg.setpoint, 0.0, None, 0
        fin = self._finite
        gap, at = (st.ramp_gap, st.ramp_start) if st.ramp_gap is not None else (fin(cfg.setpoint - y, limits), st.updates)
        share = min(1.0, (st.updates - at) / cfg.setpoint_ramp)
        r = cfg.setpoint if share >= 1.0 else fin(cfg.setpoint - fin((1.0 - share) * gap, limits), limits)
        return r, fin((1.0 - cfg.setpoint_weight) * share * gap, limits), gap, at

    def _sum(self, p: float, i: float, d: float, limits: set[str]) -> float:
        """``p + i + d`` in scale units, finite."""
        return self._finite(self._finite(p + i, limits) + d, limits)

    def _clamp_integral(self, integral: float) -> float:
        lim = self.config.integral_limit
        if lim is None:
            return integral
        return min(max(integral, -lim), lim)

    def _integrate(
        self, integral: float, p: float, d: float, error: float, dt: float, cur_s: float, limits: set[str]
    ) -> tuple[float, float]:
        """Conditional integration, clamping form. Returns the new integral and the raw output.

        Integrate at most up to the point where the output reaches the limit (bounds or rate)
        that holds it back, and never move the integral backwards because of a limit. So a
        saturated loop stops accumulating error it cannot act on, a pure-I loop still slews at
        the rate limit, and a noise spike in P at saturation does not drag the integral down.
        The limit that cut the integration is reported in ``limits`` even though the output
        then lands exactly on it: the audit trail must show the knob was held back.
        """
        step = self._finite(self._finite(self._sign * self.config.ki * error, limits) * dt, limits)
        candidate = self._clamp_integral(self._finite(integral + step, limits))
        raw = self._sum(p, candidate, d, limits)
        if step == 0.0:
            return candidate, raw
        held_by: set[str] = set()
        applied = self._limited(raw, cur_s, held_by)
        if (raw - applied) * step <= 0:
            return candidate, raw  # the limit is not in the way of this step
        limits.update(held_by)
        at_limit = self._finite(self._finite(applied - p, limits) - d, limits)
        if step > 0:
            return max(integral, min(candidate, at_limit)), raw
        return min(integral, max(candidate, at_limit)), raw


# -- the law seam (controllers/law.py): a setpoint controller's law --------------------------------

def pid_inputs(spec: Any, knob: Any, step: int, setpoint_override: Any, baseline: float | None,
               scale: str | None = None) -> tuple[float, Any, Any, Any, Any, float]:
    """What a controller's PIDConfig takes from the run: setpoint, bounds, scale, max_step, and the
    span its gains divide the error by (``gains: relative``; 1.0 for absolute gains). ``spec`` is
    the controller's document, ``knob`` the run's knob (``min``, ``max``, ``scale``, ``max_step``)."""
    lo, hi = bounds(spec, knob)
    target = spec.setpoint if setpoint_override is None else setpoint_override
    setpoint = math.nan if target is None else spec.setpoint_at(target, step, baseline)
    scale = scale or spec.scale or knob.scale
    max_step = spec.max_step if spec.max_step is not None else knob.max_step
    span = 1.0 if target is None else spec.error_span(setpoint, baseline)
    return setpoint, lo, hi, scale, max_step, span


def pid_config(spec: Any, setpoint: float, lo: Any, hi: Any, scale: Any, max_step: Any, span: float = 1.0,
               model: Any = None, knob_step: float | None = None) -> PIDConfig:
    """The PIDConfig of a controller's document on these inputs: relative gains (span != 1) act on
    the error divided by the span, the same law in probe units; ``model``: an integrating fit's
    (rate, drift, u_ref), the projection when a horizon is set; ``knob_step``: the run's own rate
    limit on the knob, which a release (``release``) keeps to."""
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
        release=getattr(spec, "release", 0.0) or 0.0,
        release_step=knob_step,
    )


def law_notes(out: PIDOutput) -> dict[str, float]:
    """The numbers a PID law acted on besides the reading and the setpoint, where it has them:
    ``setpoint_in_force`` (on a setpoint ramp) and ``projected`` (with a horizon)."""
    law = {"setpoint_in_force": out.setpoint, "projected": out.projected}
    return {k: float(v) for k, v in law.items() if v is not None}


def _acted_on(out: PIDOutput, setpoint: float, filtered: float, ramp: float) -> str:
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
    what = f"projected {fmt(y)}" if projected is not None else f"{fmt(y)}"
    where = f"setpoint {fmt(r)}"
    if ramped is not None:
        done = out.state.updates - 1 - out.state.ramp_start
        where = f"ramped setpoint {fmt(r)} (ramp {done:g} of {ramp:g} probe intervals toward {fmt(setpoint)})"
    side = "above it" if y > r else "below it" if y < r else "at it"
    return f"; the law acted on {what} against {where}, {side}"


class SetpointLaw(LawBase):
    """``kind: setpoint``: the PID on one knob, behind the law protocol. Its state is the
    controller's ``pid`` memory; the value in effect is clamped into its bounds (rounded on an
    integer scale); control handed back restarts bumplessly from the value in effect."""

    identifies = True
    law_class: Any = PID

    def __init__(self, config: PIDConfig, spec: Any) -> None:
        self.law = self.law_class(config)  # validates: an invalid law is never kept
        self.config, self.spec = config, spec
        self.setpoint = config.setpoint
        self.probe, self.knob, self.name = spec.probe, spec.knob, spec.name

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        return (*pid_inputs(spec, knobs[spec.knob], at.step, at.setpoint_override, at.baseline),
                *(at.model or ()))

    @classmethod
    def build(cls, spec: Any, knobs: Any, inputs: tuple[Any, ...]) -> SetpointLaw:
        setpoint, lo, hi, scale, max_step, span = inputs[:6]
        knob = knobs.get(spec.knob) if spec.knob is not None else None
        same_scale = knob is not None and getattr(knob, "scale", None) == scale  # the run's limit in the law's units
        return cls(pid_config(spec, setpoint, lo, hi, scale, max_step, span, model=inputs[6:] or None,
                              knob_step=getattr(knob, "max_step", None) if same_scale else max_step), spec)

    def load(self, memory: Any) -> Any:
        return memory.pid

    def keep(self, memory: Any, state: Any) -> None:
        memory.pid = state

    def in_effect(self, knob: str, value: float) -> float:
        cfg = self.config
        value = min(max(value, cfg.out_min), cfg.out_max)
        return float(round(value)) if cfg.scale == "integer" else value

    def handover(self, state: Any, reading: Reading, current: Any) -> Any:
        return self.law.bumpless(current, reading.value, state)

    def takeover(self, current: float) -> PIDState:
        return self.law.takeover(current)

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        out = self.law.update(reading.value, dt, current, state)
        cfg, notes = self.config, law_notes(out)
        return LawOutput(
            value=out.value, changed=out.changed, components={"p": out.p, "i": out.i, "d": out.d, "error": out.error},
            limits=out.limited_by, reason=self.reason(out, reading, current), state=out.state, notes=notes,
            inputs={"probe": self.probe, "raw": reading.raw, "filtered": reading.value, "setpoint": cfg.setpoint,
                    **notes, "dt": dt, "unclamped": out.unclamped, "limited_by": list(out.limited_by),
                    "bounds": [cfg.out_min, cfg.out_max], "max_step": cfg.max_step, "scale": cfg.scale})

    def reason(self, out: PIDOutput, reading: Reading, current: float) -> tuple[str, str]:
        """Where the probe is, where it is heading, what moved the knob.

        The PID's proportional term acts on the change of the error since control started, so a
        rising probe can cut a direct knob while still below its setpoint; the trend and the
        per-term move say so instead of leaving "below setpoint" beside a cut. The terms are this
        decision's moves (ΔP, ΔI, ΔD: each term's change since the previous update), not the
        terms' levels, which the decision's components keep."""
        filtered, setpoint = reading.value, self.config.setpoint
        side = "above" if filtered > setpoint else "below" if filtered < setpoint else "at"
        terms = ""
        if reading.last:
            moves = [(n, getattr(out, n) - float(reading.last.get(n, 0.0))) for n in ("p", "i", "d")]
            terms = ", " + " ".join(f"Δ{n.upper()} {m:+.3g}" for n, m in moves if abs(m) > 1e-12)
        acted = _acted_on(out, setpoint, filtered, self.config.setpoint_ramp)
        return (f"{self.probe} {fmt(filtered)} {side} setpoint {fmt(setpoint)}{trend(reading)}{acted}",
                f"{terms}{limits_text(out.limited_by)}{self._released(out, filtered)}")

    def _released(self, out: PIDOutput, filtered: float) -> str:
        """The release's numbers, when it acted: the reading it compared and the edge it passed."""
        if "release" not in out.limited_by:
            return ""
        cfg = self.config
        sign, edge = (1.0 if cfg.direction == "direct" else -1.0), cfg.release_edge()
        y = out.projected if out.projected is not None else filtered
        what = f"projected {fmt(y)}" if out.projected is not None and out.projected != filtered else fmt(y)
        to = f"to its floor {fmt(cfg.out_min)}" if out.value <= cfg.out_min else \
            f"toward its floor {fmt(cfg.out_min)} at the run's rate limit on it ({fmt(cfg.release_step or 0.0)})"
        return (f" (released: {what} is {'over' if sign > 0 else 'under'} {fmt(edge)}, the setpoint "
                f"{'+' if sign > 0 else '−'}{cfg.release:.0%}: {self.knob} {to})")

    @classmethod
    def check(cls, i: int, spec: Any, knobs: Any, build: Any) -> list[dict[str, str]]:
        """Why this controller cannot drive the run's knobs (``knobs``: name -> the run's knob),
        with the document's field to change; the law is built and validated as at an observation."""
        knob = knobs.get(spec.knob)
        if knob is None:
            return [undeclared(f"controllers.{i}.knob", spec.name, spec.knob, sorted(knobs))]
        cfg = pid_config(spec, *cls.inputs(spec, knobs, At(0, None, 1.0))[:6])
        try:
            cls.law_class(cfg)  # validates, as at every observation
        except ParameterError as exc:
            field = {"out_min": "min", "out_max": "max"}.get(exc.field, exc.field)
            where = f"knob {spec.knob!r} [{knob.min}, {knob.max}]"
            if cfg.out_min > cfg.out_max:
                field = "min" if spec.min is not None else "max"
                msg = f"controller {spec.name!r}: its bounds [{spec.min}, {spec.max}] do not overlap {where}"
            else:
                if field in ("min", "max") and spec.scale is not None:
                    field = "scale"  # the scale the controller chose does not fit the bounds
                msg = f"controller {spec.name!r} on {where} with scale {cfg.scale!r}: {exc}"
            return [{"loc": f"controllers.{i}.{field}", "msg": msg}]
        return []
