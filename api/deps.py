"""FastAPI dependencies: settings, store, live state, metrics, the worker processes for costly work,
and the two kinds of bearer auth."""

from __future__ import annotations

import hmac
import re
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError
from starlette.concurrency import run_in_threadpool

from actuator.config import Settings
from actuator.engine import Engine
from actuator.live import LiveState
from actuator.metrics import Metrics
from actuator.models import RunRow
from actuator.schemas import MAX_INT
from actuator.store import Store, hash_token, tokens_match

from .errors import ApiError
from .workers import WorkerPool

__all__ = ["Services", "ServicesDep", "AdminDep", "RunAuth", "RunAuthDep", "RunOrAdminDep", "get_services",
           "MAX_INT", "Offset", "PageSize", "Version", "policy_ref", "admin_bearer", "agent_bearer",
           "forbidden_run_token", "run_not_found"]


def _decimal(value: Any) -> Any:
    """A query or path integer is ASCII digits with an optional sign: pydantic's lax parsing also
    takes '1_000', ' 5' and '5.0', which the OpenAPI document (type integer) does not allow."""
    if isinstance(value, str) and not _DECIMAL.fullmatch(value):
        raise PydanticCustomError("int_parsing", "Input should be a valid integer")
    return value


_DECIMAL = re.compile(r"[+-]?[0-9]+")
# Query and path integers. The bounds sit inside the type: on a parameter (Query(ge=...)) they
# would not reach the OpenAPI document through the validator.
Offset = Annotated[int, Field(ge=0, le=MAX_INT), BeforeValidator(_decimal)]
PageSize = Annotated[int, Field(ge=1, le=1000), BeforeValidator(_decimal)]
Version = Annotated[int, Field(ge=1, le=MAX_INT), BeforeValidator(_decimal)]


def policy_ref(ref: str) -> tuple[str, int | None, bool]:
    """``name`` or ``name@version`` → (name, version or None, well formed). Only ASCII digits
    (``str.isdigit`` accepts '²', which ``int`` refuses) and versions the store can hold."""
    name, _, ver = ref.partition("@")
    if not ver:  # "name" or "name@": the latest version
        return name, None, True
    ok = ver.isascii() and ver.isdigit() and 1 <= int(ver) <= MAX_INT
    return name, int(ver) if ok else None, ok


class VerifiedTokens:
    """Run id -> hash of the agent token last verified against the store, so an agent's every
    post need not read its run before the ingest does. Only a shortcut for the answer order (auth
    before the body's validation): the ingest checks the hash again on the run row it locks, so
    a run whose token changed or that is gone is refused whatever is cached here. Bounded: the
    oldest entries go first."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._hashes: dict[str, str] = {}
        self._lock = threading.Lock()

    def holds(self, run_id: str, token_hash: str) -> bool:
        cached = self._hashes.get(run_id)
        return cached is not None and hmac.compare_digest(cached, token_hash)

    def remember(self, run_id: str, token_hash: str) -> None:
        with self._lock:
            self._hashes.pop(run_id, None)
            while len(self._hashes) >= self.size:
                del self._hashes[next(iter(self._hashes))]
            self._hashes[run_id] = token_hash

    def forget(self, run_id: str) -> None:
        with self._lock:
            self._hashes.pop(run_id, None)


@dataclass
class Services:
    settings: Settings
    store: Store
    live: LiveState
    metrics: Metrics
    tokens: VerifiedTokens = field(default_factory=VerifiedTokens)
    cpu: WorkerPool = field(default_factory=WorkerPool)  # costly work, off the serving workers

    def engine_for(self, policy_id: int) -> Engine:
        """The engine of a policy version (built once per process: versions are immutable)."""
        return self.store.policy_engine(policy_id)


# Dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` one in the thread
# pool, a hand-off per dependency per request.
async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


# Two bearer schemes in the OpenAPI document (same header): which token an operation takes.
# auto_error=False: the dependencies below answer 401/403 with their own messages.
admin_bearer = HTTPBearer(scheme_name="AdminToken", auto_error=False,
                          description="ACTUATOR_ADMIN_TOKEN (admin endpoints are open when it is unset).")
agent_bearer = HTTPBearer(scheme_name="AgentToken", auto_error=False,
                          description="A run's agent token, returned once by POST /v1/runs.")
AdminCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(admin_bearer)]
AgentCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(agent_bearer)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def _unauthorized(msg: str) -> ApiError:
    return ApiError(status.HTTP_401_UNAUTHORIZED, msg, headers={"WWW-Authenticate": "Bearer"})


def _is_admin(services: Services, token: str | None) -> bool:
    admin = services.settings.admin_token
    return admin is not None and token is not None and hmac.compare_digest(token, admin.get_secret_value())


async def require_admin(credentials: AdminCredentials, services: ServicesDep) -> None:
    """Admin endpoints (policies, registration). Open when no admin token is configured
    (embedded single-user mode)."""
    if services.settings.admin_token is None:
        return
    token = _token(credentials)
    if token is None:
        raise _unauthorized("missing bearer token: this endpoint needs the admin token")
    if not _is_admin(services, token):
        raise ApiError(status.HTTP_403_FORBIDDEN, "this token is not the admin token")


def _load_run(services: Services, run_id: str) -> RunRow:
    run = services.store.get_run(run_id)
    if run is None:
        raise run_not_found(run_id)
    return run


RunId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9\-]+$")]


@dataclass(frozen=True)
class RunAuth:
    """A run id and the hash of the agent token presented for it (verified)."""

    id: str
    token_hash: str


def forbidden_run_token() -> ApiError:
    return ApiError(status.HTTP_403_FORBIDDEN, "this token does not grant access to this run")


def run_not_found(run_id: str) -> ApiError:
    return ApiError(status.HTTP_404_NOT_FOUND, f"run {run_id!r} not found")


async def require_run_token(credentials: AgentCredentials, services: ServicesDep, run_id: RunId) -> RunAuth:
    """The run's own agent token: 401 without a token, 404 unknown run, 403 another run's token.
    A token already verified for the run is not looked up again (see :class:`VerifiedTokens`)."""
    token = _token(credentials)
    if token is None:
        raise _unauthorized("missing bearer token: post with the run's agent token")
    digest = hash_token(token)
    if not services.tokens.holds(run_id, digest):
        stored = await run_in_threadpool(services.store.run_token_hash, run_id)
        if stored is None:
            raise run_not_found(run_id)
        if not hmac.compare_digest(digest, stored):
            raise forbidden_run_token()
        services.tokens.remember(run_id, stored)
    return RunAuth(run_id, digest)


def require_run_or_admin(admin: AdminCredentials, agent: AgentCredentials, services: ServicesDep,
                         run_id: RunId) -> RunRow:
    """Run control (halt, finish): the run's token or the admin token (either scheme: one header)."""
    token = _token(admin or agent)
    if services.settings.admin_token is None and token is None:
        return _load_run(services, run_id)
    if token is None:
        raise _unauthorized("missing bearer token: use the run's token or the admin token")
    run = _load_run(services, run_id)
    if _is_admin(services, token) or tokens_match(token, run.token_hash):
        return run
    raise ApiError(status.HTTP_403_FORBIDDEN, "this token grants neither this run nor admin")


AdminDep = Annotated[None, Depends(require_admin)]
RunAuthDep = Annotated[RunAuth, Depends(require_run_token)]
RunOrAdminDep = Annotated[RunRow, Depends(require_run_or_admin)]
