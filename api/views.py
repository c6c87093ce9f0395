"""Row → wire-model conversions shared by the routers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actuator.models import DecisionRow, PolicyRow, RunRow
from actuator.schemas import DecisionPublic, KeptCheckpoint, KnobSpec, PolicyPublic, RunPublic, RunState

__all__ = ["run_public", "run_state", "decision_public", "policy_public"]


def _knobs(run: RunRow) -> dict[str, KnobSpec]:
    return {k: KnobSpec.model_validate({f: v[f] for f in ("name", "value", "min", "max", "scale", "max_step")})
            for k, v in run.knobs.items()}


def run_public(run: RunRow, in_effect: Mapping[str, float] | None = None, policy: Any = None) -> RunPublic:
    """``in_effect``: the run's knob values in effect (``Store.knobs_in_effect``); None only where
    nothing can have been acknowledged yet (a registration), which leaves the stored observed ones."""
    return RunPublic(
        id=run.id, name=run.name, state=run.state, policy_name=run.policy_name,
        policy_version=run.policy_version, knobs=_knobs(run), last_step=run.last_step,
        last_seq=run.last_seq, created_at=run.created_at, updated_at=run.updated_at,
        knobs_in_effect=dict(run.knobs_in_effect if in_effect is None else in_effect),
        kept=KeptCheckpoint.from_metrics(run.latest_metrics or {}, _keep_best(policy)),
    )


def _keep_best(policy: Any) -> Any:
    """The run's policy's ``rewind.keep_best`` (None without one, or without the policy at hand)."""
    return getattr(getattr(policy, "rewind", None), "keep_best", None)


def run_state(run: RunRow, in_effect: Mapping[str, float], policy: Any = None) -> RunState:
    base = run_public(run, in_effect, policy).model_dump()
    return RunState(
        **base,
        latest_probes=run.latest_probes,
        latest_metrics=run.latest_metrics,
        controllers=run.controllers,
        guardrails=run.guardrails,
        decisions=run.decision_count,
    )


def decision_public(d: DecisionPublic | DecisionRow) -> DecisionPublic:
    """The stored decision record (the store's hot path returns it already; a table row is read
    field by field of the record)."""
    return d if isinstance(d, DecisionPublic) else DecisionPublic.model_validate(d, from_attributes=True)


def policy_public(p: PolicyRow) -> PolicyPublic:
    return PolicyPublic(id=p.id, name=p.name, version=p.version, archived=p.archived,
                        created_at=p.created_at, document=p.document)
