"""The FastAPI application factory. Nothing is built at import time: settings come in."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actuator import __version__
from actuator.config import Settings
from actuator.live import make_live
from actuator.metrics import Metrics
from actuator.migrate import upgrade
from actuator.store import Store

from .deps import Services
from .workers import WorkerPool
from .errors import ApiError, error_response, install_error_handlers
from .console import SECURITY_HEADERS
from . import pages
from .routers import control, health, policies, runs, ui

__all__ = ["create_app"]

log = logging.getLogger("actuator.api")

DESCRIPTION = """
Actuator closes the loop of LLM post-training: agents attached to training runs post
**observations** (capability probes, training metrics, knob values in effect); the service
evaluates the run's **policy** (PID controllers and guardrails) and answers with **decisions**
(knob changes) and **actions** (halt, rollback).

Auth: bearer tokens. The admin token (``ACTUATOR_ADMIN_TOKEN``; open when unset) manages policies
and registers runs; each run gets its own agent token, shown once at registration.

Browsers: a request that changes anything and carries another site's ``Origin`` is refused (403),
and the service answers only the Host names of ``ACTUATOR_ALLOWED_HOSTS`` (the loopback names
when it listens on loopback; 400 otherwise).
"""


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


class ConsoleHeaders:
    """The run console's pages and files (``/`` and ``/ui...``) go out with a Content-Security-Policy
    (scripts and styles from this origin only, nothing inline) and the usual hardening headers.
    The REST API's answers are left as they are."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != "/" and path != "/ui" and not path.startswith("/ui/"):
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.headers]}
            await send(message)

        await self.app(scope, receive, secured)


class HtmlHeaders:
    """Every HTML answer goes out with a Content-Security-Policy and X-Frame-Options: one that sets
    its own (the console's, the docs', the report's) keeps it, any other gets the console's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                names = {k.lower() for k, _ in headers}
                if dict(headers).get(b"content-type", b"").startswith(b"text/html"):
                    message = {**message, "headers": [*headers, *(h for h in self.headers if h[0] not in names)]}
            await send(message)

        await self.app(scope, receive, secured)


# A Host header: a name or IPv4 address, or an IPv6 address in brackets, and an optional port.
_HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[^:\[\]/@\s]+)(?::[0-9]{1,5})?")
# Methods that change nothing: every other one may (POST, PUT, PATCH, DELETE).
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BrowserGuard:
    """What a web page of another site could do through the user's browser is refused, whether
    or not an admin token is set (OWASP CSRF cheat sheet, token-less APIs):

    * DNS rebinding: a request whose Host is not a name this service answers to is refused (400)
      (``Settings.trusted_hosts``: the loopback names when it listens on loopback);
    * cross-site requests: a state-changing request (any method but GET, HEAD, OPTIONS) whose
      Origin is not the service's own (the Host it was sent to, or ACTUATOR_ALLOWED_ORIGINS) is
      refused (403); without an Origin, one whose Sec-Fetch-Site says another site sent it.

    A client that is not a browser (the agent, the CLI, curl) sends neither header and is not
    affected; the console's own pages send their own origin."""

    def __init__(self, app: ASGIApp, hosts: list[str] | None, origins: list[str]) -> None:
        self.app, self.hosts, self.origins = app, hosts, frozenset(origins)

    def _answers(self, host: str) -> bool:
        assert self.hosts is not None
        m = _HOST.fullmatch(host)
        if m is None:
            return False
        name = m["name"].lower()
        return any(name == h or (h.startswith("*.") and name.endswith(h[1:])) for h in self.hosts)

    def _foreign(self, headers: Headers, host: str) -> tuple[str, str] | None:
        """(header, why) when a browser on another site sent this request."""
        origin = headers.get("origin")
        if origin is not None:
            if origin.lower().rstrip("/") in self.origins:
                return None
            try:
                parts = urlsplit(origin)
            except ValueError:
                parts = None
            if parts is not None and parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower():
                return None
            return "Origin", (f"a page of {origin!r} may not change runs or policies: only the service's own pages "
                              "may (ACTUATOR_ALLOWED_ORIGINS adds others)")
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return "Sec-Fetch-Site", f"a {site} browser request may not change runs or policies"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        refusal: ApiError | None = None
        if self.hosts is not None and not self._answers(host):
            why = (f"{host!r} is not a name this service answers to (it answers to {', '.join(self.hosts)}; "
                   "ACTUATOR_ALLOWED_HOSTS adds others)")
            refusal = ApiError(400, f"Host: {why}", [{"loc": "header.Host", "msg": why}])
        elif scope["method"] not in _SAFE_METHODS and (foreign := self._foreign(headers, host)) is not None:
            header, why = foreign
            refusal = ApiError(403, f"{header}: {why}", [{"loc": f"header.{header}", "msg": why}])
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await error_response(refusal)(scope, receive, send)


class _Service(FastAPI):
    """FastAPI with one addition: the body limit's own 413 carries the error envelope."""

    def build_middleware_stack(self) -> ASGIApp:
        return _EnvelopeTooLarge(super().build_middleware_stack(), self.max_body_size)


class _EnvelopeTooLarge:
    """FastAPI's body limit (``max_body_size``) refuses a declared Content-Length over the limit
    with a text/plain 413 sent from outside every handler and middleware of the app (a body that
    grows past the limit without one goes through the exception handlers). This outermost layer
    gives that answer the service's JSON error envelope."""

    def __init__(self, app: ASGIApp, limit: int | None) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        replacing = False

        async def envelope(message: Message) -> None:
            nonlocal replacing
            if message["type"] == "http.response.start" and message["status"] == 413 \
                    and dict(message.get("headers", [])).get(b"content-type", b"").startswith(b"text/plain"):
                replacing = True
                response = error_response(ApiError(413, f"request body over {self.limit} bytes"))
                await send({"type": "http.response.start", "status": 413, "headers": response.raw_headers})
                await send({"type": "http.response.body", "body": response.body})
            elif not replacing:
                await send(message)

        await self.app(scope, receive, envelope)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            upgrade(settings.database_url)
        store = Store(settings.database_url)
        live = make_live(settings.redis_url)
        app.state.services = Services(settings=settings, store=store, live=live, metrics=app.state.metrics,
                                      cpu=WorkerPool.from_settings(settings))
        log.info("actuator service ready (store=%s, live=%s)", store.engine.dialect.name,
                 "redis" if settings.redis_url else "memory")
        yield
        app.state.services.cpu.close()
        await live.aclose()
        store.close()
        live.close()

    # max_body_size: FastAPI's body limit (starlette.middleware.body_limit), 413 whether or not
    # the body has a Content-Length.
    app = _Service(title="Actuator", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                   max_body_size=settings.max_body_bytes, docs_url=None, redoc_url=None)  # api/pages.py's
    app.state.metrics = Metrics(retire_after=settings.metrics_retire_after)

    install_error_handlers(app, settings.max_body_bytes)

    app.include_router(health.router)
    app.include_router(policies.router)
    app.include_router(runs.router)
    app.include_router(control.router)
    app.include_router(ui.router)
    app.include_router(pages.router)
    app.mount("/ui/static", ui.static_files(), name="ui-static")
    app.add_middleware(BrowserGuard, hosts=settings.trusted_hosts(), origins=settings.allowed_origins)
    app.add_middleware(ConsoleHeaders)
    app.add_middleware(HtmlHeaders)
    app.add_middleware(Timing, metrics=app.state.metrics)
    return app
