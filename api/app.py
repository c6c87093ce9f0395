"""The FastAPI application factory. Nothing is built at import time: settings come in."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actuator import __version__
from actuator.config import Settings
from actuator.live import make_live
from actuator.metrics import Metrics
from actuator.migrate import upgrade
from actuator.store import Store

from .deps import Services
from .routers import control, health, policies, runs

__all__ = ["create_app"]

log = logging.getLogger("actuator.api")

DESCRIPTION = """
Actuator closes the loop of LLM post-training: agents attached to training runs post
**observations** (capability probes, training metrics, knob values in effect); the service
evaluates the run's **policy** (PID controllers and guardrails) and answers with **decisions**
(knob changes) and **actions** (halt, rollback).

Auth: bearer tokens. The admin token (``ACTUATOR_ADMIN_TOKEN``; open when unset) manages policies
and registers runs; each run gets its own agent token, shown once at registration.
"""


class BodyLimit:
    """Refuse bodies over the limit with 413 before they are read into memory."""

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics | None = None) -> None:
        self.app, self.limit, self.metrics = app, limit, metrics

    def _count(self) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels("413").inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            self._count()
            await JSONResponse({"detail": f"request body over {self.limit} bytes"}, 413)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.limit:
                    raise _TooLarge(self.limit)
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            self._count()
            await JSONResponse({"detail": f"request body over {self.limit} bytes"}, 413)(scope, receive, send)


class Timing:
    """Duration and status of every request per route, and the 4xx count, for Prometheus. Plain
    ASGI: Starlette's ``BaseHTTPMiddleware`` costs a task group and memory streams per request.
    Timed until the response starts (a stream's duration is not the request's)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    def _record(self, scope: Scope, status: int, start: float) -> None:
        path = getattr(scope.get("route"), "path", "unmatched")
        self.metrics.requests.labels(path, scope["method"], str(status)).observe(time.perf_counter() - start)
        if 400 <= status < 500:
            self.metrics.rejected.labels(str(status)).inc()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        started = False

        async def timed(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self._record(scope, message["status"], start)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            if not started:  # the app raised: the request still counts, as a 500
                self._record(scope, 500, start)


class _TooLarge(HTTPException):
    """Raised from ``receive`` when a body without Content-Length (chunked) passes the limit.
    FastAPI re-raises an HTTPException met while reading the body as is (any other error becomes
    a bare 400); when a middleware's task group wraps it first, FastAPI's 400 carries it as its
    cause and ``http_error`` answers the 413."""

    def __init__(self, limit: int = 0) -> None:
        super().__init__(413, f"request body over {limit} bytes")


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return cause.split(kind)[0] is not None
    return isinstance(cause, kind)


def _loc(loc: Any) -> str:
    return ".".join(str(p) for p in loc)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            upgrade(settings.database_url)
        store = Store(settings.database_url)
        live = make_live(settings.redis_url)
        app.state.services = Services(settings=settings, store=store, live=live, metrics=app.state.metrics)
        log.info("actuator service ready (store=%s, live=%s)", store.engine.dialect.name,
                 "redis" if settings.redis_url else "memory")
        yield
        await live.aclose()
        store.close()
        live.close()

    app = FastAPI(title="Actuator", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.metrics = Metrics(retire_after=settings.metrics_retire_after)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", "")).removeprefix("Value error, "),
                   "type": e.get("type")} for e in exc.errors()]
        message = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        return JSONResponse({"detail": {"message": message, "errors": errors}}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        # FastAPI turns an error met while reading or parsing the body into a bare 400; the
        # middleware's task group may have wrapped our 413 in an ExceptionGroup on the way.
        if exc.status_code == 400 and _caused_by(exc, _TooLarge):
            return JSONResponse({"detail": f"request body over {settings.max_body_bytes} bytes"}, 413)
        if exc.status_code == 400 and _caused_by(exc, RecursionError):
            msg = "JSON nested too deeply"
            return JSONResponse({"detail": {"message": f"body: {msg}",
                                            "errors": [{"loc": "body", "msg": msg, "type": "json_invalid"}]}},
                                status_code=422)
        return await http_exception_handler(request, exc)

    @app.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # A value the database refuses (out of its integer range, NUL in text, ...): the request's
        # fault, and deterministic, so a 422 (a 5xx would make agents retry it forever).
        log.warning("store refused a value on %s: %s", request.url.path, type(exc.orig).__name__)
        msg = "a value is outside what the store can hold"
        return JSONResponse({"detail": {"message": f"body: {msg}", "errors": [{"loc": "body", "msg": msg}]}},
                            status_code=422)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeout)  # every pooled connection busy for pool_timeout seconds
    async def store_down(request: Request, exc: Exception) -> JSONResponse:
        app.state.metrics.backend_errors.labels("store").inc()
        log.warning("store unavailable on %s: %s", request.url.path, type(exc).__name__)
        return JSONResponse({"detail": "store unavailable, retry later"}, status_code=503,
                            headers={"Retry-After": "2"})

    try:
        import redis.exceptions as rexc

        @app.exception_handler(rexc.RedisError)
        async def redis_down(request: Request, exc: Exception) -> JSONResponse:
            app.state.metrics.backend_errors.labels("redis").inc()
            log.warning("redis error on %s: %s", request.url.path, type(exc).__name__)
            return JSONResponse({"detail": "live state unavailable, retry later"}, status_code=503,
                                headers={"Retry-After": "2"})
    except ImportError:  # pragma: no cover
        pass

    app.include_router(health.router)
    app.include_router(policies.router)
    app.include_router(runs.router)
    app.include_router(control.router)
    app.add_middleware(Timing, metrics=app.state.metrics)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, metrics=app.state.metrics)
    return app
