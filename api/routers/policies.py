"""Policies: create (a new version), list, get, validate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from actuator._exceptions import PolicyError
from actuator.engine import Engine
from actuator.models import ObservationRow
from actuator.policy import PolicyDocument, list_presets, load_policy, load_preset, policy_errors
from actuator.schemas import RunCreate
from actuator.simulate import simulate

from ..deps import MAX_INT, AdminDep, ServicesDep, policy_ref
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
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                            {"message": str(exc), "errors": exc.errors}) from exc
    return parsed


@router.post("", status_code=201, summary="Create a policy (or a new version of it)")
def create_policy(_: AdminDep, services: ServicesDep,
                  doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    return policy_public(services.store.create_policy(_parse(doc)))


@router.get("/schema", summary="The policy document's JSON Schema")
def policy_schema() -> dict[str, Any]:
    return PolicyDocument.model_json_schema()


@router.get("/presets", summary="The shipped presets (documents ready to create or use inline)")
def presets() -> dict[str, Any]:
    return {name: load_preset(name).model_dump(mode="json") for name in list_presets()}


def _knobs(raw: Any) -> dict[str, dict[str, Any]]:
    """A ``knobs`` list as registration takes it (each a knob spec, names unique), by name."""
    try:
        knobs = RunCreate.model_validate({"policy": "-", "knobs": raw}).knobs
    except ValidationError as exc:
        errors = [{"loc": f"body.{e['loc']}", "msg": e["msg"]} for e in policy_errors(exc)]
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                            {"message": "; ".join(f"{e['loc']}: {e['msg']}" for e in errors), "errors": errors}) from exc
    return {k.name: k.model_dump(mode="json") for k in knobs}


@router.post("/validate", summary="Dry-run validation: every error with its JSON path; with `knobs` (a list "
             "as at registration, beside the document's fields), also against the knobs it will drive")
def validate_policy(doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    doc = dict(doc)
    knobs = _knobs(doc.pop("knobs")) if "knobs" in doc else None  # a policy document has no 'knobs' field
    try:
        parsed = load_policy(doc)
    except PolicyError as exc:
        return {"valid": False, "errors": exc.errors or [{"loc": "(document)", "msg": str(exc)}]}
    errors = Engine(parsed).knob_errors(knobs) if knobs is not None else []
    return {"valid": not errors, "errors": errors}


class SimulateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: str | dict[str, Any] = Field(description="A stored policy (name or name@version) or a document.")
    run_id: str = Field(max_length=64, pattern=r"^[A-Za-z0-9\-]+$",
                        description="The run whose recorded observations are replayed.")
    limit: int | None = Field(None, ge=1, le=MAX_INT, description="Replay only the run's first `limit` "
                              "observations (at most ACTUATOR_SIMULATE_OBSERVATIONS). Without it, a run with more "
                              "observations than that is refused (422).")


@router.post("/simulate", summary="Replay a run's observations through a policy: the decisions it would take")
def simulate_policy(body: SimulateBody, services: ServicesDep) -> dict[str, Any]:
    if isinstance(body.policy, str):
        name, version, ok = policy_ref(body.policy)
        row = services.store.get_policy(name, version) if ok else None
        if row is None:
            raise HTTPException(422, {"message": f"policy: {body.policy!r} not found",
                                      "errors": [{"loc": "body.policy", "msg": "not found"}]})
        doc = PolicyDocument.model_validate(row.document)
    else:
        doc = _parse(body.policy)
    run = services.store.get_run(body.run_id)
    if run is None:
        raise HTTPException(404, f"run {body.run_id!r} not found")
    cap = services.settings.simulate_observations
    if body.limit is not None and body.limit > cap:
        raise HTTPException(422, {"message": f"limit: a simulation replays at most {cap} observations",
                                  "errors": [{"loc": "body.limit", "msg": f"at most {cap} (ACTUATOR_SIMULATE_OBSERVATIONS)"}]})
    total = services.store.count_for_run(ObservationRow, run.id)
    if body.limit is None and total > cap:
        message = (f"run_id: the run has {total} observations; a simulation replays at most {cap} "
                   f"(ACTUATOR_SIMULATE_OBSERVATIONS): pass limit (<= {cap}) to replay the first ones")
        raise HTTPException(422, {"message": message, "errors": [{"loc": "body.run_id", "msg": message}]})
    registered = services.store.first_event(run.id, "run_registered")
    knobs = (registered.payload.get("knobs") if registered else None) or run.knobs
    errors = [{"loc": f"body.policy.{e['loc']}", "msg": e["msg"]} for e in Engine(doc).knob_errors(knobs)]
    if errors:
        raise HTTPException(422, {"message": "; ".join(f"{e['loc']}: {e['msg']}" for e in errors), "errors": errors})
    observations = services.store.list_observations(run.id, limit=min(body.limit or cap, cap))
    return {**simulate(doc, knobs, observations), "observations_total": total}


@router.put("/{name}", status_code=201, summary="Update a policy: stores a new version")
def update_policy(_: AdminDep, services: ServicesDep, name: str = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$"),
                  doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    parsed = _parse(doc)
    if parsed.name != name:
        raise HTTPException(422, {"message": f"name: the document is named {parsed.name!r}, not {name!r}",
                                  "errors": [{"loc": "body.name", "msg": "does not match the path"}]})
    if services.store.get_policy(name) is None:
        raise HTTPException(404, f"policy {name!r} not found; create it with POST /v1/policies")
    return policy_public(services.store.create_policy(parsed))


@router.delete("/{name}", summary="Archive a policy (every version); runs under it keep running")
def archive_policy(_: AdminDep, services: ServicesDep,
                   name: str = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")) -> dict[str, Any]:
    n = services.store.archive_policy(name)
    if n == 0:
        raise HTTPException(404, f"policy {name!r} not found")
    return {"name": name, "archived_versions": n}


@router.get("", summary="List policies (every version), paged",
            description="Versions by name, then version, `limit` from `offset`. A page also ends before its "
                        "documents pass ACTUATOR_POLICY_PAGE_BYTES (one document at least): the next page "
                        "starts at offset + the number of items; an empty page is the end.")
def list_policies(services: ServicesDep, include_archived: bool = False,
                  offset: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
                  limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    rows = services.store.list_policies(include_archived, offset=offset, limit=limit,
                                        max_bytes=services.settings.policy_page_bytes)
    return [policy_public(p) for p in rows]


PolicyName = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


@router.get("/{name}", summary="Latest version of a policy")
def get_policy(services: ServicesDep, name: str = PolicyName) -> dict[str, Any]:
    row = services.store.get_policy(name)
    if row is None:
        raise HTTPException(404, f"policy {name!r} not found")
    return policy_public(row)


@router.get("/{name}/versions/{version}", summary="One version of a policy")
def get_policy_version(services: ServicesDep, name: str = PolicyName,
                       version: int = Path(ge=1, le=MAX_INT)) -> dict[str, Any]:
    row = services.store.get_policy(name, version)
    if row is None:
        raise HTTPException(404, f"policy {name!r} version {version} not found")
    return policy_public(row)
