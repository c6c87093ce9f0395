"""Extremum seeking: a law that *maximises* a probe when there is no setpoint to hold.

"Make draft acceptance as high as it goes" has no target value, so a PID has no error to act on.
Extremum seeking (Krstić & Wang 2000; Ariyur & Krstić 2003) finds the knob value where the
probe peaks by perturbing the knob and correlating the probe's response with the perturbation.
In discrete time, one update per observation, in the knob's scale:

    objective   J_k = y_k − cost_weight · c_k               (c: an optional cost probe)
    dither      the knob is applied at  u_k = θ_k + a·s_k,  s_k = −s_{k−1} ∈ {+1, −1}
    high-pass   h_k = J_k − 2·J_{k−1} + J_{k−2}             (second difference)
    demodulate  ξ_k = h_k · s_{k−1} / (4a)                   (≈ dJ/du at θ)
    low-pass    g_k = (1 − β)·g_{k−1} + β·ξ_k
    step        θ_{k+1} = θ_k + clip(gain · g_k, ±max_step), kept in [min + a, max − a]

Why these choices:

* **Square-wave dither of period two decisions.** A training run allows tens of decisions, not the
  hundreds a sinusoidal dither needs per period. Alternating ±a is the fastest dither there is,
  and the probe J_k answers the value applied since the previous observation, u_{k−1}, which is
  what the demodulation multiplies by (s_{k−1}).
* **Second-difference high-pass.** A training probe drifts (acceptance rises as the draft learns)
  by far more per decision than the dither moves it. A first difference leaves that trend in the
  estimate at full size (alternating in sign, so only the low-pass would average it away); the
  second difference removes any trend that is linear over three observations exactly, and for
  an alternating dither it keeps the whole signal: s_{k−1} − 2 s_{k−2} + s_{k−3} = 4 s_{k−1}.
* **Bounded step.** The gradient estimate is noisy and its scale (probe units per knob unit) is
  rarely known in advance: ``max_step`` bounds the move per decision whatever the estimate says,
  so a large gain turns the law into a sign-of-gradient search at a known pace.
* **Centre kept a dither inside the bounds**, so the perturbation is never clipped (a clipped
  dither would be read as a gradient that is not there). The knob still reaches each bound.
* **Cost.** ``cost_weight · c`` turns "maximise α" into "maximise α minus what it costs", e.g.
  seconds per step when a knob trades acceptance for generation time.

First update: the centre starts at the knob value in effect (moved inside [min + a, max − a]) and
the dither starts; the gradient estimate needs three objectives measured under the dither, so the
centre first moves at the fourth update. A state without a centre (fresh, or :meth:`ExtremumSeeking.restart`) starts over.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .law import LawBase, LawOutput, Reading, bounds, fmt, limits_text, trend
from ._checks import ParameterError, finite_term, require_finite, require_non_negative, require_positive

__all__ = ["ExtremumConfig", "ExtremumState", "ExtremumOutput", "ExtremumSeeking"]

ExtremumScale = Literal["linear", "log"]
_SAME_VALUE_RTOL = 1e-12


@dataclass(frozen=True)
class ExtremumConfig:
    """Everything that defines one extremum-seeking law.

    ``dither`` (the amplitude a), ``max_step`` and the centre live in scale units (log units for
    ``scale="log"``); bounds are in knob units. ``gain`` is scale units of centre move per unit of
    estimated dJ/du (probe units per scale unit). ``smoothing`` is β, the weight of the newest
    demodulated sample in the gradient estimate (1: no low-pass). ``cost_weight`` ≥ 0 multiplies
    the cost passed to :meth:`ExtremumSeeking.update`.
    """

    dither: float
    gain: float
    out_min: float
    out_max: float
    max_step: float | None = None
    smoothing: float = 0.5
    scale: ExtremumScale = "linear"
    cost_weight: float = 0.0

    def validate(self) -> None:
        """Raise :class:`ParameterError` naming the first invalid field."""
        require_positive("dither", self.dither)
        require_non_negative("gain", self.gain)
        require_finite("out_min", self.out_min)
        require_finite("out_max", self.out_max)
        if self.scale not in ("linear", "log"):
            raise ParameterError("scale", f"must be 'linear' or 'log', got {self.scale!r}")
        if self.out_min >= self.out_max:
            raise ParameterError("out_min", f"out_min ({self.out_min}) must be below out_max ({self.out_max}): "
                                            "a maximiser needs a range to search")
        if self.scale == "log" and not self.out_min > 0:
            raise ParameterError("out_min", f"a log-scale knob needs out_min > 0, got {self.out_min}")
        if self.max_step is not None:
            require_positive("max_step", self.max_step)
        s = require_finite("smoothing", self.smoothing)
        if not 0 < s <= 1:
            raise ParameterError("smoothing", f"must be in (0, 1], got {s}")
        require_non_negative("cost_weight", self.cost_weight)
        lo, hi = self._scaled_bounds()
        if 2 * self.dither >= hi - lo:
            raise ParameterError("dither", f"the dither ({self.dither}) must be less than half the knob's range in "
                                           f"scale units ({(hi - lo) / 2:.6g}): the perturbation has to fit")

    def _scaled_bounds(self) -> tuple[float, float]:
        if self.scale == "log":
            return math.log(self.out_min), math.log(self.out_max)
        return float(self.out_min), float(self.out_max)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtremumConfig:
        return cls(**d)


@dataclass
class ExtremumState:
    """What the law remembers between decisions; stored by the service as JSON.

    ``centre`` is θ in scale units (None: not started); ``sign`` the dither sign of the value
    applied now (s_{k−1} at the next update); ``objectives`` the last two objectives [J_{k−2},
    J_{k−1}] seen while the dither alternated; ``gradient`` the low-passed estimate g.
    """

    centre: float | None = None
    sign: int = 0
    objectives: list[float] = field(default_factory=list)
    gradient: float = 0.0
    estimates: int = 0
    updates: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"centre": self.centre, "sign": self.sign, "objectives": list(self.objectives),
                "gradient": self.gradient, "estimates": self.estimates, "updates": self.updates}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ExtremumState:
        centre = d.get("centre")
        return cls(centre=None if centre is None else float(centre), sign=int(d.get("sign", 0)),
                   objectives=[float(x) for x in d.get("objectives", [])][-2:],
                   gradient=float(d.get("gradient", 0.0)), estimates=int(d.get("estimates", 0)),
                   updates=int(d.get("updates", 0)))


@dataclass(frozen=True)
class ExtremumOutput:
    """One decision and its explanation: the objective, the high-passed and demodulated samples
    (None until three objectives exist), the gradient estimate, the centre's move (``step``,
    scale units) and the dither applied around the new centre (scale units, signed)."""

    value: float
    changed: bool
    objective: float
    highpass: float | None
    demodulated: float | None
    gradient: float
    centre: float
    step: float
    dither: float
    limited_by: tuple[str, ...]
    state: ExtremumState = field(repr=False)


class ExtremumSeeking:
    """A pure extremum-seeking law: ``update`` takes the state and returns the next one."""

    def __init__(self, config: ExtremumConfig) -> None:
        config.validate()
        self.config = config
        self._lo, self._hi = config._scaled_bounds()

    def to_scale(self, x: float) -> float:
        return math.log(x) if self.config.scale == "log" else x

    def from_scale(self, s: float) -> float:
        if self.config.scale == "log":
            return min(max(math.exp(s), self.config.out_min), self.config.out_max)
        return min(max(s, self.config.out_min), self.config.out_max)

    def _inside(self, centre: float, limits: set[str]) -> float:
        a = self.config.dither
        lo, hi = self._lo + a, self._hi - a
        if centre < lo:
            limits.add("bounds")
            return lo
        if centre > hi:
            limits.add("bounds")
            return hi
        return centre

    def update(self, measurement: float, dt: float, current: float, state: ExtremumState | None = None,
               cost: float | None = None) -> ExtremumOutput:
        """One decision from the (filtered) probe ``measurement`` and, when the config weighs a
        cost, the ``cost`` value observed with it. ``current`` is the knob value in effect (knob
        units); it seeds the centre of a state that has none. ``dt`` is checked but the dither
        advances one half-period per update, whatever the time between them."""
        cfg = self.config
        y = require_finite("measurement", measurement)
        require_positive("dt", dt)
        cur = require_finite("current", current)
        if cfg.scale == "log" and cur <= 0:
            raise ParameterError("current", f"a log-scale knob must be > 0, got {cur}")
        if cfg.cost_weight:
            if cost is None:
                raise ParameterError("cost", "the config weighs a cost (cost_weight > 0) but none was given")
            c = require_finite("cost", cost)
        else:
            c = 0.0
        st = state if state is not None else ExtremumState()
        limits: set[str] = set()
        fin = finite_term
        objective = fin(y - fin(cfg.cost_weight * c, limits), limits)
        highpass = demod = None
        gradient = st.gradient
        step = 0.0
        if st.centre is None or st.sign == 0:
            centre = self._inside(self.to_scale(min(max(cur, cfg.out_min), cfg.out_max)), set())
            objectives = []  # measured before any dither: no use to the estimate
            sign = 1
            estimates = 0
            gradient = 0.0
        else:
            centre = st.centre
            estimates = st.estimates
            if len(st.objectives) >= 2:
                j2, j1 = st.objectives[-2], st.objectives[-1]
                highpass = fin(fin(objective - fin(2.0 * j1, limits), limits) + j2, limits)
                demod = fin(highpass * st.sign / (4.0 * cfg.dither), limits)
                gradient = fin((1.0 - cfg.smoothing) * st.gradient + cfg.smoothing * demod, limits)
                estimates += 1
                step = fin(cfg.gain * gradient, limits)
                if cfg.max_step is not None and abs(step) > cfg.max_step:
                    step = math.copysign(cfg.max_step, step)
                    limits.add("rate")
                moved = self._inside(fin(centre + step, limits), limits)
                step, centre = moved - centre, moved
            objectives = [*st.objectives, objective][-2:]
            sign = -st.sign
        value = self.from_scale(centre + sign * cfg.dither)
        if math.isclose(value, cur, rel_tol=_SAME_VALUE_RTOL, abs_tol=0.0):
            value = cur
        new_state = ExtremumState(centre=centre, sign=sign, objectives=objectives, gradient=gradient,
                                  estimates=estimates, updates=st.updates + 1)
        order = ("bounds", "rate", "overflow")
        return ExtremumOutput(value=value, changed=value != cur, objective=objective, highpass=highpass,
                              demodulated=demod, gradient=gradient, centre=self.from_scale(centre), step=step,
                              dither=sign * cfg.dither, limited_by=tuple(r for r in order if r in limits),
                              state=new_state)

    def restart(self, state: ExtremumState | None = None) -> ExtremumState:
        """State for handing control back (an override released, a run resumed): the next update
        starts a new centre at the value then in effect and a new gradient estimate; the update
        count carries over."""
        return ExtremumState(updates=0 if state is None else state.updates)


# -- the law seam (controllers/law.py) -------------------------------------------------------------

class MaximizeLaw(LawBase):
    """``kind: maximize``: extremum seeking behind the law protocol. Its state is the controller's
    ``law`` memory (:class:`ExtremumState`); an override, another controller's move or control
    handed back starts a new search around the value in effect (a stale gradient estimate would be
    wrong there); it waits for an observation that carries its cost probe, when it weighs one."""

    State = ExtremumState
    no_setpoint = "{name!r} maximizes {probe}; it has no setpoint to change"

    def __init__(self, config: ExtremumConfig, spec: Any) -> None:
        self.law = ExtremumSeeking(config)  # validates
        self.config, self.spec = config, spec

    @staticmethod
    def extremum_config(spec: Any, knob: Any) -> ExtremumConfig:
        """The extremum-seeking law of a ``kind: maximize`` controller on this run's knob: bounds
        and scale as for a PID; the centre's step is ``max_step``, or one dither by default."""
        lo, hi = bounds(spec, knob)
        scale = spec.scale or knob.scale
        dither = float(spec.dither) if spec.dither is not None else 0.0
        return ExtremumConfig(dither=dither, gain=spec.gain if spec.gain is not None else 0.0, out_min=lo,
                              out_max=hi, max_step=spec.max_step if spec.max_step is not None else dither,
                              smoothing=spec.smoothing, scale=scale, cost_weight=spec.cost_weight)

    @classmethod
    def inputs(cls, spec: Any, knobs: Any, at: Any) -> tuple[Any, ...]:
        knob = knobs[spec.knob]
        cfg = cls.extremum_config(spec, knob)
        return (cfg.out_min, cfg.out_max, cfg.scale, knob.max_step)

    @classmethod
    def build(cls, spec: Any, knobs: Any, inputs: tuple[Any, ...]) -> MaximizeLaw:
        """Raises ParameterError when it cannot run on this knob, including a dither whose flip
        (2a per decision) the knob's own rate limit would cut."""
        knob = knobs[spec.knob]
        cfg = cls.extremum_config(spec, knob)
        move = 2 * cfg.dither + (cfg.max_step or 0.0)
        if knob.max_step is not None and move > knob.max_step * (1 + 1e-9):
            raise ParameterError("dither", f"a decision moves the knob by up to 2 x dither + max_step = {move:g} "
                                           f"(the dither flips, the centre steps), more than the knob's max_step "
                                           f"{knob.max_step:g}, which would cut the dither")
        return cls(cfg, spec)

    @classmethod
    def ready(cls, spec: Any, values: Any) -> bool:
        if spec.cost is None:
            return True
        cost = values.get(spec.cost)
        return cost is not None and math.isfinite(cost)

    def in_effect(self, knob: str, value: float) -> float:
        return min(max(value, self.config.out_min), self.config.out_max)

    def handover(self, state: Any, reading: Reading, current: Any) -> Any:
        return self.law.restart(state)

    def update(self, state: Any, reading: Reading, dt: float, current: Any) -> LawOutput:
        spec, cfg = self.spec, self.config
        cost = None if spec.cost is None else reading.values.get(spec.cost)
        out = self.law.update(reading.value, dt, current, state, cost=cost)
        components = {"objective": out.objective, "gradient": out.gradient, "step": out.step,
                      "dither": out.dither, "centre": out.centre}
        return LawOutput(
            value=out.value, changed=out.changed, components=components, limits=out.limited_by,
            reason=(self.reason(out, reading, cost), ""), state=out.state,
            inputs={"probe": spec.probe, "raw": reading.raw, "filtered": reading.value, "cost": cost,
                    "cost_probe": spec.cost, "highpass": out.highpass, "demodulated": out.demodulated,
                    "estimates": out.state.estimates, "dt": dt, "limited_by": list(out.limited_by),
                    "bounds": [cfg.out_min, cfg.out_max], "max_step": cfg.max_step, "dither": cfg.dither,
                    "gain": cfg.gain, "scale": cfg.scale})

    def reason(self, out: ExtremumOutput, reading: Reading, cost: float | None) -> str:
        """What it measured, what it estimates, how the centre moved, e.g. ``maximize max-acceptance:
        draft.acceptance 0.2612 and rising, d/d(onpolicy_fraction) ≈ +0.031 (4 estimates): centre
        0.5 -> 0.6 (+0.1, limited by rate), dither -0.15``."""
        spec = self.spec
        objective = "" if cost is None else f" (objective {fmt(out.objective)} after cost {spec.cost} {fmt(cost)})"
        if out.demodulated is None:
            estimate = f"estimating the gradient (needs 3 dithered readings, has {len(out.state.objectives)})"
        else:
            estimate = f"d/d({spec.knob}) ≈ {out.gradient:+.3g} ({out.state.estimates} estimates)"
        start = out.state.estimates == 0 and out.step == 0
        move = (f"centre {fmt(out.centre)}" if start else
                f"centre -> {fmt(out.centre)} ({out.step:+.3g}{limits_text(out.limited_by)})")
        return (f"maximize {spec.name}: {spec.probe} {fmt(reading.value)}{trend(reading)}{objective}, {estimate}: "
                f"{move}, dither {out.dither:+.3g}")
