"""FastAPI dependencies: settings, store, live state, metrics, and the two kinds of bearer auth."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status

from actuator.config import Settings
from actuator.engine import Engine
from actuator.live import LiveState
from actuator.metrics import Metrics
from actuator.models import RunRow
from actuator.policy import PolicyDocument
from actuator.schemas import MAX_INT
from actuator.store import Store, tokens_match

__all__ = ["Services", "ServicesDep", "AdminDep", "RunAuthDep", "RunOrAdminDep", "get_services", "MAX_INT",
           "policy_ref"]


def policy_ref(ref: str) -> tuple[str, int | None, bool]:
    """``name`` or ``name@version`` → (name, version or None, well formed). Only ASCII digits
    (``str.isdigit`` accepts '²', which ``int`` refuses) and versions the store can hold."""
    name, _, ver = ref.partition("@")
    if not ver:  # "name" or "name@": the latest version
        return name, None, True
    ok = ver.isascii() and ver.isdigit() and 1 <= int(ver) <= MAX_INT
    return name, int(ver) if ok else None, ok


@dataclass
class Services:
    settings: Settings
    store: Store
    live: LiveState
    metrics: Metrics
    engines: dict[int, Engine] = field(default_factory=dict)

    def engine_for(self, policy_id: int) -> Engine:
        """Policy versions are immutable, so one Engine per version is cached for good."""
        engine = self.engines.get(policy_id)
        if engine is None:
            row = self.store.get_policy_by_id(policy_id)
            if row is None:  # pragma: no cover - foreign key guarantees it
                raise HTTPException(500, "policy of run missing")
            engine = Engine(PolicyDocument.model_validate(row.document), row.version)
            self.engines[policy_id] = engine
        return engine


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _unauthorized(msg: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, msg, headers={"WWW-Authenticate": "Bearer"})


def _is_admin(services: Services, token: str | None) -> bool:
    admin = services.settings.admin_token
    return admin is not None and token is not None and hmac.compare_digest(token, admin.get_secret_value())


def require_admin(request: Request, services: ServicesDep) -> None:
    """Admin endpoints (policies, registration). Open when no admin token is configured
    (embedded single-user mode)."""
    if services.settings.admin_token is None:
        return
    token = _bearer(request)
    if token is None:
        raise _unauthorized("missing bearer token: this endpoint needs the admin token")
    if not _is_admin(services, token):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token is not the admin token")


def _load_run(services: Services, run_id: str) -> RunRow:
    run = services.store.get_run(run_id)
    if run is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} not found")
    return run


RunId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9\-]+$")]


def require_run_token(request: Request, services: ServicesDep, run_id: RunId) -> RunRow:
    """The run's own agent token: 401 without a token, 404 unknown run, 403 another run's token."""
    token = _bearer(request)
    if token is None:
        raise _unauthorized("missing bearer token: post with the run's agent token")
    run = _load_run(services, run_id)
    if not tokens_match(token, run.token_hash):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token does not grant access to this run")
    return run


def require_run_or_admin(request: Request, services: ServicesDep, run_id: RunId) -> RunRow:
    """Run control (halt, pause, ...): the run's token or the admin token."""
    token = _bearer(request)
    if services.settings.admin_token is None and token is None:
        return _load_run(services, run_id)
    if token is None:
        raise _unauthorized("missing bearer token: use the run's token or the admin token")
    run = _load_run(services, run_id)
    if _is_admin(services, token) or tokens_match(token, run.token_hash):
        return run
    raise HTTPException(status.HTTP_403_FORBIDDEN, "this token grants neither this run nor admin")


AdminDep = Annotated[None, Depends(require_admin)]
RunAuthDep = Annotated[RunRow, Depends(require_run_token)]
RunOrAdminDep = Annotated[RunRow, Depends(require_run_or_admin)]
