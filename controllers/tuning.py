"""PI gains from a fitted model: the SIMC rules (Skogestad 2003), in :class:`~.pid.PID`'s terms.

SIMC for a first-order-plus-dead-time plant ``k * exp(-theta s) / (tau s + 1)``::

    Kc = tau / (|k| * (tau_c + theta))        tau_I = min(tau, 4 * (tau_c + theta))

and for an integrating plant ``k * exp(-theta s) / s``::

    Kc = 1 / (|k| * (tau_c + theta))          tau_I = 4 * (tau_c + theta)

``tau_c`` is the desired closed-loop time constant; SIMC's recommendation for tight, robust
control is ``tau_c = theta``. Here ``tau_c = theta_eff / aggressiveness``: 1 is SIMC's choice,
2 asks for a loop twice as fast (less robust), 0.5 for one twice as slow.

``theta_eff`` is the dead time the loop really has, not only the plant's: a law updated every
``h`` steps from a sample held in between adds ``h / 2`` (the zero-order hold), and an EMA on
the probe with weight ``alpha`` per sample is a lag of ``h * (1 - alpha) / alpha`` steps, which
Skogestad's half rule splits: half to the dead time, half to the time constant (``tau_eff``).

Translation into the PID of ``controllers/pid.py``: it runs in velocity form,
``du = kp * d(error) + ki * error * dt`` with ``dt`` in optimizer steps (the engine's unit), which
is the SIMC PI ``Kc * (d(error) + error * dt / tau_I)``: ``kp = Kc``, ``ki = Kc / tau_I`` per
step, ``kd = 0``. Gains are magnitudes; the sign of ``k`` becomes the direction (``direct`` when
raising the knob raises the probe). Bounds and the rate limit stay the knob's: the PID enforces
them and its anti-windup keeps a saturated loop from winding up, so they shape the replayed
response rather than the gains.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ._checks import ParameterError, require_positive
from .identify import FittedModel
from .pid import Direction

__all__ = ["Tuning", "simc", "effective_dead_time", "filter_lag"]


@dataclass(frozen=True)
class Tuning:
    """Gains in the PID's parameterisation and the numbers they came from (steps)."""

    kp: float
    ki: float
    kd: float
    direction: Direction
    tau_c: float
    theta_eff: float
    tau_i: float
    aggressiveness: float
    rule: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def filter_lag(interval: float, filter_alpha: float | None) -> float:
    """The time constant (steps) of an EMA with weight ``alpha`` per sample every ``interval`` steps."""
    if filter_alpha is None or filter_alpha >= 1.0:
        return 0.0
    return interval * (1.0 - filter_alpha) / filter_alpha


def effective_dead_time(theta: float, interval: float, filter_alpha: float | None = None) -> float:
    """The plant's dead time plus the sampling hold and half the probe filter's lag (steps)."""
    return theta + interval / 2.0 + filter_lag(interval, filter_alpha) / 2.0


def simc(model: FittedModel, *, aggressiveness: float = 1.0, interval: float = 1.0,
         filter_alpha: float | None = None) -> Tuning:
    """SIMC PI gains for ``model``; ``interval`` is the steps between two updates of the law."""
    a = require_positive("aggressiveness", aggressiveness)
    h = require_positive("interval", interval)
    if model.gain == 0 or not math.isfinite(model.gain):
        raise ParameterError("gain", "the model has no gain to tune against")
    theta = effective_dead_time(model.theta, h, filter_alpha)
    tau_c = theta / a
    k = abs(model.gain)
    if model.kind == "fopdt":
        tau = model.tau + filter_lag(h, filter_alpha) / 2.0
        kc = tau / (k * (tau_c + theta))
        tau_i = min(tau, 4.0 * (tau_c + theta))
        rule = "SIMC FOPDT (Skogestad 2003): Kc = tau/(k(tau_c+theta)), tau_I = min(tau, 4(tau_c+theta))"
    else:
        kc = 1.0 / (k * (tau_c + theta))
        tau_i = 4.0 * (tau_c + theta)
        rule = "SIMC integrating (Skogestad 2003): Kc = 1/(k(tau_c+theta)), tau_I = 4(tau_c+theta)"
    return Tuning(kp=kc, ki=kc / tau_i, kd=0.0, direction="direct" if model.gain > 0 else "reverse",
                  tau_c=tau_c, theta_eff=theta, tau_i=tau_i, aggressiveness=a, rule=rule)
