"""FastAPI dependencies: settings, store, live state, metrics, the worker processes for costly work,
bearer auth for writes (admin, a run's agent) and for reads (token mode), and stream tickets."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from actuator.config import Settings
from actuator.engine import Engine
from actuator.live import LiveState
from actuator.metrics import Metrics
from actuator.notify import Notifier
from actuator.models import RunRow
from actuator.schemas import MAX_INT
from actuator.store import Store, hash_token, tokens_match

from .errors import ApiError
from .workers import WorkerPool

__all__ = ["Services", "ServicesDep", "AdminDep", "RunAuth", "RunAuthDep", "RunOrAdminDep", "get_services",
           "Reader", "ReaderDep", "RunReaderDep", "MetricsReaderDep", "HealthReaderDep", "require_reader",
           "require_run_reader", "read_bearer", "stream_ticket", "stream_ticket_valid",
           "STREAM_TICKET_SECONDS", "STREAM_TICKET_PATTERN", "ReadCredentials",
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
    notifier: Notifier | None = None  # ACTUATOR_WEBHOOK_URL: guardrail firings POSTed there

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


def _same(token: str, secret: str) -> bool:
    """Constant-time comparison; as bytes (``compare_digest`` refuses non-ASCII text, and a header
    may carry any Latin-1 character)."""
    return hmac.compare_digest(token.encode(), secret.encode())


def _is_admin(services: Services, token: str | None) -> bool:
    admin = services.settings.admin_token
    return admin is not None and token is not None and _same(token, admin.get_secret_value())


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


# -- reads -------------------------------------------------------------------------------------
# Open mode (no admin token): every read is open, as on a laptop. Token mode: every read needs a
# bearer token: the admin token or a viewer token (ACTUATOR_VIEWER_TOKEN) reads everything, a
# run's agent token reads that run only. A missing or unknown token is 401 (WWW-Authenticate:
# Bearer); a run's token elsewhere is 403, on another run's routes whether that run exists or
# not (a run's token learns nothing about other runs, not even their ids).
read_bearer = HTTPBearer(scheme_name="ReadToken", auto_error=False,
                         description="Token mode (ACTUATOR_ADMIN_TOKEN set) only: a viewer token "
                                     "(ACTUATOR_VIEWER_TOKEN) or the admin token for any read; a run's agent "
                                     "token for that run's reads.")
ReadCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(read_bearer)]


@dataclass(frozen=True)
class Reader:
    """Who reads: ``open`` (open mode, no token needed), ``admin``, ``viewer``, or ``agent`` (a run's
    token: ``run_id`` is that run)."""

    role: str
    run_id: str | None = None


OPEN_READER = Reader("open")


def _global_reader(services: Services, token: str) -> Reader | None:
    """The admin or a viewer (each compared in constant time), else None."""
    if _is_admin(services, token):
        return Reader("admin")
    viewer = False
    for t in services.settings.viewer_token:
        viewer |= _same(token, t.get_secret_value())
    return Reader("viewer") if viewer else None


def _run_of_token(services: Services, digest: str) -> str | None:
    """The run whose agent token has this hash, if any (a run's token read elsewhere: 403, not 401)."""
    with services.store.sessions() as s:
        return s.scalar(select(RunRow.id).where(RunRow.token_hash == digest).limit(1))


_READ_401 = ("this token is not the admin token, a viewer token (ACTUATOR_VIEWER_TOKEN) or a run's token")


def _read_token(credentials: HTTPAuthorizationCredentials | None, services: Services, needs: str) -> str | None:
    """The bearer token of a read in token mode, None in open mode; 401 without one."""
    if not services.settings.token_mode:
        return None
    token = _token(credentials)
    if token is None:
        raise _unauthorized(f"missing bearer token: {needs} (this service has ACTUATOR_ADMIN_TOKEN set)")
    return token


async def require_reader(credentials: ReadCredentials, services: ServicesDep) -> Reader:
    """Reads about every run or policy (run list, policies, the console's lists, the API document):
    open in open mode; in token mode the admin token or a viewer token."""
    token = _read_token(credentials, services, "reads need a viewer token or the admin token")
    if token is None:
        return OPEN_READER
    reader = _global_reader(services, token)
    if reader is not None:
        return reader
    if await run_in_threadpool(_run_of_token, services, hash_token(token)) is not None:
        raise ApiError(status.HTTP_403_FORBIDDEN, "a run's token reads only that run (GET /v1/runs/{its id}...): "
                       "this read needs a viewer token or the admin token")
    raise _unauthorized(_READ_401)


async def require_run_reader(credentials: ReadCredentials, services: ServicesDep, run_id: RunId) -> Reader:
    """Reads about one run (its state, decisions, events, report, stream, console page): open in
    open mode; in token mode the admin token, a viewer token or this run's own token (401 for an
    unknown token, 403 for another run's)."""
    token = _read_token(credentials, services,
                        "reading a run needs a viewer token, the admin token or the run's own token")
    if token is None:
        return OPEN_READER
    reader = _global_reader(services, token)
    if reader is not None:
        return reader
    digest = hash_token(token)
    if not services.tokens.holds(run_id, digest):
        stored = await run_in_threadpool(services.store.run_token_hash, run_id)
        if stored is None or not hmac.compare_digest(digest, stored):
            if await run_in_threadpool(_run_of_token, services, digest) is not None:
                raise forbidden_run_token()
            raise _unauthorized(_READ_401)
        services.tokens.remember(run_id, stored)
    return Reader("agent", run_id)


# A live stream for a browser: EventSource sends no header, so the console first gets a ticket
# with its token (POST /v1/runs/{id}/stream/ticket) and opens the stream with ?ticket=. A ticket
# names one run and expires STREAM_TICKET_SECONDS after it was issued (it is checked when a stream
# opens, not while it runs): what an access log or a proxy keeps of the URL is worth little, and
# the long-lived token never goes in a URL. Signed with a key derived from the admin token, so
# every worker and replica of the service accepts the tickets of the others, and none outlives
# a change of the admin token.
STREAM_TICKET_SECONDS = 60
STREAM_TICKET_PATTERN = r"^[0-9]{1,12}\.[A-Za-z0-9_-]{43}$"


def _ticket_key(settings: Settings) -> bytes:
    admin = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    return hashlib.sha256(b"actuator stream ticket\0" + admin.encode()).digest()


def _ticket_mac(settings: Settings, run_id: str, expires: int) -> str:
    mac = hmac.new(_ticket_key(settings), f"{run_id}\0{expires}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).decode().rstrip("=")


def stream_ticket(settings: Settings, run_id: str, now: float | None = None) -> str:
    """A ticket to open ``run_id``'s stream within STREAM_TICKET_SECONDS."""
    expires = int(time.time() if now is None else now) + STREAM_TICKET_SECONDS
    return f"{expires}.{_ticket_mac(settings, run_id, expires)}"


def stream_ticket_valid(settings: Settings, run_id: str, ticket: str, now: float | None = None) -> bool:
    expires, _, mac = ticket.partition(".")
    if not expires.isascii() or not expires.isdigit() or int(expires) < (time.time() if now is None else now):
        return False
    return _same(mac, _ticket_mac(settings, run_id, int(expires)))


def _service_reader(open_: Callable[[Settings], bool]) -> Callable[..., Any]:
    async def check(credentials: ReadCredentials, services: ServicesDep) -> Reader:
        if open_(services.settings):
            return OPEN_READER
        return await require_reader(credentials, services)
    return check


AdminDep = Annotated[None, Depends(require_admin)]
RunAuthDep = Annotated[RunAuth, Depends(require_run_token)]
RunOrAdminDep = Annotated[RunRow, Depends(require_run_or_admin)]
ReaderDep = Annotated[Reader, Depends(require_reader)]
RunReaderDep = Annotated[Reader, Depends(require_run_reader)]
# /metrics and /healthz: open when ACTUATOR_METRICS_PUBLIC / ACTUATOR_HEALTH_PUBLIC say so (the
# default follows the mode), else as ReaderDep.
MetricsReaderDep = Annotated[Reader, Depends(_service_reader(lambda s: s.metrics_open))]
HealthReaderDep = Annotated[Reader, Depends(_service_reader(lambda s: s.health_open))]
