"""The FastAPI application factory. Nothing is built at import time: settings come in."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
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

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await JSONResponse({"detail": f"request body over {self.limit} bytes"}, 413)(scope, receive, send)
            return
        received = 0
        too_big = False

        async def limited() -> Message:
            nonlocal received, too_big
            msg = await receive()
            if msg["type"] == "http.request":
                received += len(msg.get("body", b""))
                if received > self.limit:
                    too_big = True
                    raise _TooLarge()
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await JSONResponse({"detail": f"request body over {self.limit} bytes"}, 413)(scope, receive, send)


class _TooLarge(Exception):
    pass


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
        store.close()
        live.close()

    app = FastAPI(title="Actuator", version=__version__, description=DESCRIPTION, lifespan=lifespan)
    app.state.metrics = Metrics()

    @app.middleware("http")
    async def timing(request: Request, call_next: Any) -> Any:
        start = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        app.state.metrics.requests.labels(path, request.method, str(response.status_code)).observe(
            time.perf_counter() - start)
        if 400 <= response.status_code < 500:
            app.state.metrics.rejected.labels(str(response.status_code)).inc()
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", "")).removeprefix("Value error, "),
                   "type": e.get("type")} for e in exc.errors()]
        message = "; ".join(f"{e['loc']}: {e['msg']}" for e in errors)
        return JSONResponse({"detail": {"message": message, "errors": errors}}, status_code=422)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
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
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    return app
