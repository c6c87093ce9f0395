"""The run console: HTML pages for a browser at /ui (not part of the REST API's OpenAPI document).

Reads only what the REST reads read, under the same tokens (api.deps: open mode, or a viewer /
the admin token, a run's token for its own page); every action on a page goes through the REST
control endpoints from the browser, with the token the user typed. In token mode a page asked for
without a token that may read it is the locked page (401 or 403, no data).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path as FsPath
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from .. import console
from ..deps import Offset, ReadCredentials, RunId, Services, ServicesDep, Version, require_reader, require_run_reader
from ..errors import ApiError
from .runs import starved

__all__ = ["router", "static_files", "STATIC_DIR"]

STATIC_DIR = FsPath(__file__).resolve().parent.parent / "static"
RUNS_PER_PAGE = 100
POLICY_VERSIONS_LISTED = 1000

router = APIRouter(include_in_schema=False)
PolicyName = Annotated[str, Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")]


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC_DIR)


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status)


def _frame(services: Services) -> console.Frame:
    return console.Frame(token_mode=services.settings.token_mode, docs=services.settings.docs_open)


def _locked(services: Services, refusal: ApiError) -> HTMLResponse:
    return HTMLResponse(console.locked_page(refusal.status_code, refusal.error.message, _frame(services)),
                        status_code=refusal.status_code, headers=refusal.headers)


# The reads' own checks; their refusal becomes the locked page (the error envelope is for clients).
async def _refusal(credentials: ReadCredentials, services: ServicesDep) -> ApiError | None:
    try:
        await require_reader(credentials, services)
    except ApiError as exc:
        return exc
    return None


async def _run_refusal(credentials: ReadCredentials, services: ServicesDep, run_id: RunId) -> ApiError | None:
    try:
        await require_run_reader(credentials, services, run_id)
    except ApiError as exc:
        return exc
    return None


Refusal = Annotated[ApiError | None, Depends(_refusal)]
RunRefusal = Annotated[ApiError | None, Depends(_run_refusal)]


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
def runs(refusal: Refusal, services: ServicesDep, offset: Annotated[Offset, Query()] = 0) -> HTMLResponse:
    if refusal is not None:
        return _locked(services, refusal)
    rows = services.store.list_runs(limit=RUNS_PER_PAGE, offset=offset)
    return _html(console.runs_page(rows, datetime.now(timezone.utc), services.store.knobs_in_effect(rows),
                                   starved(services, rows),
                                   offset=offset, limit=RUNS_PER_PAGE, frame=_frame(services)))


@router.get("/ui/runs/{run_id}")
def run(run_id: RunId, refusal: RunRefusal, services: ServicesDep) -> HTMLResponse:
    if refusal is not None:
        return _locked(services, refusal)
    row = services.store.get_run(run_id)
    if row is None:
        return _html(console.not_found_page(f"run {run_id!r} not found", _frame(services)), 404)
    controllers = [c.name for c in services.engine_for(row.policy_id).policy.controllers]
    return _html(console.run_page(row, controllers, _frame(services)))


@router.get("/ui/policies")
def policies(refusal: Refusal, services: ServicesDep) -> HTMLResponse:
    if refusal is not None:
        return _locked(services, refusal)
    rows = services.store.list_policies(True, limit=POLICY_VERSIONS_LISTED,
                                        max_bytes=services.settings.policy_page_bytes)
    return _html(console.policies_page(rows, _frame(services)))


@router.get("/ui/policies/{name}")
def policy(refusal: Refusal, services: ServicesDep, name: PolicyName,
           version: Annotated[Version | None, Query()] = None,
           a: Annotated[Version | None, Query(description="diff from this version")] = None,
           b: Annotated[Version | None, Query(description="diff to this version")] = None) -> HTMLResponse:
    if refusal is not None:
        return _locked(services, refusal)
    frame = _frame(services)
    latest = services.store.get_policy(name)
    if latest is None:
        return _html(console.not_found_page(f"policy {name!r} not found", frame), 404)
    if (a is None) != (b is None):
        missing = "a" if a is None else "b"
        raise ApiError(422, f"query.{missing}: a diff needs both versions, a and b",
                       [{"loc": f"query.{missing}", "msg": "a diff needs both versions, a and b"}])
    wanted = {v for v in (version, a, b) if v is not None}
    rows = {v: services.store.get_policy(name, v) for v in wanted}
    gone = sorted(v for v, r in rows.items() if r is None)
    if gone:
        return _html(console.not_found_page(f"policy {name!r} has no version {gone[0]} (latest: {latest.version})",
                                            frame), 404)
    found = {v: r for v, r in rows.items() if r is not None}
    shown = found[version] if version is not None else latest
    diff = (found[a], found[b]) if a is not None and b is not None else None
    return _html(console.policy_page(shown, latest.version, diff, frame))
