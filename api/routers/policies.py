"""Policies: create (a new version), list, get, validate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from actuator._exceptions import PolicyError
from actuator.models import ObservationRow, PolicyRow
from actuator.policy import PolicyDocument, list_presets, load_policy, load_preset
from actuator.schemas import (
    CatalogueSpec,
    PolicyArchived,
    PolicyPublic,
    PolicyValidation,
    PositiveWireInt,
    SimulationPublic,
    TuneCreate,
    TunePublic,
)
from actuator.store import PolicyVersionConflict, stored_policy
from actuator.tune import NotIdentifiable, UnknownController, tune_report

from ..deps import AdminDep, Offset, PageSize, ReaderDep, Services, ServicesDep, Version, policy_ref, run_not_found
from .. import jobs
from ..errors import ApiError, error_responses
from ..views import policy_public

router = APIRouter(prefix="/v1/policies", tags=["policies"])

_EXAMPLE = {
    "name": "sft-drift",
    "controllers": [{"name": "drift-lr", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.05,
                     "kp": 2.0, "ki": 0.5, "filter": {"kind": "ema", "alpha": 0.5}}],
    "guardrails": [{"name": "drift-cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.5,
                    "action": "halt", "consecutive": 2}],
}


def _parse(doc: dict[str, Any]) -> PolicyDocument:
    try:
        parsed = load_policy(doc)
    except PolicyError as exc:
        raise ApiError(422, str(exc), exc.errors) from exc
    return parsed


def publish_policy(services: Services, doc: PolicyDocument, *, reuse_identical: bool = False,
                   catalogue: CatalogueSpec | None = None) -> PolicyRow:
    """Store ``doc`` as its name's next version (``reuse_identical``, ``catalogue``: see
    ``Store.create_policy``); 409 if other writers kept taking the next version."""
    try:
        return services.store.create_policy(doc, reuse_identical=reuse_identical, catalogue=catalogue)
    except PolicyVersionConflict as exc:
        raise ApiError(409, f"name: {exc}", [{"loc": "body.name", "msg": str(exc)}]) from exc


@router.post("", status_code=201, response_model=PolicyPublic,
             responses=error_responses(400, 401, 403, 409, 413, 422, 503),
             summary="Create a policy (or a new version of it)")
def create_policy(_: AdminDep, services: ServicesDep,
                  doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> PolicyPublic:
    return policy_public(publish_policy(services, _parse(doc)))


@router.get("/schema", response_model=dict[str, Any], responses=error_responses(401, 403),
            summary="The policy document's JSON Schema")
def policy_schema(_: ReaderDep) -> dict[str, Any]:
    return PolicyDocument.model_json_schema()


@router.get("/presets", response_model=dict[str, dict[str, Any]], responses=error_responses(401, 403),
            summary="The shipped presets (documents ready to create or use inline)")
def presets(_: ReaderDep) -> dict[str, Any]:
    return {name: load_preset(name).model_dump(mode="json") for name in list_presets()}


def _stored_policy(services: Any, ref: str, loc: str) -> PolicyDocument:
    name, version, ok = policy_ref(ref)
    row = services.store.get_policy(name, version) if ok else None
    if row is None:
        raise ApiError(422, f"{loc.removeprefix('body.')}: {ref!r} not found", [{"loc": loc, "msg": "not found"}])
    return stored_policy(row)


def _answer(out: tuple[Any, ...]) -> Any:
    """A worker job's answer (:mod:`actuator.api.jobs`): its value, or the refusal it names, raised."""
    if out[0] is None:
        return out[1]
    status, message, errors = out
    raise ApiError(status, message, errors)


_COSTLY = ("Runs in a worker process, off the serving workers (at most ACTUATOR_{kind}_CONCURRENCY in progress "
           "per serving process: 429 with Retry-After past it); admin token when one is set.")


@router.post("/validate", response_model=PolicyValidation, responses=error_responses(400, 401, 403, 413, 422, 429, 503),
             summary="Dry-run validation: every error with its JSON path; with `knobs` (a list as at "
             "registration, beside the document's fields), also against the knobs it will drive",
             description=_COSTLY.format(kind="VALIDATE"))
async def validate_policy(_: AdminDep, request: Request, services: ServicesDep,
                          doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    return _answer(await services.cpu.call(request, "validate", jobs.validation, doc))


class SimulateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str | dict[str, Any] = Field(description="A stored policy (name or name@version) or a document.")
    run_id: str = Field(max_length=64, pattern=r"^[A-Za-z0-9\-]+$",
                        description="The run whose recorded observations are replayed.")
    limit: PositiveWireInt | None = Field(None, description="Replay only the run's first `limit` "
                                          "observations (at most ACTUATOR_SIMULATE_OBSERVATIONS). Without it, "
                                          "a run with more observations than that is refused (422).")
    max_decisions: PositiveWireInt | None = Field(
        None, description="List at most this many decisions (and actions, events): the first ones. At most "
        "ACTUATOR_SIMULATE_DECISIONS (its default); more is refused (422).")
    trace_points: PositiveWireInt | None = Field(
        None, description="At most this many trace points (every k-th replayed observation and the last). At "
        "least 10 and at most ACTUATOR_SIMULATE_TRACE_POINTS (its default); outside is refused (422).")


def _at_most(value: int | None, cap: int, field: str, setting: str, least: int = 1) -> int:
    if value is None:
        return cap
    if not least <= value <= cap:
        msg = f"between {least} and {cap} ({setting})" if least > 1 else f"at most {cap} ({setting})"
        raise ApiError(422, f"{field}: {msg}", [{"loc": f"body.{field}", "msg": msg}])
    return value


def _simulation_inputs(body: SimulateBody, services: Services) -> tuple[Any, ...]:
    """What a simulation replays, read from the store (a read: in the serving process)."""
    settings = services.settings
    stored = isinstance(body.policy, str)
    if isinstance(body.policy, str):
        name, version, ok = policy_ref(body.policy)
        row = services.store.get_policy(name, version) if ok else None
        if row is None:
            raise ApiError(422, f"policy: {body.policy!r} not found", [{"loc": "body.policy", "msg": "not found"}])
        doc = row.document
    else:
        doc = body.policy
    run = services.store.get_run(body.run_id)
    if run is None:
        raise run_not_found(body.run_id)
    cap = settings.simulate_observations
    if body.limit is not None and body.limit > cap:
        raise ApiError(422, f"limit: a simulation replays at most {cap} observations",
                       [{"loc": "body.limit", "msg": f"at most {cap} (ACTUATOR_SIMULATE_OBSERVATIONS)"}])
    decisions = _at_most(body.max_decisions, settings.simulate_decisions, "max_decisions",
                         "ACTUATOR_SIMULATE_DECISIONS")
    points = _at_most(body.trace_points, settings.simulate_trace_points, "trace_points",
                      "ACTUATOR_SIMULATE_TRACE_POINTS", least=10)
    total = services.store.count_for_run(ObservationRow, run.id)
    if body.limit is None and total > cap:
        message = (f"run_id: the run has {total} observations; a simulation replays at most {cap} "
                   f"(ACTUATOR_SIMULATE_OBSERVATIONS): pass limit (<= {cap}) to replay the first ones")
        raise ApiError(422, message, [{"loc": "body.run_id", "msg": message}])
    registered = services.store.first_event(run.id, "run_registered")
    knobs = (registered.payload.get("knobs") if registered else None) or run.knobs
    observations = [_plain(o) for o in services.store.list_observations(run.id, limit=min(body.limit or cap, cap))]
    return doc, stored, knobs, observations, total, decisions, points


@router.post("/simulate", response_model=SimulationPublic,
             responses=error_responses(400, 401, 403, 404, 413, 422, 429, 503),
             summary="Replay a run's observations through a policy: the decisions it would take",
             description=_COSTLY.format(kind="SIMULATE") + " The answer lists at most ACTUATOR_SIMULATE_DECISIONS "
             "decisions, actions and events each (the first; `*_total` count all) and a trace of at most "
             "ACTUATOR_SIMULATE_TRACE_POINTS points (every `trace_every`-th observation and the last).")
async def simulate_policy(_: AdminDep, body: SimulateBody, request: Request, services: ServicesDep) -> Response:
    with services.cpu.turn("simulate"):  # before the reads: a refused request costs nothing
        inputs = await run_in_threadpool(_simulation_inputs, body, services)
        answer = _answer(await services.cpu.call(request, "simulate", jobs.simulation, *inputs, admitted=True))
    return Response(answer, media_type="application/json")


def _plain(o: ObservationRow) -> SimpleNamespace:
    """An observation as a plain, picklable record (the fit runs in another process)."""
    return SimpleNamespace(seq=o.seq, step=o.step, probes=o.probes, metrics=o.metrics, knobs=o.knobs)


@router.post("/tune", response_model=TunePublic,
             responses=error_responses(400, 401, 403, 404, 409, 413, 422, 429, 503),
             summary="Identify a run's plant for one controller and propose tuned gains, validated by replay",
             description="Fits a FOPDT or integrating model of the controller's probe against the knob values in "
                         "effect in the run's observations (knob in its scale), applies the SIMC rules (Skogestad "
                         "2003) and replays the proposed and the current gains closed loop against the model. "
                         "409 when the run cannot identify anything (the knob never moved, or its effect is lost in "
                         "the probe's noise); nothing is stored. A run of more than ACTUATOR_TUNE_OBSERVATIONS "
                         "observations is identified from every k-th one and the last (a warning says so). "
                         + _COSTLY.format(kind="TUNE"))
async def tune_policy(_: AdminDep, body: TuneCreate, request: Request, services: ServicesDep) -> dict[str, Any]:
    with services.cpu.turn("tune"):  # before the reads: a refused request costs nothing
        run_id, doc, knobs, observations, total, every, interval = await run_in_threadpool(_tune_inputs, body,
                                                                                           services)
        try:
            result = await services.cpu.call(request, "tune", tune_report, doc, knobs, body.controller,
                                             observations, aggressiveness=body.aggressiveness, horizon=body.horizon,
                                             interval=interval, admitted=True)
        except UnknownController as exc:
            raise ApiError(422, f"controller: {exc}", [{"loc": "body.controller", "msg": str(exc)}]) from exc
        except NotIdentifiable as exc:
            raise ApiError(409, f"run_id: the run cannot identify controller {body.controller!r}'s plant: {exc}",
                           [{"loc": "body.run_id", "msg": str(exc), "type": exc.problem}]) from exc
    if every > 1:
        limit = services.settings.tune_observations
        result["warnings"].append(
            f"identified from every {every}th of the run's {total} observations (ACTUATOR_TUNE_OBSERVATIONS="
            f"{limit}): a knob move between two of them counts from the next one")
    return {**result, "run_id": run_id, "observations_total": total}


def _tune_inputs(body: TuneCreate, services: Services) -> tuple[Any, ...]:
    """What a tune fits, read from the store (a read: in the serving process)."""
    run = services.store.get_run(body.run_id)
    if run is None:
        raise run_not_found(body.run_id)
    if body.policy is None:
        row = services.store.get_policy_by_id(run.policy_id)
        assert row is not None  # a run's policy is never deleted, only archived
        doc = stored_policy(row)
    elif isinstance(body.policy, str):
        doc = _stored_policy(services, body.policy, "body.policy")
    else:
        doc = _parse(body.policy)
    registered = services.store.first_event(run.id, "run_registered")
    knobs = (registered.payload.get("knobs") if registered else None) or run.knobs
    limit = services.settings.tune_observations
    total = services.store.count_for_run(ObservationRow, run.id)
    # Every k-th observation (and the last) so that at most `limit` are fitted: the fit's work
    # grows with them.
    every = max(1, -(-(total - 1) // (limit - 1)))
    observations = services.store.sample_observations(run.id, every, total)
    interval = None
    if every > 1:  # the loop's interval is the run's, not the sample's
        interval = max(1, round((observations[-1].step - observations[0].step) / (total - 1)))
    return run.id, doc, knobs, [_plain(o) for o in observations], total, every, interval


@router.put("/{name}", status_code=201, response_model=PolicyPublic,
            responses=error_responses(400, 401, 403, 404, 409, 413, 422, 503),
            summary="Update a policy: stores a new version")
def update_policy(_: AdminDep, services: ServicesDep, name: str = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$"),
                  doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> PolicyPublic:
    parsed = _parse(doc)
    if parsed.name != name:
        raise ApiError(422, f"name: the document is named {parsed.name!r}, not {name!r}",
                       [{"loc": "body.name", "msg": "does not match the path"}])
    if services.store.get_policy(name) is None:
        raise ApiError(404, f"policy {name!r} not found; create it with POST /v1/policies")
    return policy_public(publish_policy(services, parsed))


@router.delete("/{name}", response_model=PolicyArchived, responses=error_responses(401, 403, 404, 422, 503),
               summary="Archive a policy (every version); runs under it keep running")
def archive_policy(_: AdminDep, services: ServicesDep,
                   name: str = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")) -> dict[str, Any]:
    n = services.store.archive_policy(name)
    if n == 0:
        raise ApiError(404, f"policy {name!r} not found")
    return {"name": name, "archived_versions": n}


@router.get("", response_model=list[PolicyPublic], responses=error_responses(401, 403, 422, 503),
            summary="List policies (every version), paged",
            description="Versions by name, then version, `limit` from `offset`. A page also ends before its "
                        "documents pass ACTUATOR_POLICY_PAGE_BYTES (one document at least): the next page "
                        "starts at offset + the number of items; an empty page is the end.")
def list_policies(_: ReaderDep, services: ServicesDep, include_archived: bool = False,
                  offset: Annotated[Offset, Query()] = 0,
                  limit: Annotated[PageSize, Query()] = 100) -> list[PolicyPublic]:
    rows = services.store.list_policies(include_archived, offset=offset, limit=limit,
                                        max_bytes=services.settings.policy_page_bytes)
    return [policy_public(p) for p in rows]


PolicyName = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


@router.get("/{name}", response_model=PolicyPublic, responses=error_responses(401, 403, 404, 422, 503),
            summary="Latest version of a policy")
def get_policy(_: ReaderDep, services: ServicesDep, name: str = PolicyName) -> PolicyPublic:
    row = services.store.get_policy(name)
    if row is None:
        raise ApiError(404, f"policy {name!r} not found")
    return policy_public(row)


@router.get("/{name}/versions/{version}", response_model=PolicyPublic,
            responses=error_responses(401, 403, 404, 422, 503), summary="One version of a policy")
def get_policy_version(_: ReaderDep, services: ServicesDep, version: Annotated[Version, Path()],
                       name: str = PolicyName) -> PolicyPublic:
    row = services.store.get_policy(name, version)
    if row is None:
        raise ApiError(404, f"policy {name!r} version {version} not found")
    return policy_public(row)
