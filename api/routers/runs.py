"""Runs: register, list, state, observations (the agent's hot path), decisions, halt/finish."""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from sqlalchemy import select

from actuator._exceptions import PolicyError
from actuator.controllers import registration
from actuator.engine import Engine
from actuator.models import ObservationRow, PolicyRow, RunRow
from actuator.policy import PolicyDocument, load_policy
from actuator.run_state import PROBE_REPORT, STARVED_PREFIX, starved_probes
from actuator.schemas import (
    Acknowledged,
    AutoGainsFallback,
    AutoGainsTuned,
    DecisionAck,
    DecisionEvent,
    DecisionPage,
    IngestResult,
    Notice,
    ObservationBatch,
    ObservationEvent,
    RunCreate,
    RunCreated,
    RunPublic,
    RunState,
    RUN_STATES,
    RunStateName,
    StateChanged,
)
from actuator.store import IngestOutcome, ObservationRefused, RunTokenRefused, stored_policy

from ..deps import (
    AdminDep,
    Offset,
    PageSize,
    ReaderDep,
    RunAuthDep,
    RunId,
    RunOrAdminDep,
    RunReaderDep,
    Services,
    ServicesDep,
    forbidden_run_token,
    policy_ref,
    run_not_found,
)
from ..errors import ApiError, error_responses
from ..views import decision_public, run_public, run_state
from .policies import publish_policy

router = APIRouter(prefix="/v1/runs", tags=["runs"])
_STATE_PATTERN = f"^({'|'.join(RUN_STATES)})$"  # a pattern, not the Literal: the 422's words stay as they were


def _unprocessable(message: str, errors: list[dict[str, Any]] | None = None) -> ApiError:
    return ApiError(422, message, errors or [{"loc": "body", "msg": message}])


def _resolve_policy(services: Services, body: RunCreate) -> tuple[PolicyRow | None, PolicyDocument]:
    """A stored policy by name (``name`` or ``name@version``) or an inline document.
    Returns (row, or None for an inline document: stored at registration, or the latest version
    if that holds the same document), document)."""
    if isinstance(body.policy, str):
        name, version, ok = policy_ref(body.policy)
        if not ok:
            raise _unprocessable(f"policy: bad version in {body.policy!r}; use name@3",
                                 [{"loc": "body.policy", "msg": f"bad version in {body.policy!r}"}])
        row = services.store.get_policy(name, version)
        if row is None or row.archived:
            raise _unprocessable(f"policy: no policy named {body.policy!r}",
                                 [{"loc": "body.policy", "msg": f"policy {body.policy!r} not found"}])
        return row, stored_policy(row)
    try:
        doc = load_policy(body.policy)
    except PolicyError as exc:
        errors = [{**e, "loc": f"body.policy.{e['loc']}"} for e in exc.errors]
        raise _unprocessable(f"policy: {exc}", errors) from exc
    return None, doc


def _check_knobs(doc: PolicyDocument, body: RunCreate) -> None:
    """The policy against the knobs it will drive: what would fail at every observation is
    refused now, naming the policy's field."""
    knobs = {k.name: k.model_dump(mode="json") for k in body.knobs}
    errors = [{"loc": f"body.policy.{e['loc']}", "msg": e["msg"]} for e in Engine(doc).knob_errors(knobs)]
    if errors:
        raise ApiError(422, None, errors)


def _identifies(spec: Any) -> bool:
    """A gains-auto controller of a kind whose law a warm-up step test can tune (its registration)."""
    return registration(spec.kind).law.identifies and spec.gains == "auto"


def _check_identification(doc: PolicyDocument, body: RunCreate) -> None:
    """Each declared warm-up step test names the policy's gains-auto controller and its knob."""
    controllers = {c.name: c for c in doc.controllers}
    errors = []
    for i, window in enumerate(body.identification):
        spec = controllers.get(window.controller)
        if spec is None or not _identifies(spec):
            auto = [c.name for c in doc.controllers if _identifies(c)]
            errors.append({"loc": f"body.identification.{i}.controller",
                           "msg": f"{window.controller!r} is not a gains-auto controller of the policy (those: {auto})"})
        elif window.knob != spec.knob:
            errors.append({"loc": f"body.identification.{i}.knob",
                           "msg": f"controller {spec.name!r} drives {spec.knob!r}, not {window.knob!r}"})
    if errors:
        raise ApiError(422, None, errors)


def _check_catalogue(body: RunCreate) -> None:
    """The run's declared catalogue entries (already valid as entries) against the service's own:
    a name the service has must be declared as the service has it."""
    errors = [{**e, "loc": f"body.{e['loc']}"} for e in body.catalogue.conflicts()] if body.catalogue else []
    if errors:
        raise ApiError(422, None, errors)


def _check_storable(body: RunCreate) -> None:
    """What pydantic lets through but the store cannot hold: NUL in text (Postgres refuses it)
    and non-finite metadata numbers (not JSON)."""
    errors = []
    if "\x00" in body.name:
        errors.append({"loc": "body.name", "msg": "must not contain NUL characters"})
    for key, value in body.metadata.items():
        if isinstance(value, float) and not math.isfinite(value):
            errors.append({"loc": f"body.metadata.{key}", "msg": "Input should be a finite number"})
        elif "\x00" in key or (isinstance(value, str) and "\x00" in value):
            errors.append({"loc": f"body.metadata.{key}", "msg": "must not contain NUL characters"})
    if errors:
        raise ApiError(422, None, errors)


def starved(services: Services, runs: Sequence[RunRow]) -> dict[str, list[str]]:
    """Per run, the probes its latest probe report says the budget starves. The run's merged
    latest metrics keep a count once reported, after the probe has run again, so they only tell
    which runs ever had one; those read their latest report."""
    out: dict[str, list[str]] = {}
    for run in runs:
        out[run.id] = []
        if not any(k.startswith(STARVED_PREFIX) for k in run.latest_metrics):
            continue
        query = (select(ObservationRow.metrics)
                 .where(ObservationRow.run_id == run.id, ObservationRow.metrics[PROBE_REPORT].as_float().is_not(None))
                 .order_by(ObservationRow.seq.desc()).limit(1))
        with services.store.sessions() as s:
            report = s.scalar(query)
        out[run.id] = starved_probes(report or {})
    return out


@router.post("", status_code=201, response_model=RunCreated,
             responses=error_responses(400, 401, 403, 409, 413, 422, 503), summary="Register a run")
def register_run(body: RunCreate, _: AdminDep, services: ServicesDep) -> RunCreated:
    _check_storable(body)
    _check_catalogue(body)
    # the policy is read with the knobs and probes the run declares beside the service's own
    with body.catalogue.declared() if body.catalogue else nullcontext():
        row, doc = _resolve_policy(services, body)
        _check_knobs(doc, body)  # before storing anything
        _check_identification(doc, body)
    if row is None:
        row = publish_policy(services, doc, reuse_identical=True, catalogue=body.catalogue)
    run, token = services.store.create_run(body, row)
    services.metrics.observe_registration(run.id, run.state, {k.name: k.value for k in body.knobs})
    return RunCreated(**run_public(run).model_dump(), token=token, policy=row.document,
                      identification=body.identification)


@router.get("", response_model=list[RunPublic], responses=error_responses(401, 403, 422, 503), summary="List runs")
def list_runs(
    _: ReaderDep,
    services: ServicesDep,
    state: Annotated[str | None, Query(pattern=_STATE_PATTERN)] = None,
    name: Annotated[str | None, Query(max_length=128, pattern=r"^[^\x00]*$")] = None,
    limit: Annotated[PageSize, Query()] = 100,
    offset: Annotated[Offset, Query()] = 0,
) -> list[RunPublic]:
    rows = services.store.list_runs(state=state, name=name, limit=limit, offset=offset)
    hungry = starved(services, rows)
    effect = services.store.knobs_in_effect(rows)
    return [run_public(r, effect[r.id], _policy(services, r)).model_copy(update={"starved": hungry[r.id]})
            for r in rows]


def _policy(services: Services, run: RunRow) -> PolicyDocument | None:
    """The run's policy document when the run reports a kept checkpoint (keep-best), else None."""
    if "keep_best.step" not in (run.latest_metrics or {}):
        return None
    return services.store.policy_engine(run.policy_id).policy


@router.get("/{run_id}", response_model=RunState, responses=error_responses(401, 403, 404, 422, 503),
            summary="A run's state: knobs, probes, controllers")
def get_run(run_id: RunId, _: RunReaderDep, services: ServicesDep) -> RunState:
    run = services.store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    hungry = starved(services, [run])[run.id]
    fired = services.store.breach_counts(run.id)
    guardrails = {name: {**g, "fired": fired.get(name, 0)} for name, g in run.guardrails.items()}
    return run_state(run, services.store.knobs_in_effect([run])[run.id], _policy(services, run)).model_copy(
        update={"starved": hungry, "starved_readings": services.store.probe_readings(run.id, hungry),
                "guardrails": guardrails})


@router.post("/{run_id}/observations", response_model=IngestResult,
             responses=error_responses(400, 401, 403, 404, 409, 413, 422, 503),
             summary="Post a batch of observations; returns the decisions to apply")
def post_observations(batch: ObservationBatch, run: RunAuthDep, services: ServicesDep) -> Response:
    if len(batch.observations) > services.settings.max_batch:
        raise _unprocessable(f"observations: at most {services.settings.max_batch} per request")
    try:
        out = services.store.ingest(run.id, batch, token_hash=run.token_hash,
                                    max_pending=services.settings.max_pending_decisions)
    except ObservationRefused as exc:  # nothing of the batch was stored
        raise ApiError(exc.status, str(exc), [{"loc": f"body.{exc.loc}", "msg": exc.message}]) from exc
    except RunTokenRefused as exc:  # the run's token changed since it was verified
        services.tokens.forget(run.id)
        raise forbidden_run_token() from exc
    if out is None:  # gone since auth
        services.tokens.forget(run.id)
        raise run_not_found(run.id)
    _export(services, out, batch.applied)
    result = IngestResult(
        accepted=out.accepted, duplicates=out.duplicates,
        decisions=[decision_public(d) for d in out.decisions], more_decisions=out.more_decisions,
        actions=out.actions,
        state=out.run.state,
        knobs={k: float(v.value) for k, v in out.run.context.knobs.items()},
        breached=sorted(name for name, st in out.run.context.guardrails.items() if st.active),
        last_step=out.run.last_step,
        notices=[Notice(kind=e.kind, controller=e.controller, message=_notice(e)) for e in out.events
                 if isinstance(e, (AutoGainsTuned, AutoGainsFallback))]
        + ([Notice(kind=out.resync.kind, message=out.resync.message())] if out.resync is not None else []),
        epoch=out.run.epoch, resumed_after=out.resync.resumed_after if out.resync is not None else None,
    )
    # Serialized here: returning the model would make FastAPI validate it again, in the thread
    # pool (one more hand-off per request), before serializing it the same way.
    return Response(result.model_dump_json(), media_type="application/json")


def _notice(event: AutoGainsTuned | AutoGainsFallback) -> str:
    """What the agent tells the user of a gains-auto outcome."""
    if isinstance(event, AutoGainsFallback):
        return event.reason
    fit, g, pred = event.fit, event.gains, event.predicted
    settles = f"settles in {pred.settling_steps} steps" if pred.settling_steps is not None else "does not settle"
    over = f", overshoot {pred.overshoot_pct:.1f}%" if pred.overshoot_pct is not None else ""
    return (f"gains auto: {event.controller!r} tuned from the warm-up step test on {event.knob} (steps "
            f"{event.window[0]}-{event.window[1]}): {fit.model} gain {fit.gain:.4g}, tau {fit.tau:.3g}, theta "
            f"{fit.theta:.3g} steps, R2 {fit.r2:.2f}; kp {g.kp:.4g} ki {g.ki:.4g} kd {g.kd:.4g} ({g.direction}); "
            f"the replay {settles}{over}")


def _export(services: Services, out: IngestOutcome, acks: list[DecisionAck]) -> None:
    """Metrics and live events for one ingest (after commit: never inside the transaction).
    ``acks``: the agent's acknowledgements the request carried (each is an ``acknowledged``
    event: they change the knobs in effect, and may come on a batch with no new observation)."""
    services.metrics.observe_ingest(out)
    if services.notifier is not None:
        services.notifier.notify_ingest(out)  # queued: ingest never waits on the webhook
    run = out.run
    events = [*out.events,
              *(ObservationEvent(seq=obs.seq, step=obs.step, probes=obs.probes, knobs=obs.knobs)
                for obs in out.new_observations),
              *(DecisionEvent.model_validate(d, from_attributes=True) for d in out.created),
              *(Acknowledged(**a.model_dump()) for a in acks)]
    # One round trip to Redis for the whole request (it was one per event).
    services.live.publish_many(run.id, events, touch=(run.last_step or 0) if out.accepted else None)


@router.get("/{run_id}/decisions", response_model=DecisionPage,
            responses=error_responses(401, 403, 404, 422, 503), summary="Decisions of a run, paged")
def list_decisions(
    run_id: RunId,
    _: RunReaderDep,
    services: ServicesDep,
    offset: Annotated[Offset, Query()] = 0,
    limit: Annotated[PageSize, Query()] = 100,
    after: Annotated[Offset | None, Query(description="Only decisions with number > after")] = None,
) -> DecisionPage:
    if services.store.get_run(run_id) is None:
        raise run_not_found(run_id)
    rows, total = services.store.list_decisions(run_id, offset=offset, limit=limit, after=after)
    return DecisionPage(items=[decision_public(d) for d in rows], total=total, offset=offset, limit=limit)


def _transition(services: Services, run_id: str, to: RunStateName, allowed: tuple[RunStateName, ...],
                reason: str) -> RunPublic:
    run = services.store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    if run.state not in allowed:
        raise ApiError(409, f"run is {run.state}; cannot move to {to}")
    row = services.store.set_state(run_id, to, reason)
    assert row is not None
    services.metrics.set_state(run_id, to)
    services.live.publish(run_id, StateChanged(to=to, reason=reason))
    return run_public(row, services.store.knobs_in_effect([row])[row.id])


@router.post("/{run_id}/halt", response_model=RunPublic, responses=error_responses(401, 403, 404, 409, 422, 503),
             summary="Halt a run (the agent stops training cleanly)")
def halt_run(run: RunOrAdminDep, services: ServicesDep) -> RunPublic:
    return _transition(services, run.id, "halted", ("running", "paused"), "halted by request")


@router.post("/{run_id}/finish", response_model=RunPublic, responses=error_responses(401, 403, 404, 409, 422, 503),
             summary="Mark a run finished (the agent does at train end)")
def finish_run(run: RunOrAdminDep, services: ServicesDep) -> RunPublic:
    return _transition(services, run.id, "finished", ("running", "paused", "halted"), "training ended")
