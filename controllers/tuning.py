"""PI(D) gains from a fitted model: the SIMC rules (Skogestad 2003), in :class:`~.pid.PID`'s terms.

SIMC for a first-order-plus-dead-time plant ``k * exp(-theta s) / (tau s + 1)``::

    Kc = tau / (|k| * (tau_c + theta))        tau_I = min(tau, 4 * (tau_c + theta))

for an integrating plant ``k * exp(-theta s) / s``::

    Kc = 1 / (|k| * (tau_c + theta))          tau_I = 4 * (tau_c + theta)

and for a second-order plant (a second lag ``tau_2``) the same Kc and tau_I on the dominant lag
plus derivative action ``tau_D = tau_2`` (series form).

``tau_c`` is the desired closed-loop time constant; SIMC's recommendation for tight, robust
control is ``tau_c = theta``. Here ``tau_c = theta_hi_eff / aggressiveness``: 1 is SIMC's choice,
2 asks for a loop twice as fast (less robust), 0.5 for one twice as slow. ``theta_hi`` is the
largest dead time the identification data cannot rule out (``FittedModel.theta_hi``, a 95%
profile-likelihood bound), not the best fit's: under probe noise the fit's SSE is nearly flat in
theta, a best fit of 0.5 where the plant has 2 halved ``tau_c`` and doubled the gains, and the
loop then amplified the probe's noise (BENCHMARKS.md, "Gains without a sweep"). So the floor on
``tau_c`` grows with the noise, through the fit's uncertainty; ``Kc`` keeps the best-fit theta.

What the loop adds to the fitted plant:

* ``theta_eff`` is the dead time the loop really has, not only the plant's: a law updated every
  ``h`` steps from a sample held in between adds ``h / 2`` (the zero-order hold).
* the second lag is the controller's own probe filter: an EMA with weight ``alpha`` per sample is
  a lag of ``h * (1 - alpha) / alpha`` steps. The fit sees the raw probe, so this lag is not in
  the model; it is added here. SIMC folds a small, uncertain second lag into the dead time (the
  half rule) and tunes a PI; this one is known exactly, so it is kept as ``tau_2`` and cancelled
  by the derivative (a PID): on the seeded plants that settled the KL loop in 7-8 intervals
  where the half-rule PI took 17-20 (BENCHMARKS.md).

The structure the rules assume: P on the error (the controller zero ``1/tau_I`` cancels the
plant pole ``1/tau``). The PID's default start is I-P (its first update is bumpless: the initial
error reaches the knob through the integral only), which leaves that pole in the response; the
tuned controller therefore carries ``setpoint_weight = 1`` (P on the initial error too) here;
``actuator.tune`` replays weights 1, 0.75, ..., 0 on the fitted model and proposes the fastest
within 15% overshoot (a probe that starts moving on its own needs less than all of it).

The probe's noise, fed back: :func:`noise_jitter` estimates how much the gains move the probe by
acting on its noise alone (the fit's residual sd, through the EMA, P and D, then the plant's lag).
``actuator.tune`` slows ``tau_c`` until twice that stays inside the settling band.

Translation into the PID of ``controllers/pid.py``: it runs in velocity form,
``du = kp * d(error) + ki * error * dt - kd * d2(measurement)/dt`` with ``dt`` in optimizer steps
(the engine's unit), the parallel form of a PID with the setpoint on the integral only. The
series SIMC PID ``Kc (1 + 1/(tau_I s)) (1 + tau_D s)`` becomes parallel with
``Kc' = Kc (1 + tau_D / tau_I)``, ``tau_I' = tau_I + tau_D``, ``tau_D' = tau_I tau_D / (tau_I + tau_D)``;
then ``kp = Kc'``, ``ki = Kc' / tau_I'`` per step, ``kd = Kc' * tau_D'`` (0 for a PI). Gains are
magnitudes; the sign of ``k`` becomes the direction (``direct`` when raising the knob raises the
probe). Bounds and the rate limit stay the knob's: the PID enforces them and its anti-windup
keeps a saturated loop from winding up, so they shape the replayed response, not the gains.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ._checks import ParameterError, require_positive
from .identify import FittedModel
from .pid import Direction

__all__ = ["Tuning", "simc", "effective_dead_time", "filter_lag", "noise_jitter"]


@dataclass(frozen=True)
class Tuning:
    """Gains in the PID's parameterisation and the numbers they came from (steps; ``tau_i`` and
    ``tau_d`` in parallel form)."""

    kp: float
    ki: float
    kd: float
    direction: Direction
    tau_c: float
    theta_eff: float
    tau_i: float
    tau_d: float
    aggressiveness: float
    rule: str
    theta_hi_eff: float = 0.0
    setpoint_weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def filter_lag(interval: float, filter_alpha: float | None) -> float:
    """The time constant (steps) of an EMA with weight ``alpha`` per sample every ``interval`` steps."""
    if filter_alpha is None or filter_alpha >= 1.0:
        return 0.0
    return interval * (1.0 - filter_alpha) / filter_alpha


def effective_dead_time(theta: float, interval: float) -> float:
    """The plant's dead time plus the sampling hold of a law updated every ``interval`` steps."""
    return theta + interval / 2.0


def simc(model: FittedModel, *, aggressiveness: float = 1.0, interval: float = 1.0,
         filter_alpha: float | None = None) -> Tuning:
    """SIMC gains for ``model``; ``interval`` is the steps between two updates of the law and
    ``filter_alpha`` the weight of the EMA on its probe (None: no filter)."""
    a = require_positive("aggressiveness", aggressiveness)
    h = require_positive("interval", interval)
    if model.gain == 0 or not math.isfinite(model.gain):
        raise ParameterError("gain", "the model has no gain to tune against")
    theta = effective_dead_time(model.theta, h)
    theta_hi = effective_dead_time(max(model.theta, model.theta_hi), h)
    tau, tau2 = model.tau, filter_lag(h, filter_alpha)
    tau_c = theta_hi / a
    k = abs(model.gain)
    if model.kind == "fopdt":
        kc = tau / (k * (tau_c + theta))
        tau_i = min(tau, 4.0 * (tau_c + theta))
        rule = "SIMC FOPDT (Skogestad 2003): Kc = tau/(k(tau_c+theta)), tau_I = min(tau, 4(tau_c+theta))"
    else:
        kc = 1.0 / (k * (tau_c + theta))
        tau_i = 4.0 * (tau_c + theta)
        rule = "SIMC integrating (Skogestad 2003): Kc = 1/(k(tau_c+theta)), tau_I = 4(tau_c+theta)"
    tau_d = 0.0
    if tau2 > 0:
        rule += f", tau_D = {tau2:.3g} (the probe filter's lag, series form)"
        kc, tau_i, tau_d = kc * (1.0 + tau2 / tau_i), tau_i + tau2, tau_i * tau2 / (tau_i + tau2)
    return Tuning(kp=kc, ki=kc / tau_i, kd=kc * tau_d, direction="direct" if model.gain > 0 else "reverse",
                  tau_c=tau_c, theta_eff=theta, tau_i=tau_i, tau_d=tau_d, aggressiveness=a,
                  rule=rule + ", tau_c = theta_hi/aggressiveness", theta_hi_eff=theta_hi)


def noise_jitter(model: FittedModel, tuning: Tuning, *, interval: float = 1.0,
                 filter_alpha: float | None = None) -> float | None:
    """The probe's standard deviation that the loop itself causes by acting on probe noise, in
    probe units: the fit's residual sd through the EMA (variance ``alpha / (2 - alpha)``), into the
    knob through P and D (``sqrt(kp^2 + 2 (kd/h)^2)``: D differences two samples), held for ``h``
    steps and smoothed by the plant's lag (variance ``h / (2 tau)``). FOPDT models only (``None``
    for an integrating one, whose response to knob noise the loop itself bounds)."""
    if model.kind != "fopdt":
        return None
    h = interval
    alpha = 1.0 if filter_alpha is None else min(1.0, filter_alpha)
    sigma = model.residual_sd * math.sqrt(alpha / (2.0 - alpha))
    knob_sd = math.sqrt(tuning.kp ** 2 + 2.0 * (tuning.kd / h) ** 2) * sigma
    return abs(model.gain) * knob_sd * math.sqrt(min(1.0, h / (2.0 * max(model.tau, 1e-9))))
