"""Settings of the controller service, from the environment (``ACTUATOR_`` prefix) or arguments."""

from __future__ import annotations

import importlib
import ipaddress
import logging
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["Settings", "DEFAULT_DATABASE_URL", "LOOPBACK_HOSTS", "is_loopback"]

DEFAULT_DATABASE_URL = "sqlite:///./actuator.db"
# The names a request to a loopback address carries in its Host header. Always answered: a page
# that reaches the service under one of them is on this machine, not a DNS-rebound name.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether a bind address (or host name) is this machine only: ``localhost``, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _comma_list(value: Any) -> Any:
    """ACTUATOR_ALLOWED_HOSTS=a.example,b.example (a list given in code is kept)."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


log = logging.getLogger("actuator")


def load_plugins(names: Iterable[str]) -> None:
    """Import the modules ``ACTUATOR_PLUGINS`` names (each registers what it adds, e.g. a control
    law: controllers/registry.py); a module that cannot be imported stops the start, naming the
    setting and the module."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            message = f"ACTUATOR_PLUGINS: cannot import {name!r}: {exc}"
            log.error("%s", message)  # the service stops; its log says why
            raise RuntimeError(message) from exc
        log.info("plugin %s imported", name)


class Settings(BaseSettings):
    """Service settings. Embedded default: SQLite file + in-process live state.

    Production: ``ACTUATOR_DATABASE_URL=postgresql+psycopg://...`` and
    ``ACTUATOR_REDIS_URL=redis://...``.
    """

    model_config = SettingsConfigDict(env_prefix="ACTUATOR_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="SQLAlchemy URL of the store.")
    redis_url: str | None = Field(None, description="Redis URL for live state; None = in-process.")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for policy management, run registration and operator actions; it "
        "also reads everything. Set, it puts the service in token mode: nothing about runs or policies is "
        "readable without a token. None = open mode (a laptop: anyone who reaches the port reads and writes).")
    # Token mode only (docs/reference/service.md, "Who reads what").
    viewer_token: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Read-only bearer tokens (comma-separated, one per reader or team): "
        "every run and policy, the console, live streams; no write. Needs ACTUATOR_ADMIN_TOKEN.")
    metrics_public: bool | None = Field(
        None, description="Serve /metrics without a token. Default: yes in open mode, no in token mode (then "
        "a viewer or the admin token reads it: Prometheus sends it with an `authorization:` block).")
    health_public: bool | None = Field(
        None, description="Serve /healthz without a token. Default: yes in open mode, no in token mode.")
    docs_public: bool = Field(
        False, description="Token mode: serve /docs, /redoc and /openapi.json without a token. By default "
        "/docs and /redoc are off in token mode and /openapi.json needs a viewer or the admin token.")
    # A web page of another site can send state-changing requests to the service from the user's
    # browser (a form, a no-cors fetch), and a DNS-rebound name makes the page's origin the
    # service's own: the service answers only the Host names below, and changes nothing for a
    # browser request whose Origin is not its own (README, "Open mode and browsers").
    allowed_hosts: Annotated[list[str] | None, NoDecode] = Field(
        None, description="Host names (comma-separated; '*.example.com' for subdomains, '*' for any) the service "
        "answers to besides the loopback names. Default: none when `host` is a loopback address, any otherwise.")
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins (scheme://host[:port], comma-separated) whose pages may change "
        "runs and policies besides the service's own (a console served elsewhere).")
    plugins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Python modules (comma-separated) the service imports at start, each "
        "registering what it adds: a control law (`register(kind, spec=..., law=...)`, controllers/registry.py).")
    migrate_on_start: bool = True
    max_batch: int = Field(1000, ge=1, description="Most observations accepted in one request.")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Largest request body accepted.")
    log_level: str = "info"
    # Bounds on the work one request may cause (README, "Limits"). A run can hold 100k+
    # observations and decisions: no answer is allowed to grow with them. (The header timeout
    # is an option of `actuator serve`, ACTUATOR_HEADER_TIMEOUT: it belongs to the server.)
    max_pending_decisions: int = Field(
        1000, ge=1, description="Most decisions one ingest answer carries; `more_decisions` says there are more.")
    report_points: int = Field(1000, ge=10, description="Most points per series in a report (downsampled).")
    report_total_points: int = Field(100_000, ge=1000, description="Most points over all series of a report.")
    report_decisions: int = Field(1000, ge=1, description="Most decisions (the latest) listed in a report.")
    report_events: int = Field(1000, ge=1, description="Most events (the latest) listed in a report.")
    report_panels: int = Field(12, ge=1, description="Most panels (probes, then knobs) in a PNG or HTML report.")
    simulate_observations: int = Field(
        5000, ge=1, description="Most observations a simulation replays; a longer run is refused (422).")
    tune_observations: int = Field(
        200, ge=10, description="Most observations a tune identifies from (its work grows with them: about 1 "
        "CPU-s per 100): a longer run is downsampled to every k-th observation and the last, and the answer's "
        "warnings say so.")
    # Work that costs more than a read (simulate, validate, tune, PNG/HTML reports) runs in worker
    # processes off the serving workers, bounded (api/workers.py; README, "Limits"). Per serving
    # process: `actuator serve --workers N` has N times these.
    worker_processes: int = Field(
        2, ge=1, le=64, description="Worker processes for costly work (simulate, validate, tune, report plots), "
        "per serving process; started on first use.")
    worker_nice: int = Field(
        10, ge=0, le=19, description="Niceness added to the worker processes: on busy cores the processes serving "
        "requests (every run's ingest) are scheduled first.")
    worker_wait: float = Field(
        30.0, gt=0, le=3600, description="Seconds a costly request waits for a free worker process before a 503 "
        "with Retry-After.")
    worker_timeout: float = Field(
        300.0, gt=0, le=86400, description="Seconds a costly request's work may run; then its worker process is "
        "ended and the answer is 503.")
    simulate_concurrency: int = Field(
        2, ge=1, description="Most POST /v1/policies/simulate requests in progress per serving process; one more "
        "is answered 429 with Retry-After.")
    validate_concurrency: int = Field(
        4, ge=1, description="Most POST /v1/policies/validate requests in progress per serving process (429 past it).")
    render_concurrency: int = Field(
        2, ge=1, description="Most PNG or HTML reports being drawn per serving process (429 past it).")
    tune_concurrency: int = Field(
        1, ge=1, description="Most POST /v1/policies/tune requests in progress per serving process (429 past it).")
    simulate_decisions: int = Field(
        1000, ge=1, description="Most decisions (and actions, events: the first ones) a simulation answer lists; "
        "`decisions_total` and the others count all. A larger `max_decisions` is refused (422).")
    simulate_trace_points: int = Field(
        1000, ge=10, description="Most points of a simulation's trace: every k-th replayed observation and the last "
        "(`trace_every` says k). A larger `trace_points` is refused (422).")
    policy_page_bytes: int = Field(
        4_000_000, ge=1_000_000, description="A page of GET /v1/policies ends before its documents exceed this.")
    stream_keepalive: float = Field(
        15.0, gt=0, le=3600, description="Seconds an idle event stream (GET /v1/runs/{id}/stream) waits before a "
        "keep-alive comment (`: ping`): proxies close connections idle for longer than they allow.")
    webhook_url: str | None = Field(
        None, description="URL the service POSTs a JSON notification to for each guardrail breach, halt and "
        "rollback (actuator.notify); None = no notifications.")
    webhook_queue: int = Field(
        1000, ge=1, description="Most notifications waiting for delivery per service process; a full queue drops "
        "the new one (counted: actuator_notifications_total{outcome=\"dropped\"}). Ingest never waits on it.")
    webhook_retries: int = Field(3, ge=0, le=10, description="Retries of a failed webhook POST.")
    webhook_backoff: float = Field(
        0.5, ge=0, le=60, description="Seconds before the first retry; doubled at each next one.")
    webhook_timeout: float = Field(5.0, gt=0, le=60, description="Seconds one webhook POST may take.")
    public_url: str | None = Field(
        None, description="The service's base URL as people reach it, for the console links of notifications. "
        "Default: http://HOST:PORT.")
    # Transport bounds (docs/reference/limits.md). Live streams are counted per worker process.
    body_timeout: float = Field(
        30.0, gt=0, le=3600, description="Seconds a client has, from the end of a request's headers, to send its "
        "whole body; then 408 and the connection is closed (slow bodies).")
    max_connections: int | None = Field(
        None, ge=2, description="Connections one worker process serves at once (uvicorn's limit_concurrency; "
        "past it 503). Default: three quarters of the process's open-file limit, at most 4096. Read by "
        "`actuator serve`.")
    stream_max_per_run: int = Field(
        64, ge=1, description="Live event streams (GET /v1/runs/{id}/stream) of one run open at once, per worker "
        "process; past it 429 with Retry-After.")
    stream_max_per_client: int = Field(
        32, ge=1, description="Live event streams one client address holds open at once, per worker process; past "
        "it 429 with Retry-After.")
    stream_queue: int = Field(
        256, ge=1, le=100_000, description="Events queued for one stream's client. A client that takes none of a "
        "full queue for ACTUATOR_STREAM_DROP_AFTER seconds gets a `gap` (reason `behind`) and its stream ends (it "
        "reconnects with Last-Event-ID).")
    stream_drop_after: float = Field(
        10.0, gt=0, le=3600, description="Seconds a stream's client may take nothing from its full queue before "
        "it is behind; then as long again to take its `gap`, else its connection is cut.")
    live_timeout: float = Field(
        0.5, gt=0, le=30, description="Seconds an ingest (or operator action) waits for Redis to take its live "
        "events, after its commit; past it, or with Redis down, the answer goes out without them and the "
        "run's stream gets a `gap` (reason `unpublished`) once Redis answers again.")
    metrics_retire_after: float = Field(
        300.0, ge=0, description="Seconds a finished or halted run's Prometheus series stay exported (so a "
        "scrape sees their final values); then they are removed.")

    _lists = field_validator("allowed_hosts", "allowed_origins", "viewer_token", "plugins", mode="before")(
        classmethod(lambda cls, v: _comma_list(v)))

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        return [o.lower().rstrip("/") for o in v]

    @model_validator(mode="after")
    def _viewer_tokens(self) -> Settings:
        viewers = [t.get_secret_value() for t in self.viewer_token]
        if viewers and self.admin_token is None:
            raise ValueError("viewer_token: viewer tokens need ACTUATOR_ADMIN_TOKEN (without it the service is in "
                             "open mode and every read is open)")
        if self.admin_token is not None and self.admin_token.get_secret_value() in viewers:
            raise ValueError("viewer_token: a viewer token must not be the admin token")
        return self

    @property
    def token_mode(self) -> bool:
        """An admin token is set: reads need a token too (viewer, admin, or a run's own token)."""
        return self.admin_token is not None

    @property
    def metrics_open(self) -> bool:
        return self.metrics_public if self.metrics_public is not None else not self.token_mode

    @property
    def health_open(self) -> bool:
        return self.health_public if self.health_public is not None else not self.token_mode

    @property
    def docs_open(self) -> bool:
        return self.docs_public or not self.token_mode

    def trusted_hosts(self) -> list[str] | None:
        """The Host names answered (lower case, without port), or None for any."""
        extra = self.allowed_hosts if self.allowed_hosts is not None else [] if is_loopback(self.host) else ["*"]
        if "*" in extra:
            return None
        bound = [self.host.lower()] if is_loopback(self.host) and ":" not in self.host else []  # e.g. 127.0.0.2
        return [*LOOPBACK_HOSTS, *bound, *(h.lower() for h in extra)]

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, v: str) -> str:
        if not (v.startswith("sqlite") or v.startswith("postgresql")):
            raise ValueError("database_url must be a sqlite:// or postgresql:// URL")
        if v.startswith("postgresql://"):
            # psycopg 3 is the driver we ship; plain postgresql:// would pick psycopg2.
            v = "postgresql+psycopg://" + v[len("postgresql://") :]
        return v
