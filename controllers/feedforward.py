"""Where to start a knob before feedback has anything to act on: operating points from theory.

A loop that starts far from its operating point spends its first intervals getting there, and
when the plant moves fast at the start (online RL's KL jumps in the first few updates) the probe
overshoots before two decisions can act (BENCHMARKS.md, rl-kl). Feedforward puts the knob near
the point where the probe would sit at the target, from a model of the plant; feedback then trims
what the model got wrong.

KL coefficient of online RL. The KL-regularised objective ``E_π[r] − β·KL(π ‖ π_ref)`` has the
optimum ``π*(y|x) ∝ π_ref(y|x)·exp(r(x, y)/β)`` (the exponential tilt of the reference), and to
second order in ``1/β``::

    KL(π* ‖ π_ref | x) ≈ Var_{y ~ π_ref(·|x)}[r(x, y)] / (2 β²)

(the tilt's cumulant expansion: ``log Z = E[r]/β + Var[r]/(2β²) + …``, ``KL = E_π*[r]/β − log Z``).
That KL is per sequence, the penalty RLOO folds into each sequence's reward; a target per token
(what ``policy_kl`` measures) times the mean answer length ``L`` is the sequence target, so::

    β₀ = sqrt( mean_x Var_x[r] / (2 · target · L) )

measured on a batch of the reference's own samples before training (``kl_coefficient_for_target``).

Which ``r``: the signal β is weighed against in the trainer's loss. RLOO folds ``−β·KL`` into each
sequence's *raw* reward, so ``r`` is the reward (``scale="none"``). GRPO adds ``β·KL`` per token to
a loss whose policy term carries the *normalised advantage* ``(r − mean_group)/(std + 1e-4)``
(TRL's ``scale_rewards="group"``, its default; ``"batch"`` divides by the batch's std); summed over
an answer's tokens that is the same sequence-level objective with ``r`` replaced by the advantage,
so ``Var`` is the advantage's: ≈ 1 in every group whose rewards vary at all, whatever the reward's
units. A GRPO β therefore lives near ``sqrt(1/(2·target·L))`` (0.9 for 0.04 nats/token over 15
tokens) while an RLOO β scales with the reward's spread (0.3 on the same task).
The approximation is good while ``r/β`` is small; where the reward is coarse (a 0/1 hit) it is a
starting point, which is all feedforward needs to be: the PID on log β trims the rest. Stdlib only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ._checks import ParameterError, require_positive

__all__ = ["KLStart", "SCALES", "kl_coefficient_for_target"]

#: How the trainer scales the reward before β meets it: ``"none"`` (RLOO; GRPO with
#: ``scale_rewards="none"``), ``"group"`` (GRPO's default), ``"batch"`` (GRPO ``scale_rewards="batch"``).
SCALES = ("none", "group", "batch")
_STD_EPS = 1e-4  # TRL GRPO's: advantages / (std + 1e-4)


@dataclass(frozen=True)
class KLStart:
    """The feedforward β and what it came from."""

    beta: float
    reward_variance: float  # mean within-prompt variance of the (scaled) reward under the reference
    mean_length: float  # mean answer length, tokens
    sequence_target: float  # target × mean_length, nats per answer
    groups: int  # prompts with at least two samples
    scale: str = "none"  # how the reward was scaled before its variance was taken (SCALES)

    def as_dict(self) -> dict[str, float | int | str]:
        return {"beta": self.beta, "reward_variance": self.reward_variance, "mean_length": self.mean_length,
                "sequence_target": self.sequence_target, "groups": self.groups, "scale": self.scale}


def _scaled(groups: list[list[float]], scale: str) -> list[list[float]]:
    """The rewards as the trainer's loss sees them: centred per group (which leaves a within-group
    variance unchanged) and divided by the group's or the batch's sample std plus TRL's 1e-4."""
    if scale == "none":
        return groups
    pooled = statistics.stdev([r for g in groups for r in g]) if scale == "batch" else 0.0
    out = []
    for g in groups:
        mean = statistics.fmean(g)
        std = (statistics.stdev(g) if scale == "group" else pooled) + _STD_EPS
        out.append([(r - mean) / std for r in g])
    return out


def kl_coefficient_for_target(reward_groups: Sequence[Sequence[float]], lengths: Sequence[float],
                              target: float, *, scale: str = "none") -> KLStart:
    """β at which the KL-regularised optimum sits at ``target`` nats per token (module docstring).

    ``reward_groups``: per prompt, the rewards of the reference model's sampled answers (at least
    two per prompt; prompts with fewer are ignored). ``lengths``: the answers' lengths in tokens.
    ``scale``: how the trainer scales the reward before β meets it (``SCALES``; ``"none"`` for RLOO,
    ``"group"`` for GRPO's default, the module docstring says why).
    Raises :class:`ParameterError` naming the field when the data cannot give a β: no prompt with
    two samples, rewards that never vary within a prompt (β then has no effect on the optimum),
    or no answer tokens.
    """
    target = require_positive("target", target)
    if scale not in SCALES:
        raise ParameterError("scale", f"must be one of {', '.join(SCALES)}, got {scale!r}")
    groups = [[float(r) for r in g] for g in reward_groups if len(g) >= 2]
    if not groups:
        raise ParameterError("reward_groups", "need at least one prompt with two or more sampled answers")
    if not all(math.isfinite(r) for g in groups for r in g):
        raise ParameterError("reward_groups", "every reward must be finite")
    variance = statistics.fmean(statistics.variance(g) for g in _scaled(groups, scale))
    if not variance > 0:
        raise ParameterError("reward_groups", "the reward never varies within a prompt, so the KL penalty "
                             "has no optimum to move; sample more answers per prompt or check the reward")
    if not lengths or not all(math.isfinite(n) and n >= 0 for n in lengths):
        raise ParameterError("lengths", "need the sampled answers' lengths in tokens (finite, >= 0)")
    mean_length = statistics.fmean(float(n) for n in lengths)
    if not mean_length > 0:
        raise ParameterError("lengths", "the sampled answers are all empty")
    sequence_target = target * mean_length
    beta = math.sqrt(variance / (2.0 * sequence_target))
    return KLStart(beta=beta, reward_variance=variance, mean_length=mean_length,
                   sequence_target=sequence_target, groups=len(groups), scale=scale)
