"""The FastAPI application factory. Nothing is built at import time: settings come in."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from actuator import __version__
from actuator.config import Settings, load_plugins
from actuator.live import make_live
from actuator.metrics import Metrics
from actuator.migrate import upgrade
from actuator.notify import Notifier
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
and registers runs; each run gets its own agent token, shown once at registration. With the admin
token set, reads need a token too: a viewer token (``ACTUATOR_VIEWER_TOKEN``) or the admin token
reads everything, a run's token reads that run.

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
    """FastAPI with two additions: the body limit's own 413 carries the error envelope, and the
    body deadline (outermost)."""

    body_timeout: float = 30.0

    def build_middleware_stack(self) -> ASGIApp:
        return BodyDeadline(_EnvelopeTooLarge(super().build_middleware_stack(), self.max_body_size),
                            self.body_timeout)


def _abort_of(send: Send) -> Callable[[], None] | None:
    """The connection's abort, under uvicorn: ``send`` is its request cycle's bound method, which
    holds the transport. None under another server."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    abort = getattr(transport, "abort", None)
    return abort if callable(abort) else None


class BodyDeadline:
    """A request's whole body must arrive within ``seconds`` of its head (the head's own deadline is
    the server's, api/protocol.py): a body that trickles past it is answered 408 and its connection
    closed, and the app reads a disconnect. A response that starts before the app read the body (a
    refusal, a route that takes none) first takes the rest of the body under the same deadline, so
    no connection stays open on a body nobody reads.

    Outermost, so it also gives the app ``scope["actuator.abort"]``: cut this connection now unless
    its response has ended (a live stream whose client stopped reading, api/streams.py)."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        complete = aborted = gone = False
        transport_abort = _abort_of(send)
        if transport_abort is not None:
            def abort() -> None:
                nonlocal aborted
                if not complete:
                    aborted = True
                    transport_abort()
            scope["actuator.abort"] = abort
        headers = Headers(scope=scope)
        body_done = headers.get("content-length", "0") in ("0", "") and "transfer-encoding" not in headers
        replied = False  # our 408 went out: whatever the app answers after is dropped
        started = False
        deadline = asyncio.get_running_loop().time() + self.seconds

        async def timed_receive() -> Message:
            nonlocal body_done, replied, gone
            if body_done or replied:
                message = await receive()
                gone = gone or message["type"] == "http.disconnect"
                return message
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                if not started:
                    replied = True
                    response = error_response(ApiError(
                        408, f"request body not received within {self.seconds:g} s of its headers "
                             "(ACTUATOR_BODY_TIMEOUT)", headers={"Connection": "close"}))
                    await send({"type": "http.response.start", "status": 408, "headers": response.raw_headers})
                    await send({"type": "http.response.body", "body": response.body})
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started, complete
            if message["type"] == "http.response.start":
                while not body_done and not replied:  # the body nobody read: take it (or 408) first
                    if (await timed_receive())["type"] == "http.disconnect":
                        break
            if replied:
                return
            started = True
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception as exc:
            # The app's reaction to a body cut off, a connection cut, or a client gone in the middle
            # of a streamed answer (FastAPI's SSE pipeline raises when its reader goes away) is
            # not an error of its own.
            if not (replied or aborted or gone):
                raise
            log.debug("%s %s ended with %s after its connection ended", scope["method"], scope["path"],
                      type(exc).__name__)


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


def create_app(settings: Settings | None = None, *, own_process: bool = True) -> FastAPI:
    """The service. ``own_process``: the service is the process (``actuator serve``, uvicorn's
    factory), so its start-up objects are frozen out of the garbage collector's walk; False when
    it is embedded in a training process (api/embedded.py), whose objects are not its to freeze."""
    settings = settings or Settings()
    load_plugins(settings.plugins)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            upgrade(settings.database_url)
        store = Store(settings.database_url)
        live = make_live(settings.redis_url, publish_timeout=settings.live_timeout,
                         on_unpublished=app.state.metrics.unpublished.inc)
        metrics = app.state.metrics
        notifier = None if not settings.webhook_url else Notifier(
            settings.webhook_url, console=settings.public_url or f"http://{settings.host}:{settings.port}",
            queue_size=settings.webhook_queue, retries=settings.webhook_retries, backoff=settings.webhook_backoff,
            timeout=settings.webhook_timeout, count=lambda outcome: metrics.notifications.labels(outcome).inc())
        app.state.services = Services(settings=settings, store=store, live=live, metrics=metrics, notifier=notifier,
                                      cpu=WorkerPool.from_settings(settings))
        log.info("actuator service ready (store=%s, live=%s)", store.engine.dialect.name,
                 "redis" if settings.redis_url else "memory")
        # What start-up built lives as long as the service: out of the collector's sight, a full
        # collection walks only what requests allocate (it took ~110 ms on a 2-core machine with
        # everything imported, a stall of one ingest answer in every few hundred; 1-2 ms frozen).
        if own_process:
            gc.collect()
            gc.freeze()
        yield
        app.state.services.cpu.close()
        if notifier is not None:
            notifier.close()
        await live.aclose()
        store.close()
        live.close()

    # max_body_size: FastAPI's body limit (starlette.middleware.body_limit), 413 whether or not
    # the body has a Content-Length.
    # Token mode: /docs and /redoc off, /openapi.json for a token holder (ACTUATOR_DOCS_PUBLIC opens them).
    docs = settings.docs_open
    app = _Service(title="Actuator", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                   max_body_size=settings.max_body_bytes, openapi_url="/openapi.json" if docs else None,
                   docs_url=None, redoc_url=None)  # api/pages.py's, when docs are open
    app.body_timeout = settings.body_timeout
    app.state.metrics = Metrics(retire_after=settings.metrics_retire_after)

    install_error_handlers(app, settings.max_body_bytes)

    app.include_router(health.router)
    if not docs:
        app.include_router(health.api_document)
    app.include_router(policies.router)
    app.include_router(runs.router)
    app.include_router(control.router)
    app.include_router(ui.router)
    if docs:  # /docs and /redoc from vendored assets; off in token mode unless ACTUATOR_DOCS_PUBLIC
        app.include_router(pages.router)
    app.mount("/ui/static", ui.static_files(), name="ui-static")
    app.add_middleware(BrowserGuard, hosts=settings.trusted_hosts(), origins=settings.allowed_origins)
    app.add_middleware(ConsoleHeaders)
    app.add_middleware(HtmlHeaders)
    app.add_middleware(Timing, metrics=app.state.metrics)
    return app
