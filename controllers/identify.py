"""Plant identification from recorded data: a low-order model of how a probe answers a knob.

Two models, both with the knob in its own scale (``ln(knob)`` for a log-scale knob, as the PID
sees it) and time in optimizer steps, the unit of the engine's ``dt``:

* **FOPDT** (first order plus dead time): ``tau * dx/dt = u(t - theta) - u_ref - x``,
  ``y = offset + gain * x + transient * exp(-(t - t0) / tau) [+ drift * (t - t0)]``. The
  transient term lets the run start away from equilibrium (KL starts at 0 whatever beta is),
  with the same time constant. The optional drift term is a probe that also moves on its own, at
  a steady rate, whatever the knob does: drift from the base model that accumulates with
  learning progress, reward pressure that grows as training finds more to exploit. Without it,
  a step test taken while the probe drifts credits the knob with the drift (on the simulated
  drift-vs-lr plant: a gain twice the plant's, BENCHMARKS.md "Gains without a sweep").
* **Integrating**: ``dz/dt = u(t - theta) - u_ref``, ``y = offset + drift * (t - t0) + rate * z``
  (a probe that keeps moving as long as the knob is off its balance point, e.g. drift that
  accumulates with the learning rate).

How the fit works: the knob is held piecewise constant between observations (the value an
observation reports was in effect since the previous one), so for a given ``(tau, theta)`` the
response to it is computed exactly at the observation times, and ``y`` is *linear* in the
remaining parameters: three or four columns, solved by least squares. ``(tau, theta)`` come
from a log-spaced grid refined by coordinate search. Three candidates compete: FOPDT, FOPDT with
drift, integrating; the lowest AIC wins (the integrating model has one parameter fewer, so it wins
a tie, which is what a time constant far beyond the data looks like). The drift term is a nested
extension of the FOPDT and must first be significant on its own: a likelihood-ratio test at 1%
(AIC alone admits a spurious drift one fit in six, measured at up to 12% of a step's response),
on at least :data:`DRIFT_MIN_OBSERVATIONS` observations (a short record cannot tell a drift from
a slow transient). Stdlib only: a 4x4 solve needs no numpy.

The probe is fitted scaled by a power of two (into [0.5, 1) in magnitude), then the model is
scaled back: sums of squares of values beyond 1e154 overflow, and a power of two scales every
float exactly, so the fit is the one of the values as recorded.

Refusals are :class:`NotIdentifiable` subclasses naming the problem: too few observations, a
knob that never moved, a move whose effect is lost in the probe's noise, or a model whose
parameters leave the float range.

:class:`StepTest` is the excitation an identification pre-run applies to the knob.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from ._checks import ParameterError, require_finite, require_non_negative, require_positive

__all__ = [
    "NotIdentifiable",
    "TooFewObservations",
    "KnobDidNotMove",
    "NoResponse",
    "OutOfRange",
    "ModelKind",
    "FittedModel",
    "ModelState",
    "fit_fopdt",
    "fit_integrating",
    "identify",
    "StepTest",
]

ModelKind = Literal["fopdt", "integrating"]

MIN_OBSERVATIONS = 6
# The drift term is a sixth parameter: below this many observations it is not tried (the
# likelihood-ratio test's chi-square is an asymptotic result).
DRIFT_MIN_OBSERVATIONS = 20
# It is kept when n * ln(SSE without / SSE with) exceeds this: chi-square, one degree of freedom, 1%.
_DRIFT_CHI2 = 6.63
# ... and fitted with time constants up to this share of the record's span.
_DRIFT_TAU_SPAN = 0.5
# The knob term's excursion must stand this many residual standard deviations clear of the noise.
MIN_SIGNAL_TO_NOISE = 2.0
_TAU_POINTS = 36
_THETA_POINTS = 16
_REFINE_ROUNDS = 24


class NotIdentifiable(ValueError):
    """The recorded data cannot identify a model; ``problem`` is a short code, the message says
    what to change."""

    problem = "not_identifiable"


class TooFewObservations(NotIdentifiable):
    problem = "too_few_observations"


class KnobDidNotMove(NotIdentifiable):
    problem = "knob_did_not_move"


class NoResponse(NotIdentifiable):
    problem = "no_response"


class OutOfRange(NotIdentifiable):
    problem = "out_of_range"


@dataclass(frozen=True)
class ModelState:
    """Where a :class:`FittedModel` simulation is: steps since the start, the filtered input (or
    its integral) and the inputs still travelling through the dead time."""

    t: int = 0
    x: float = 0.0
    pipeline: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "x": self.x, "pipeline": list(self.pipeline)}


@dataclass(frozen=True)
class FittedModel:
    """A fitted model and how well it fits. Units: ``gain`` probe units per knob-scale unit
    (FOPDT, steady state); ``rate`` probe units per knob-scale unit per step (integrating);
    ``tau`` and ``theta`` in steps; ``drift`` probe units per step the probe moves on its own
    (0 for a FOPDT fitted without the term). ``u_ref`` is the knob (scale units) the model is
    linearised around: the first recorded value. ``theta_hi`` is the largest dead time the data
    cannot rule out (see :func:`_theta_upper`): under probe noise the fit's SSE is often nearly
    flat in theta."""

    kind: ModelKind
    gain: float
    tau: float
    theta: float
    offset: float
    transient: float
    drift: float
    u_ref: float
    r2: float
    nrmse: float
    observations: int
    steps: int
    knob_move: float
    residual_sd: float
    aic: float = 0.0
    theta_hi: float = 0.0
    fitted: tuple[float, ...] = field(default=(), repr=False)

    @property
    def rate(self) -> float:
        return self.gain if self.kind == "integrating" else self.gain / self.tau

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("fitted")
        d["rate"] = self.rate
        return d

    # -- simulation, one step at a time (the replay drives it closed loop) ----------------------

    def start(self) -> ModelState:
        return ModelState(pipeline=(0.0,) * int(round(self.theta)))

    def output(self, state: ModelState) -> float:
        """The noise-free probe value at ``state``."""
        if self.kind == "fopdt":
            return (self.offset + self.drift * state.t + self.gain * state.x
                    + self.transient * math.exp(-state.t / self.tau))
        return self.offset + self.drift * state.t + self.gain * state.x

    def step(self, state: ModelState, u: float) -> tuple[float, ModelState]:
        """Advance one step with knob ``u`` (scale units) in effect; the probe value after it."""
        du = u - self.u_ref
        pipeline = (*state.pipeline, du)
        seen, pipeline = pipeline[0], pipeline[1:]
        if self.kind == "fopdt":
            x = seen + (state.x - seen) * math.exp(-1.0 / self.tau)
        else:
            x = state.x + seen
        nxt = ModelState(t=state.t + 1, x=x, pipeline=pipeline)
        return self.output(nxt), nxt

    def steady_knob(self, target: float, at_step: float = 0.0) -> float | None:
        """The knob (scale units) at which the model rests at ``target`` (FOPDT; with a drift term,
        where it is at ``at_step`` steps from the start), or stops moving (integrating); ``None``
        without a gain."""
        if self.gain == 0:
            return None
        if self.kind == "fopdt":
            return self.u_ref + (target - self.offset - self.drift * at_step) / self.gain
        return self.u_ref - self.drift / self.gain


# -- data ------------------------------------------------------------------------------------


def _check_data(steps: Sequence[float], knob: Sequence[float], probe: Sequence[float]) -> tuple[list[float], ...]:
    if not len(steps) == len(knob) == len(probe):
        raise ParameterError("steps", f"steps, knob and probe differ in length ({len(steps)}, {len(knob)}, "
                                      f"{len(probe)})")
    t = [require_finite("steps", s) for s in steps]
    u = [require_finite("knob", v) for v in knob]
    y = [require_finite("probe", v) for v in probe]
    if any(b <= a for a, b in zip(t, t[1:])):
        raise ParameterError("steps", "steps must be strictly increasing")
    if len(t) < MIN_OBSERVATIONS:
        raise TooFewObservations(f"{len(t)} observations; identification needs at least {MIN_OBSERVATIONS} "
                                 "(probe more often, or record longer)")
    return t, u, y


def _responses(t: list[float], du: list[float], tau: float, theta: float, integrating: bool) -> list[float]:
    """The model's state at each observation time, exactly, for a knob held piecewise constant:
    ``du[i]`` is in effect over ``(t[i-1], t[i]]`` (``du[0]`` before), delayed by ``theta``."""
    n = len(t)
    out = [0.0] * n
    x, now, seg = 0.0, t[0], 0  # du[seg] is in effect (delayed) until t[seg] + theta
    for j in range(1, n):
        while now < t[j]:
            while seg < n - 1 and t[seg] + theta <= now:
                seg += 1
            end = min(t[j], t[seg] + theta) if seg < n - 1 else t[j]
            v, span = du[seg], end - now
            x = x + v * span if integrating else v + (x - v) * math.exp(-span / tau)
            now = end
        out[j] = x
    return out


def _solve3(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; ``None`` if singular."""
    m = [row[:] + [rhs] for row, rhs in zip(a, b)]
    size = len(b)
    for c in range(size):
        p = max(range(c, size), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12 * max(1.0, max(abs(v) for row in m for v in row[:size])):
            return None
        m[c], m[p] = m[p], m[c]
        for r in range(c + 1, size):
            f = m[r][c] / m[c][c]
            for k in range(c, size + 1):
                m[r][k] -= f * m[c][k]
    sol = [0.0] * size
    for r in range(size - 1, -1, -1):
        sol[r] = (m[r][size] - sum(m[r][k] * sol[k] for k in range(r + 1, size))) / m[r][r]
    return sol


def _least_squares(columns: list[list[float]], y: list[float]) -> tuple[list[float], float] | None:
    """Coefficients and SSE of ``y ~ sum(c_i * column_i)`` (normal equations, columns scaled)."""
    scales = [max(abs(v) for v in col) or 1.0 for col in columns]
    cols = [[v / s for v in col] for col, s in zip(columns, scales)]
    ata = [[sum(a * b for a, b in zip(ci, cj)) for cj in cols] for ci in cols]
    aty = [sum(a * b for a, b in zip(ci, y)) for ci in cols]
    sol = _solve3(ata, aty)
    if sol is None:
        return None
    coef = [c / s for c, s in zip(sol, scales)]
    sse = 0.0
    for j, yj in enumerate(y):
        r = yj - sum(c * col[j] for c, col in zip(coef, columns))
        sse += r * r
    return coef, sse


def _fit_at(t: list[float], du: list[float], y: list[float], tau: float, theta: float,
            integrating: bool, drift: bool = False) -> tuple[float, list[float], list[float]] | None:
    """SSE, coefficients (offset, gain, transient or drift[, drift]) and the knob response for
    one (tau, theta); ``drift`` adds a steady-rate column to a FOPDT."""
    resp = _responses(t, du, tau, theta, integrating)
    t0 = t[0]
    ramp = [tj - t0 for tj in t]
    columns = [[1.0] * len(t), resp, ramp if integrating else [math.exp(-(tj - t0) / tau) for tj in t]]
    if drift and not integrating:
        columns.append(ramp)
    fit = _least_squares(columns, y)
    if fit is None:
        return None
    coef, sse = fit
    return sse, coef, resp


def _params(integrating: bool, drift: bool) -> int:
    """Fitted parameters: the linear coefficients plus theta (and tau for a FOPDT)."""
    return 4 if integrating else 6 if drift else 5


def _fit(kind: ModelKind, t: list[float], u: list[float], y: list[float], drift: bool = False) -> FittedModel:
    integrating = kind == "integrating"
    drift = drift and not integrating
    u_ref = u[0]
    du = [v - u_ref for v in u]
    span = t[-1] - t[0]
    gaps = sorted(b - a for a, b in zip(t, t[1:]))
    h = gaps[len(gaps) // 2]
    # With a drift term the transient must die out within the record (tau <= span / 2): a slower one
    # and the drift make a parabola between them, and an integrating plant's delayed ramp was then
    # fitted as a FOPDT of tau 157 steps with a drift, on 80 steps.
    tau_lo, tau_hi = max(0.3 * h, 0.2), (_DRIFT_TAU_SPAN if drift else 5.0) * span
    taus = [1.0] if integrating else [tau_lo * (tau_hi / tau_lo) ** (i / (_TAU_POINTS - 1)) for i in range(_TAU_POINTS)]
    theta_hi = span / 3.0
    thetas = [theta_hi * i / (_THETA_POINTS - 1) for i in range(_THETA_POINTS)]

    best: tuple[float, float, float] | None = None
    for tau in taus:
        for theta in thetas:
            r = _fit_at(t, du, y, tau, theta, integrating, drift)
            if r is not None and (best is None or r[0] < best[0]):
                best = (r[0], tau, theta)
    if best is None:
        raise KnobDidNotMove("the knob's recorded values leave its effect undetermined (constant, or changing "
                             "only in step with the start of the run)")
    # Coordinate search around the grid's best: multiplicative on tau, additive on theta.
    sse, tau, theta = best
    ftau, dtheta = (tau_hi / tau_lo) ** (1.0 / (_TAU_POINTS - 1)), max(theta_hi / (_THETA_POINTS - 1), 0.5)
    for _ in range(_REFINE_ROUNDS):
        improved = False
        cands = [(tau, max(0.0, theta - dtheta)), (tau, min(theta_hi, theta + dtheta))]
        if not integrating:
            cands += [(max(tau / ftau, 0.05), theta), (min(tau * ftau, tau_hi) if drift else tau * ftau, theta)]
        for ct, cth in cands:
            r = _fit_at(t, du, y, ct, cth, integrating, drift)
            if r is not None and r[0] < sse:
                sse, tau, theta, improved = r[0], ct, cth, True
        if not improved:
            ftau, dtheta = math.sqrt(ftau), dtheta / 2.0
    params = _params(integrating, drift)
    theta_up = _theta_upper(t, du, y, taus, tau, theta, theta_hi, sse, params, integrating, drift)
    final = _fit_at(t, du, y, tau, theta, integrating, drift)
    assert final is not None
    sse, coef, resp = final
    offset, gain, second = coef[:3]
    ramp = coef[3] if drift else 0.0
    n = len(y)
    mean = sum(y) / n
    sst = sum((v - mean) ** 2 for v in y)
    fitted = tuple(offset + gain * r + second * (tj - t[0] if integrating else math.exp(-(tj - t[0]) / tau))
                   + ramp * (tj - t[0]) for r, tj in zip(resp, t))
    spread = max(y) - min(y)
    return FittedModel(
        kind=kind, gain=gain, tau=0.0 if integrating else tau, theta=theta, offset=offset,
        transient=0.0 if integrating else second, drift=second if integrating else ramp, u_ref=u_ref,
        r2=1.0 - sse / sst if sst > 0 else 0.0,
        nrmse=math.sqrt(sse / n) / spread if spread > 0 else 0.0,
        observations=n, steps=int(span), knob_move=max(du) - min(du),
        residual_sd=math.sqrt(sse / max(1, n - params)),
        aic=n * math.log(max(sse, 1e-300) / n) + 2 * params,
        theta_hi=theta_up,
        fitted=fitted,
    )


# A dead time is ruled out when its best fit's SSE exceeds the best one's by this many residual
# variances: the 95% point of chi-square with one degree of freedom (a profile-likelihood bound).
_THETA_CHI2 = 3.84
_THETA_UPPER_POINTS = 24


def _theta_upper(t: list[float], du: list[float], y: list[float], taus: list[float], tau: float, theta: float,
                 theta_max: float, sse: float, params: int, integrating: bool, drift: bool = False) -> float:
    """The largest dead time in ``[theta, theta_max]`` whose best fit (over the tau grid) is not
    ruled out: ``SSE(theta') <= SSE + 3.84 * sigma^2`` (profile likelihood, 95%). Tuning sizes the
    loop on it, so a dead time that noise hides cannot make the gains too high."""
    n = len(y)
    limit = sse + _THETA_CHI2 * sse / max(1, n - params)
    best = theta
    candidates = [theta + (theta_max - theta) * i / _THETA_UPPER_POINTS for i in range(1, _THETA_UPPER_POINTS + 1)]
    for th in candidates:
        fits = (_fit_at(t, du, y, tv, th, integrating, drift) for tv in ({tau, *taus} if not integrating else {1.0}))
        lowest = min((r[0] for r in fits if r is not None), default=math.inf)
        if lowest <= limit:
            best = th
    return best


def _refuse_unmoved(u: list[float], min_move: float) -> None:
    move = max(u) - min(u)
    if move <= min_move:
        raise KnobDidNotMove(f"the knob moved by {move:.3g} (scale units) over the recorded run; identification "
                             f"needs a move larger than {min_move:.3g}: record a run whose controller acted, or "
                             "run an identification pre-run (a step test on the knob)")


def _refuse_no_response(model: FittedModel, response: list[float], exponent: int) -> None:
    """``model`` fitted on the probe scaled by ``2**-exponent``: the comparison is scale-free, the
    message in probe units."""
    effect = abs(model.gain) * (max(response) - min(response))
    if not effect > MIN_SIGNAL_TO_NOISE * model.residual_sd:
        raise NoResponse(f"the knob's effect on the probe ({math.ldexp(effect, exponent):.3g}) is lost in its noise "
                         f"(residual sd {math.ldexp(model.residual_sd, exponent):.3g}): make a larger or longer knob "
                         "move, or probe with more examples")


def _exponent(y: list[float]) -> int:
    """The power of two (its exponent) that brings the largest ``|y|`` into [0.5, 1)."""
    return math.frexp(max(abs(v) for v in y))[1]


def _scaled_back(model: FittedModel, exponent: int) -> FittedModel:
    """A model fitted on the probe scaled by ``2**-exponent``, in the probe's own units (the
    parameters in probe units; ``r2`` and ``nrmse`` are ratios)."""
    if exponent == 0:
        return model
    def up(v: float) -> float:
        return math.ldexp(v, exponent)

    try:
        return replace(model, gain=up(model.gain), offset=up(model.offset), transient=up(model.transient),
                       drift=up(model.drift), residual_sd=up(model.residual_sd),
                       fitted=tuple(up(v) for v in model.fitted),
                       aic=model.aic + 2.0 * model.observations * exponent * math.log(2.0))
    except OverflowError as exc:  # ldexp raises rather than answer inf
        raise OutOfRange(f"the fitted model's parameters leave the float range in the probe's units (gain "
                         f"{model.gain:.3g} x 2**{exponent}, offset {model.offset:.3g} x 2**{exponent}): record "
                         "the probe in smaller units") from exc


def _response_of(model: FittedModel, t: list[float], u: list[float]) -> list[float]:
    return _responses(t, [v - model.u_ref for v in u], model.tau, model.theta, model.kind == "integrating")


def fit_fopdt(steps: Sequence[float], knob: Sequence[float], probe: Sequence[float], *,
              min_move: float = 0.0, drift: bool | None = False) -> FittedModel:
    """Fit a FOPDT model (``knob`` in scale units, ``steps`` in optimizer steps); ``drift``: with
    the drift term (True), without (False), or with it when it is significant (None)."""
    return identify(steps, knob, probe, min_move=min_move, kind="fopdt", drift=drift)


def fit_integrating(steps: Sequence[float], knob: Sequence[float], probe: Sequence[float], *,
                    min_move: float = 0.0) -> FittedModel:
    """Fit an integrating model (``knob`` in scale units, ``steps`` in optimizer steps)."""
    return identify(steps, knob, probe, min_move=min_move, kind="integrating")


def identify(steps: Sequence[float], knob: Sequence[float], probe: Sequence[float], *,
             min_move: float = 0.0, kind: ModelKind | None = None, drift: bool | None = None) -> FittedModel:
    """Fit the candidate models and keep the one with the lower AIC: FOPDT (with the drift term
    when it is significant, from :data:`DRIFT_MIN_OBSERVATIONS` observations on) and integrating;
    ``kind`` keeps one structure, ``drift`` forces the FOPDT's drift term on (True) or off (False).

    Raises :class:`TooFewObservations`, :class:`KnobDidNotMove` or :class:`NoResponse`.
    """
    t, u, y = _check_data(steps, knob, probe)
    _refuse_unmoved(u, require_non_negative("min_move", min_move))
    exponent = _exponent(y)
    y = [math.ldexp(v, -exponent) for v in y]
    kinds: tuple[ModelKind, ...] = (kind,) if kind is not None else ("fopdt", "integrating")
    drifts = (drift,) if drift is not None else (False, True) if len(t) >= DRIFT_MIN_OBSERVATIONS else (False,)
    models = []
    for k in kinds:
        fits = []
        for d in drifts if k == "fopdt" else (False,):
            try:
                fits.append(_fit(k, t, u, y, d))
            except KnobDidNotMove:
                continue
        if len(fits) == 2:  # with and without drift: the term must be significant
            plain, drifting = fits
            # n ln(SSE_plain / SSE_drift), from the AICs (n ln(SSE/n) + 2p, one parameter apart)
            fits = [drifting if plain.aic - drifting.aic + 2.0 > _DRIFT_CHI2 else plain]
        models.extend(fits)
    if not models:
        raise KnobDidNotMove("the knob's recorded values leave its effect undetermined")
    model = min(models, key=lambda m: m.aic)
    _refuse_no_response(model, _response_of(model, t, u), exponent)
    return _scaled_back(model, exponent)


# -- excitation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepTest:
    """An identification pre-run's knob schedule: hold the nominal value for ``hold`` steps from
    ``start``, then move it by ``size`` (scale units: log units for a log-scale knob, so 0.5 is a
    factor e**0.5) for ``length`` steps, then restore it. ``offset(step)`` is the move in effect at
    a step; the agent applies ``nominal`` shifted by it, inside the knob's bounds."""

    size: float
    length: int
    hold: int = 0
    start: int = 0

    def __post_init__(self) -> None:
        require_finite("size", self.size)
        if self.size == 0:
            raise ParameterError("size", "a step test needs a non-zero step")
        require_positive("length", self.length)
        require_non_negative("hold", self.hold)
        require_non_negative("start", self.start)

    @property
    def end(self) -> int:
        """The first step at which the knob is back at its nominal value."""
        return self.start + self.hold + self.length

    def offset(self, step: int) -> float:
        return self.size if self.start + self.hold <= step < self.end else 0.0

    def value(self, step: int, nominal: float, scale: str, lo: float = -math.inf, hi: float = math.inf) -> float:
        """The knob value (knob units) the test asks for at ``step``."""
        off = self.offset(step)
        if off == 0.0:
            return nominal
        v = nominal * math.exp(off) if scale == "log" else nominal + off
        if scale == "integer":
            v = float(round(v))
        return min(max(v, lo), hi)
