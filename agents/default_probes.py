"""What a preset brings beyond its knobs: the probes it names, built for a run that was given none,
and a probe schedule fitted to the run's length.

A preset lists the probes it needs (``probes:`` in its YAML). At ``train()`` start the callback
builds each one the run was not given (:func:`missing_probes`: the registered probe's
``for_preset``, ``actuator.agents.probes.register``) from the trainer's tokenizer and the
held-out data Actuator ships (``actuator.agents.general``, the synthetic HotpotQA set), small enough
for the probe budget (10% of wall time by default) to fit a reading every step or few on the
models the presets were measured on: the budget subsamples them further when it must, and says so.
Drift probes compare against the trainer's own reference model when it has one (TRL's DPO, GRPO
and RLOO build it), else a copy of the starting weights. A probe nothing shipped can stand in for
(draft acceptance needs the teacher) is reported instead, with what to pass.

A preset's ``every`` values are written for a long run; :func:`fitted_intervals` scales them to
``max_steps`` (one factor for all, so a guardrail's probe stays as much rarer than a controller's
as the preset made it) so that its most frequent probe reads at least ``READINGS`` times, and
:func:`fitted_ramps` shortens a controller's setpoint ramp to the readings the run has.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from actuator.policy import ControllerSpec, PolicyDocument, load_policy, probe_for_key

from .probes import Probe, ProbeSetupError
from .probes._registry import build

__all__ = ["READINGS", "RAMP_SHARE", "fitted_intervals", "fitted_ramps", "build_probe", "missing_probes", "MissingProbes", "controller_probes",
           "compared_probes", "tokenizer_of"]

# Readings a preset's most frequent probe takes in any run (the baseline at step 0 not counted):
# a controller's first decision needs the reading after the baseline, and a handful more to act on.
READINGS = 6


def fitted_intervals(policy: PolicyDocument, max_steps: int) -> dict[str, int | None]:
    """``probes[].every`` of ``policy`` scaled down by one factor so that the most frequent probe
    runs at least every ``max(1, max_steps // READINGS)`` steps; never scaled up. ``max_steps`` <= 0
    (a length the trainer has not fixed): the policy's own."""
    every = {spec.name: spec.every for spec in policy.probes}
    scheduled = [e for e in every.values() if e]
    if max_steps <= 0 or not scheduled:
        return every
    factor = min(1.0, max(1, max_steps // READINGS) / min(scheduled))
    return {name: max(1, round(e * factor)) if e else e for name, e in every.items()}


# The share of a run's readings a preset's setpoint ramp may take: the dpo-kl ramp was measured
# at 8 of a 40-step run's 20 readings (probe every 2); a shorter run gets a ramp as much shorter.
RAMP_SHARE = 0.4


def fitted_ramps(policy: PolicyDocument, every: Mapping[str, int | None], max_steps: int) -> PolicyDocument:
    """``policy`` with each controller's ``setpoint_ramp`` (in probe intervals) cut to at most
    ``RAMP_SHARE`` of the readings its probe takes in ``max_steps`` (``every``: probe name → the
    interval it runs at), as :func:`fitted_intervals` fits the intervals: the ramp ends within the
    first 40% of any run instead of holding a lower target through a short one. Never lengthened;
    ``max_steps`` <= 0: the policy as it is."""
    if max_steps <= 0:
        return policy
    document = policy.model_dump(mode="json")
    changed = False
    for doc, spec in zip(document["controllers"], policy.controllers):
        interval = every.get(probe_for_key(spec.probe) or "") if spec.probe else None
        ramp = getattr(spec, "setpoint_ramp", 0.0) or 0.0
        if not ramp or not interval:
            continue
        fitted = float(int(RAMP_SHARE * (max_steps // interval)))
        if fitted < ramp:
            doc["setpoint_ramp"], changed = fitted, True
    return load_policy(document) if changed else policy


def tokenizer_of(processing_class: Any) -> Any:
    """The tokenizer inside a trainer's ``processing_class`` (a multimodal processor holds one)."""
    return getattr(processing_class, "tokenizer", processing_class)


def build_probe(name: str, tokenizer: Any, *, reference: Any = None, teacher: Any = None) -> Probe:
    """The shipped stand-in for probe ``name``: its registered class's ``for_preset`` (each says the
    sizes it picks, and why; ``actuator.agents.probes.register``).

    Raises :class:`~actuator.agents.probes.ProbeSetupError` saying what is missing when nothing
    shipped can stand in for it."""
    return build(name, tokenizer, reference=reference, teacher=teacher)


@dataclass
class MissingProbes:
    """What :func:`missing_probes` found: the probes built, and the ones that could not be, as
    messages (``blocking``: a controller reads it; ``degraded``: only guardrails do)."""

    built: list[Probe] = field(default_factory=list)
    blocking: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)


def _read_by(controller: ControllerSpec) -> set[str]:
    """The probes (by name) a controller acts on: its probe and, for a maximiser, its cost."""
    return {name for key in (controller.probe, controller.cost) if key for name in [probe_for_key(key)] if name}


def controller_probes(policy: PolicyDocument) -> set[str]:
    """The probes (by name) whose readings a controller of ``policy`` acts on."""
    return {name for c in policy.controllers for name in _read_by(c)}


def compared_probes(policy: PolicyDocument) -> set[str]:
    """The probes (by name) whose readings ``policy`` compares with a number stated on the whole
    measurement: a guardrail's threshold (absolute, or relative to the first or best whole reading)
    and a relative setpoint ('+7%' of the first reading). A reading on a subset of the probe's
    examples is another measure: on SmolLM2 the perplexity of 4 of the 8 held-out sentences read
    +24% over all 8 for the same weights, past a '+20%' ceiling with nothing trained. These probes
    run whole or are skipped for budget, never subsampled (``ProbeSuite(whole=...)``)."""
    keys = [g.probe for g in policy.guardrails]
    keys += [c.probe for c in policy.controllers if isinstance(getattr(c, "setpoint", None), str)]
    return {name for key in keys if key for name in [probe_for_key(key)] if name}


def missing_probes(policy: PolicyDocument, given: Collection[str], tokenizer: Any, *, reference: Any = None,
                   teacher: Any = None) -> MissingProbes:
    """Build every probe ``policy.probes`` names that is not in ``given`` (probe names)."""
    out = MissingProbes()
    for spec in policy.probes:
        if spec.name in given:
            continue
        try:
            out.built.append(build_probe(spec.name, tokenizer, reference=reference, teacher=teacher))
        except ProbeSetupError as exc:
            users = [c.name for c in policy.controllers if spec.name in _read_by(c)]
            if users:
                out.blocking.append(f"probes.{spec.name}: controller {', '.join(users)} acts on it and it cannot be "
                                    f"built here: {exc}")
            else:
                rails = [g.name for g in policy.guardrails if probe_for_key(g.probe) == spec.name]
                out.degraded.append(f"probe {spec.name} cannot be built here ({exc}); guardrail "
                                    f"{', '.join(rails) or '(none)'} on it can never fire")
    return out
