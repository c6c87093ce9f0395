"""Operator control of a live run: pause/resume, manual override, setpoint, policy moves, audit."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema
from starlette.concurrency import run_in_threadpool

from actuator import operations as ops
from actuator.live import EventId
from actuator.policy import ControllerSpec, PolicyDocument
from actuator.schemas import (
    MAX_SETPOINT_POINTS,
    ControlResult,
    ErrorPublic,
    EventPublic,
    FiniteFloat,
    PolicyMoved,
    ReportPublic,
    RunState,
)

from actuator.report import RendererBusy

from .. import jobs
from ..pages import REPORT_HEADERS
from ..deps import (
    MAX_INT,
    AdminDep,
    Offset,
    PageSize,
    RunId,
    RunReaderDep,
    ReadCredentials,
    STREAM_TICKET_PATTERN,
    STREAM_TICKET_SECONDS,
    Services,
    ServicesDep,
    policy_ref,
    require_run_reader,
    admin_bearer,
    require_admin,
    run_not_found,
    stream_ticket,
    stream_ticket_valid,
)
from ..errors import ApiError, error_responses
from ..streams import RESPONSES_429, stream_events, take_stream_slot
from ..views import decision_public, run_state

# Every route here names a run (404, 422 for a malformed id) and reads the store (503).
router = APIRouter(prefix="/v1/runs", tags=["control"], responses=error_responses(404, 422, 503))
_CONTROL_ERRORS = error_responses(401, 403)
_READ_ERRORS = error_responses(401, 403)  # token mode: see api.deps.require_run_reader
_CONTROL_BODY_ERRORS = error_responses(400, 401, 403, 413)
log = logging.getLogger("actuator.api")


class OverrideBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: FiniteFloat
    note: str = Field("", max_length=500, pattern=r"^[^\x00]*$")


class SetpointBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    setpoint: FiniteFloat | Annotated[list[tuple[Annotated[int, Field(ge=0, le=MAX_INT)], FiniteFloat]],
                                      Field(min_length=1, max_length=MAX_SETPOINT_POINTS)]


class MoveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(description="name@version (or name: its latest version)")
    reason: str = Field("", max_length=500, pattern=r"^[^\x00]*$")


def _policy(services: Services, run: Any) -> PolicyDocument:
    return services.engine_for(run.policy_id).policy


def _act(services: Services, run_id: str, op: Any) -> ControlResult:
    try:
        out = services.store.mutate(run_id, op)
    except ValueError as exc:
        field, _, msg = str(exc).partition(": ")
        raise ApiError(422, str(exc), [{"loc": f"body.{field}", "msg": msg or str(exc)}]) from exc
    if out is None:
        raise run_not_found(run_id)
    run, ctx, rows, events = out
    services.metrics.observe_control(run.id, ctx, rows)
    services.live.publish_many(run.id, events)
    return ControlResult(run=run_state(run, services.store.knobs_in_effect([run])[run.id]),
                         decisions=[decision_public(d) for d in rows], events=events)


def _run(services: Services, run_id: str) -> Any:
    run = services.store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    return run


@router.post("/{run_id}/pause", response_model=ControlResult, responses=_CONTROL_ERRORS,
             summary="Pause control (the run trains on; knobs hold)")
def pause(run_id: RunId, _: AdminDep, services: ServicesDep) -> ControlResult:
    _run(services, run_id)
    return _act(services, run_id, ops.pause)


@router.post("/{run_id}/resume", response_model=ControlResult, responses=_CONTROL_ERRORS,
             summary="Resume control (bumpless from the values in effect)")
def resume(run_id: RunId, _: AdminDep, services: ServicesDep) -> ControlResult:
    _run(services, run_id)
    return _act(services, run_id, ops.resume)


@router.post("/{run_id}/knobs/{knob}/override", response_model=ControlResult, responses=_CONTROL_BODY_ERRORS,
             summary="Pin a knob to a value (controllers track it)")
def override(run_id: RunId, knob: Annotated[str, Path(max_length=64)], body: OverrideBody, _: AdminDep,
             services: ServicesDep) -> ControlResult:
    _run(services, run_id)
    return _act(services, run_id, lambda ctx, run: ops.override_knob(ctx, run, knob, body.value, body.note))


@router.delete("/{run_id}/knobs/{knob}/override", response_model=ControlResult, responses=_CONTROL_ERRORS,
               summary="Hand a knob back to control (bumpless)")
def release(run_id: RunId, knob: Annotated[str, Path(max_length=64)], _: AdminDep,
            services: ServicesDep) -> ControlResult:
    run = _run(services, run_id)
    policy = _policy(services, run)
    return _act(services, run_id, lambda ctx, r: ops.release_knob(ctx, r, knob, policy))


@router.put("/{run_id}/controllers/{controller}/setpoint", response_model=ControlResult,
            responses=_CONTROL_BODY_ERRORS, summary="Change a controller's setpoint for this run")
def setpoint(run_id: RunId, controller: Annotated[str, Path(max_length=64)], body: SetpointBody, _: AdminDep,
             services: ServicesDep) -> ControlResult:
    run = _run(services, run_id)
    policy = _policy(services, run)
    sp = body.setpoint if not isinstance(body.setpoint, list) else [list(p) for p in body.setpoint]
    spec = next((c for c in policy.controllers if c.name == controller), None)
    if spec is not None:
        # The policy's own rules for a setpoint (schedule steps increasing, inside the probe's
        # range), which a setpoint given here must meet as much as one in the document.
        try:
            ControllerSpec.model_validate({**spec.model_dump(), "setpoint": sp})
        except ValidationError as exc:
            errors = [{"loc": "body.setpoint", "msg": str(e["msg"]).removeprefix("Value error, ")}
                      for e in exc.errors()]
            raise ApiError(422, None, errors) from exc
    return _act(services, run_id, lambda ctx, r: ops.set_setpoint(ctx, r, controller, sp, policy))


@router.post("/{run_id}/policy", response_model=RunState, responses=_CONTROL_BODY_ERRORS,
             summary="Move a live run to another policy version (audited)")
def move_policy(run_id: RunId, body: MoveBody, _: AdminDep, services: ServicesDep) -> RunState:
    run = _run(services, run_id)
    name, version, ok = policy_ref(body.policy)
    row = services.store.get_policy(name, version) if ok else None
    if row is None:
        raise ApiError(422, f"policy: {body.policy!r} not found", [{"loc": "body.policy", "msg": "not found"}])
    # The new policy against the run's knobs: what would fail at every observation is refused now.
    errors = [{"loc": f"body.policy.{e['loc']}", "msg": f"{row.name}@{row.version}: {e['msg']}"}
              for e in services.engine_for(row.id).knob_errors(run.knobs)]
    if errors:
        raise ApiError(422, None, errors)
    moved = services.store.move_policy(run_id, row, body.reason)
    assert moved is not None
    services.live.publish(run_id, PolicyMoved(to=f"{row.name}@{row.version}"))
    return run_state(moved, services.store.knobs_in_effect([moved])[moved.id])


@router.get("/{run_id}/events", response_model=list[EventPublic], responses=_READ_ERRORS,
            summary="The run's audit events (breaches, overrides, moves, state), paged")
def events(run_id: RunId, _: RunReaderDep, services: ServicesDep,
           after: Annotated[Offset | None, Query(description="Only events with id > after "
                                                 "(the last id of the previous page)")] = None,
           limit: Annotated[PageSize, Query()] = 100) -> list[EventPublic]:
    _run(services, run_id)
    return [EventPublic(id=e.id, kind=e.kind, step=e.step, payload=e.payload, created_at=e.created_at)
            for e in services.store.list_events(run_id, after=after, limit=limit)]


@router.get("/{run_id}/report", response_model=ReportPublic,
            summary="Run report: JSON, or a plot (format=png) or page (format=html)",
            description="Bounded whatever the run's length: each series is downsampled to at most "
                        "ACTUATOR_REPORT_POINTS points (every k-th observation and the last; `sampling` says "
                        "which), only the latest ACTUATOR_REPORT_DECISIONS decisions and "
                        "ACTUATOR_REPORT_EVENTS events are listed (`decisions_omitted`, `events_omitted` "
                        "count the rest), a plot draws at most ACTUATOR_REPORT_PANELS panels. A plot (png, html) is drawn "
                        "in a worker process, off the serving workers (at most ACTUATOR_RENDER_CONCURRENCY in "
                        "progress per serving process: 429 with Retry-After past it), and needs the admin token "
                        "when one is set.",
            responses={**_READ_ERRORS,
                       200: {"content": {"image/png": {"schema": {"type": "string", "format": "binary"}},
                                         "text/html": {"schema": {"type": "string"}}}},
                       **error_responses(401, 403, 429),
                       503: {"model": ErrorPublic,
                             "description": "Store or live state unavailable, or every worker process stayed busy: "
                                            "retry after Retry-After seconds"}})
async def report(run_id: RunId, _: RunReaderDep, request: Request, services: ServicesDep,
                 format: Annotated[str, Query(pattern="^(json|png|html)$")] = "json") -> Any:
    if format != "json":  # a plot costs more than a read: the admin's, when a token is set
        await require_admin(await admin_bearer(request), services)
    if format == "json":
        return await run_in_threadpool(_report_data, run_id, services)
    with services.cpu.turn("render"):  # before the reads: a refused request costs nothing
        data = await run_in_threadpool(_report_data, run_id, services)
        try:
            _none, drawn = await services.cpu.call(request, "render", jobs.render, data, format,
                                                   services.settings.report_panels, admitted=True)
        except RendererBusy as exc:
            raise ApiError(503, str(exc), headers={"Retry-After": "5"}) from exc
    if format == "png":
        return Response(drawn, media_type="image/png")
    return HTMLResponse(drawn, headers=REPORT_HEADERS)


def _report_data(run_id: str, services: Services) -> dict[str, Any]:
    from actuator.models import EventRow, ObservationRow
    from actuator.report import build_report

    settings = services.settings
    run = _run(services, run_id)
    store = services.store
    total = store.count_for_run(ObservationRow, run_id)
    # Points per series, and the total over all series (a run may report hundreds of names).
    series = max(1, len(run.latest_probes) + len(run.latest_metrics) + len(run.knobs))
    rows = max(10, min(settings.report_points, settings.report_total_points // series))
    every = max(1, -(-total // rows))
    return build_report(run, store.sample_observations(run_id, every, total),
                        store.latest_decisions(run_id, settings.report_decisions),
                        store.list_events(run_id, limit=settings.report_events, latest=True), _policy(services, run),
                        sampling={"observations": total, "every": every, "max_points": rows},
                        decisions_total=run.decision_count,
                        events_total=store.count_for_run(EventRow, run_id))


class StreamTicket(BaseModel):
    ticket: str = Field(description="Pass as `?ticket=` to GET /v1/runs/{id}/stream (this run only).")
    expires_in: int = Field(description="Seconds left to open the stream with it (an open stream is not cut).")


@router.post("/{run_id}/stream/ticket", response_model=StreamTicket, responses=_READ_ERRORS,
             summary="A short-lived ticket to open the run's live stream from a browser",
             description="EventSource cannot send an Authorization header: a page that holds a token gets a "
                         "ticket here (with that token: any token that may read the run) and opens "
                         "`/v1/runs/{id}/stream?ticket=...`. The ticket names this run, is checked when a stream "
                         f"opens, and expires after {STREAM_TICKET_SECONDS} s; nothing is stored. In open mode "
                         "a stream needs no ticket (one is still issued, and ignored).")
async def stream_ticket_for(run_id: RunId, _: RunReaderDep, services: ServicesDep) -> StreamTicket:
    if await run_in_threadpool(services.store.get_run, run_id) is None:
        raise run_not_found(run_id)
    return StreamTicket(ticket=stream_ticket(services.settings, run_id), expires_in=STREAM_TICKET_SECONDS)


async def _streamed_run(run_id: RunId, services: ServicesDep, credentials: ReadCredentials,
                        ticket: Annotated[str | None, Query(max_length=64, pattern=STREAM_TICKET_PATTERN,
                                                            description="From POST /v1/runs/{id}/stream/ticket "
                                                                        "(token mode, instead of a bearer token)")]
                        = None) -> str:
    # A dependency, not the generator's first step: a 401 or 404 must be answered before the stream starts.
    if services.settings.token_mode:
        if ticket is not None:
            if not stream_ticket_valid(services.settings, run_id, ticket):
                raise ApiError(401, f"ticket: expired or not for this run (a ticket lasts {STREAM_TICKET_SECONDS} s): "
                               "get a new one with POST /v1/runs/{id}/stream/ticket",
                               [{"loc": "query.ticket", "msg": "expired or not for this run"}],
                               headers={"WWW-Authenticate": "Bearer"})
        else:
            await require_run_reader(credentials, services, run_id)
    if await run_in_threadpool(services.store.get_run, run_id) is None:
        raise run_not_found(run_id)
    return run_id


# Absent or an event id, never null (a header has none): SkipJsonSchema keeps None out of the
# OpenAPI schema, and with it the pattern, which is put back.
LastEventId = Annotated[str | SkipJsonSchema[None],
                        Header(pattern=EventId.PATTERN, json_schema_extra={"pattern": EventId.PATTERN},
                               description="Resume after this event id (`<epoch>-<n>`; a plain `<n>` is epoch 0)")]


async def _stream_slot(run_id: Annotated[str, Depends(_streamed_run)], request: Request,
                       services: ServicesDep) -> AsyncIterator[str]:
    # A dependency too: a 429 must be answered before the stream starts, and the slot is given back
    # once the response has ended.
    give_back = take_stream_slot(run_id, request, services)
    try:
        yield run_id
    finally:
        give_back()


@router.get("/{run_id}/stream", response_class=EventSourceResponse,
            responses={**error_responses(401, 403, 404, 422, 503, by_reference=True), **RESPONSES_429},
            summary="Server-Sent Events: the run's observations, decisions and breaches live",
            description="Each event's `id` is `<epoch>-<n>`: its number n in the run (1, 2, 3, ...) within "
                        "the epoch its numbering started in (live state that loses its events, e.g. a Redis "
                        "restart, starts a new epoch). Reconnecting with `Last-Event-ID` resumes exactly after "
                        "that event; events no longer kept (about the last 1,000 are) come back as one `gap` "
                        "event with reason `trimmed` naming their numbers, and an id of another epoch (or a "
                        "plain number from before epochs) as a `gap` with reason `restarted`: re-read the run's "
                        "report. Without it, the stream starts with the kept events. Idle streams get a "
                        "keep-alive comment (`: ping`) every `ACTUATOR_STREAM_KEEPALIVE` seconds (15 by default). "
                        "Token mode: a bearer token that may read the run, or `?ticket=` (see "
                        "POST /v1/runs/{id}/stream/ticket). "
                        "At most `ACTUATOR_STREAM_MAX_PER_RUN` streams of a run and "
                        "`ACTUATOR_STREAM_MAX_PER_CLIENT` of a client address are open per worker (429 past "
                        "them); a client more than `ACTUATOR_STREAM_QUEUE` events behind gets a `gap` with "
                        "reason `behind` and its stream ends.")
async def stream(run_id: Annotated[str, Depends(_stream_slot)], request: Request, services: ServicesDep,
                 last_event_id: LastEventId = None,
                 max_seconds: Annotated[float, Query(gt=0, le=86400)] = 3600.0) -> AsyncIterator[ServerSentEvent]:
    after = EventId.parse(last_event_id) if last_event_id is not None else None
    async for item in stream_events(request, services, run_id, after, max_seconds):
        yield item
