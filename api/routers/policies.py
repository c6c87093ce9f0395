"""Policies: create (a new version), list, get, validate."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, HTTPException, Path, status

from actuator._exceptions import PolicyError
from actuator.policy import PolicyDocument, load_policy

from ..deps import AdminDep, ServicesDep
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
        return load_policy(doc)
    except PolicyError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY,
                            {"message": str(exc), "errors": exc.errors}) from exc


@router.post("", status_code=201, summary="Create a policy (or a new version of it)")
def create_policy(_: AdminDep, services: ServicesDep,
                  doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    return policy_public(services.store.create_policy(_parse(doc)))


@router.post("/validate", summary="Dry-run validation: every error with its JSON path")
def validate_policy(doc: dict[str, Any] = Body(..., examples=[_EXAMPLE])) -> dict[str, Any]:
    try:
        load_policy(doc)
    except PolicyError as exc:
        return {"valid": False, "errors": exc.errors or [{"loc": "(document)", "msg": str(exc)}]}
    return {"valid": True, "errors": []}


@router.get("", summary="List policies (every version)")
def list_policies(services: ServicesDep, include_archived: bool = False) -> list[dict[str, Any]]:
    return [policy_public(p) for p in services.store.list_policies(include_archived)]


PolicyName = Path(pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


@router.get("/{name}", summary="Latest version of a policy")
def get_policy(services: ServicesDep, name: str = PolicyName) -> dict[str, Any]:
    row = services.store.get_policy(name)
    if row is None:
        raise HTTPException(404, f"policy {name!r} not found")
    return policy_public(row)


@router.get("/{name}/versions/{version}", summary="One version of a policy")
def get_policy_version(services: ServicesDep, name: str = PolicyName, version: int = Path(ge=1)) -> dict[str, Any]:
    row = services.store.get_policy(name, version)
    if row is None:
        raise HTTPException(404, f"policy {name!r} version {version} not found")
    return policy_public(row)
