"""Operator control of a live run: pause/resume, manual override, setpoint, policy moves, audit."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import HTMLResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actuator import operations as ops
from actuator.policy import ControllerSpec, PolicyDocument
from actuator.schemas import FiniteFloat, Name, RunState

from ..deps import MAX_INT, AdminDep, RunId, Services, ServicesDep, policy_ref
from ..views import decision_public, run_state

router = APIRouter(prefix="/v1/runs", tags=["control"])
log = logging.getLogger("actuator.api")


class OverrideBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: FiniteFloat
    note: str = Field("", max_length=500, pattern=r"^[^\x00]*$")


class SetpointBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    setpoint: FiniteFloat | list[tuple[Annotated[int, Field(ge=0, le=MAX_INT)], FiniteFloat]]


class MoveBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str = Field(description="name@version (or name: its latest version)")
    reason: str = Field("", max_length=500, pattern=r"^[^\x00]*$")


def _policy(services: Services, run: Any) -> PolicyDocument:
    return services.engine_for(run.policy_id).policy


def _act(services: Services, run_id: str, op: Any) -> dict[str, Any]:
    try:
        out = services.store.mutate(run_id, op)
    except ValueError as exc:
        field, _, msg = str(exc).partition(": ")
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                            {"message": str(exc), "errors": [{"loc": f"body.{field}", "msg": msg or str(exc)}]}) from exc
    if out is None:
        raise HTTPException(404, f"run {run_id!r} not found")
    run, rows, events = out
    services.metrics.observe_control(run, rows)
    services.live.publish_many(run.id, events)
    return {"run": run_state(run), "decisions": [decision_public(d) for d in rows], "events": events}


def _run(services: Services, run_id: str) -> Any:
    run = services.store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"run {run_id!r} not found")
    return run


@router.post("/{run_id}/pause", summary="Pause control (the run trains on; knobs hold)")
def pause(run_id: RunId, _: AdminDep, services: ServicesDep) -> dict[str, Any]:
    _run(services, run_id)
    return _act(services, run_id, ops.pause)


@router.post("/{run_id}/resume", summary="Resume control (bumpless from the values in effect)")
def resume(run_id: RunId, _: AdminDep, services: ServicesDep) -> dict[str, Any]:
    _run(services, run_id)
    return _act(services, run_id, ops.resume)


@router.post("/{run_id}/knobs/{knob}/override", summary="Pin a knob to a value (controllers track it)")
def override(run_id: RunId, knob: Annotated[str, Path(max_length=64)], body: OverrideBody, _: AdminDep,
             services: ServicesDep) -> dict[str, Any]:
    _run(services, run_id)
    return _act(services, run_id, lambda ctx, run: ops.override_knob(ctx, run, knob, body.value, body.note))


@router.delete("/{run_id}/knobs/{knob}/override", summary="Hand a knob back to control (bumpless)")
def release(run_id: RunId, knob: Annotated[str, Path(max_length=64)], _: AdminDep,
            services: ServicesDep) -> dict[str, Any]:
    run = _run(services, run_id)
    policy = _policy(services, run)
    return _act(services, run_id, lambda ctx, r: ops.release_knob(ctx, r, knob, policy))


@router.put("/{run_id}/controllers/{controller}/setpoint", summary="Change a controller's setpoint for this run")
def setpoint(run_id: RunId, controller: Annotated[str, Path(max_length=64)], body: SetpointBody, _: AdminDep,
             services: ServicesDep) -> dict[str, Any]:
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
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                                {"message": "; ".join(f"{e['loc']}: {e['msg']}" for e in errors),
                                 "errors": errors}) from exc
    return _act(services, run_id, lambda ctx, r: ops.set_setpoint(ctx, r, controller, sp, policy))


@router.post("/{run_id}/policy", response_model=RunState, summary="Move a live run to another policy version (audited)")
def move_policy(run_id: RunId, body: MoveBody, _: AdminDep, services: ServicesDep) -> RunState:
    run = _run(services, run_id)
    name, version, ok = policy_ref(body.policy)
    row = services.store.get_policy(name, version) if ok else None
    if row is None:
        raise HTTPException(422, {"message": f"policy: {body.policy!r} not found",
                                  "errors": [{"loc": "body.policy", "msg": "not found"}]})
    # The new policy against the run's knobs: what would fail at every observation is refused now.
    errors = [{"loc": f"body.policy.{e['loc']}", "msg": f"{row.name}@{row.version}: {e['msg']}"}
              for e in services.engine_for(row.id).knob_errors(run.knobs)]
    if errors:
        raise HTTPException(422, {"message": "; ".join(f"{e['loc']}: {e['msg']}" for e in errors), "errors": errors})
    moved = services.store.move_policy(run_id, row, body.reason)
    assert moved is not None
    services.live.publish(run_id, {"kind": "policy_moved", "to": f"{row.name}@{row.version}"})
    return run_state(moved)


@router.get("/{run_id}/events", summary="The run's audit events (breaches, overrides, moves, state)")
def events(run_id: RunId, services: ServicesDep) -> list[dict[str, Any]]:
    _run(services, run_id)
    return [{"id": e.id, "kind": e.kind, "step": e.step, "payload": e.payload, "created_at": e.created_at}
            for e in services.store.list_events(run_id)]


@router.get("/{run_id}/report", summary="Run report: JSON, or a plot (format=png) or page (format=html)",
            responses={200: {"content": {"application/json": {}, "image/png": {}, "text/html": {}}}})
def report(run_id: RunId, services: ServicesDep,
           format: Annotated[str, Query(pattern="^(json|png|html)$")] = "json") -> Any:
    from actuator.report import build_report, render_html, render_png

    run = _run(services, run_id)
    decisions, _ = services.store.list_decisions(run_id, limit=100_000)
    data = build_report(run, services.store.list_observations(run_id, limit=1_000_000), decisions,
                        services.store.list_events(run_id), _policy(services, run))
    if format == "png":
        return Response(render_png(data), media_type="image/png")
    if format == "html":
        return HTMLResponse(render_html(data))
    return data


@router.get("/{run_id}/stream", summary="Server-Sent Events: the run's observations, decisions and breaches live",
            response_class=StreamingResponse)
async def stream(run_id: RunId, request: Request, services: ServicesDep,
                 max_seconds: Annotated[float, Query(gt=0, le=86400)] = 3600.0) -> StreamingResponse:
    if await run_in_threadpool(services.store.get_run, run_id) is None:
        raise HTTPException(404, f"run {run_id!r} not found")
    last = request.headers.get("last-event-id", "0")
    after = int(last) if last.isascii() and last.isdigit() else 0

    async def events() -> AsyncIterator[str]:
        nonlocal after
        deadline = time.monotonic() + max_seconds
        yield "retry: 2000\n\n"
        while time.monotonic() < deadline and not await request.is_disconnected():
            try:
                recent = await run_in_threadpool(services.live.recent, run_id, after)
            except Exception as exc:  # noqa: BLE001 - the response has started: no 503 possible now
                # Live state unreachable: end the stream cleanly; the client reconnects after the
                # retry interval sent above (instead of a traceback and a cut connection).
                if type(exc).__module__.startswith("redis"):
                    services.metrics.backend_errors.labels("redis").inc()
                log.warning("live events unavailable for a stream: %s", type(exc).__name__)
                return
            for eid, ev in recent:
                after = eid
                yield f"id: {eid}\nevent: {ev.get('kind', 'message')}\ndata: {json.dumps(ev, default=str)}\n\n"
            await asyncio.sleep(0.2)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
