"""A typed httpx client for the controller service (used by the agent, the CLI and tests).

Answers are read tolerantly: fields this version does not know (what a newer service adds) are
ignored at every depth. What cannot be read at all is not the service's word and raises
:class:`ServiceUnavailable`, as a network error does (retrying later may work): an answer that is
not JSON or not of the expected shape (a captive portal's HTML page, a truncated body), a 4xx
without the service's error envelope (a proxy's page), an answer not complete within the
request's ``timeout``. Only a 4xx carrying the envelope is a refusal (:class:`RequestRejected`).
"""

from __future__ import annotations

import re
import time
from typing import Any, TypeVar

import httpx
from pydantic import TypeAdapter, ValidationError

from ._exceptions import ClientError, Forbidden, NotFound, RequestRejected, ServiceUnavailable, Unauthorized
from .schemas import (
    DecisionPage,
    ErrorPublic,
    IngestResult,
    ObservationBatch,
    RunCreate,
    RunCreated,
    RunPublic,
    RunState,
)

__all__ = ["ActuatorClient"]

T = TypeVar("T")
# What the service takes as a run id in a path (api.deps.RunId); runs are listed a page at a time.
_RUN_ID = re.compile(r"[A-Za-z0-9\-]{1,64}")
_RUNS_PAGE = 1000


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _parse(kind: type[T], body: bytes) -> T:
    """``body`` as ``kind``, fields it does not declare ignored (nested models included); raises
    ValidationError (also for a body that is not JSON)."""
    adapter = _ADAPTERS.get(kind) or _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    result: T = adapter.validate_json(body, extra="ignore")
    return result


def _why(exc: ValidationError) -> str:
    """The first problem, without the input (an answer may carry a token)."""
    err = exc.errors(include_input=False, include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def _refusal(method: str, path: str, status: int, body: bytes) -> ClientError:
    """The error an answer with status >= 400 stands for."""
    where = f"{method} {path}: {status}"
    try:
        envelope: ErrorPublic | None = _parse(ErrorPublic, body)
    except ValidationError:
        envelope = None
    if status >= 500 or status == 429:
        return ServiceUnavailable(f"{where} {envelope.detail.message if envelope else 'without an error envelope'}",
                                  status_code=status)
    if envelope is None:
        # Every 4xx of the service carries the envelope: this one comes from a proxy, a gateway or
        # a portal in the way, and says nothing about the request itself.
        return ServiceUnavailable(f"{where} without the service's error envelope (not the service answering)",
                                  status_code=status)
    cls: type[RequestRejected] = {401: Unauthorized, 403: Forbidden, 404: NotFound}.get(status, RequestRejected)
    return cls(f"{where} {envelope.detail.message}", status_code=status,
               detail=envelope.detail.model_dump(mode="json"))


class ActuatorClient:
    """``ActuatorClient("http://127.0.0.1:8000", token=...)``: ``token`` goes with every request. A
    service with an admin token keeps its reads behind a token too: the admin token or a viewer
    token (``ACTUATOR_VIEWER_TOKEN`` of the service) reads everything, a run's own token reads that
    run (the read methods about one run take ``token=`` for it). Network failures, 5xx, answers that
    cannot be read and answers slower than ``timeout`` raise :class:`ServiceUnavailable`; the
    service's refusals (4xx) raise a :class:`RequestRejected` subclass.

    ``timeout`` is the longest one request may take, its whole answer included: each network
    operation waits at most that long, and an answer still arriving past it (a body fed a byte at a
    time) is abandoned at its next chunk. ``max_answer_bytes`` (None: no limit) is the largest
    answer read: a larger one is abandoned as soon as it is known to be (its Content-Length, or the
    chunk that passes the limit) and raises :class:`ServiceUnavailable` whose ``detail`` is
    ``{"max_answer_bytes": limit}``, before any of it is parsed.
    """

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 5.0,
                 transport: httpx.BaseTransport | None = None, max_answer_bytes: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ActuatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, token: str | None = None, timeout: float | None = None,
                 **kw: Any) -> bytes:
        """The answer's body, read within the deadline; raises for an error status."""
        headers = kw.pop("headers", {})
        tok = token or self.token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        cap = self.max_answer_bytes
        try:
            # Streamed: httpx's timeouts bound each read, never the whole answer.
            with self._http.stream(method, path, headers=headers, timeout=limit, **kw) as resp:
                declared = resp.headers.get("content-length", "")
                if cap is not None and declared.isdigit() and int(declared) > cap:
                    raise self._too_large(method, path, f"{int(declared):,} bytes")
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if cap is not None and len(body) > cap:
                        raise self._too_large(method, path, f"more than {cap:,} bytes")
                    if time.monotonic() > deadline:
                        raise ServiceUnavailable(f"{method} {path}: no complete answer within {limit:g} s")
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise _refusal(method, path, resp.status_code, bytes(body))
        return bytes(body)

    def _too_large(self, method: str, path: str, size: str) -> ServiceUnavailable:
        return ServiceUnavailable(f"{method} {path}: an answer of {size}, over this agent's limit of "
                                  f"{self.max_answer_bytes:,} bytes (max_answer_bytes); abandoned unread",
                                  detail={"max_answer_bytes": self.max_answer_bytes})

    def _call(self, kind: type[T], method: str, path: str, **kw: Any) -> T:
        """One request, its answer read as ``kind``."""
        body = self._request(method, path, **kw)
        try:
            return _parse(kind, body)
        except ValidationError as exc:
            raise ServiceUnavailable(f"{method} {path}: an answer this client cannot read ({_why(exc)})") from exc

    # -- service ---------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._call(dict[str, Any], "GET", "/healthz")

    # -- policies ----------------------------------------------------------------------------
    def create_policy(self, document: dict[str, Any]) -> dict[str, Any]:
        return self._call(dict[str, Any], "POST", "/v1/policies", json=document)

    def get_policy(self, name: str, version: int | None = None, *, token: str | None = None) -> dict[str, Any]:
        path = f"/v1/policies/{name}" + (f"/versions/{version}" if version else "")
        return self._call(dict[str, Any], "GET", path, token=token)

    def validate_policy(self, document: dict[str, Any]) -> dict[str, Any]:
        return self._call(dict[str, Any], "POST", "/v1/policies/validate", json=document)

    def tune_policy(self, run_id: str, controller: str, *, aggressiveness: float = 1.0,
                    policy: str | dict[str, Any] | None = None, horizon: int | None = None) -> dict[str, Any]:
        """``POST /v1/policies/tune``: the fitted model, proposed gains, predicted response, policy."""
        body: dict[str, Any] = {"run_id": run_id, "controller": controller, "aggressiveness": aggressiveness}
        if policy is not None:
            body["policy"] = policy
        if horizon is not None:
            body["horizon"] = horizon
        return self._call(dict[str, Any], "POST", "/v1/policies/tune", json=body, timeout=120)

    # -- runs --------------------------------------------------------------------------------
    def register_run(self, body: RunCreate | dict[str, Any], *, timeout: float | None = None) -> RunCreated:
        """``timeout`` overrides the client's for this request (registration stores a policy and
        the run: slower than an ingest, and worth a longer wait than a retry of it)."""
        payload = body.model_dump(mode="json") if isinstance(body, RunCreate) else body
        return self._call(RunCreated, "POST", "/v1/runs", json=payload, timeout=timeout)

    def list_runs(self, *, token: str | None = None, **params: Any) -> list[RunPublic]:
        params = {k: v for k, v in params.items() if v is not None}
        return self._call(list[RunPublic], "GET", "/v1/runs", params=params, token=token)

    def get_run(self, run_id: str, *, token: str | None = None) -> RunState:
        """``token``: for this request instead of the client's (e.g. the run's own token)."""
        return self._call(RunState, "GET", f"/v1/runs/{run_id}", token=token)

    FIND_MOST = 10

    def find_runs(self, ref: str) -> list[RunPublic]:
        """The runs ``ref`` may name, for a person typing it: the run with that id if there is one;
        else the runs of that name and those whose id starts with it, newest first (at most
        ``FIND_MOST + 1``: enough to list the candidates and say there are more)."""
        if _RUN_ID.fullmatch(ref):
            try:
                return [self.get_run(ref)]
            except NotFound:
                pass
        found: dict[str, RunPublic] = {}
        if len(ref) <= 128:  # a run's name is at most that long
            found.update((r.id, r) for r in self.list_runs(name=ref, limit=self.FIND_MOST + 1))
        offset = 0
        while _RUN_ID.fullmatch(ref) and len(found) <= self.FIND_MOST:
            page = self.list_runs(limit=_RUNS_PAGE, offset=offset)
            found.update((r.id, r) for r in page if r.id.startswith(ref))
            if len(page) < _RUNS_PAGE:
                break
            offset += _RUNS_PAGE
        return sorted(found.values(), key=lambda r: r.created_at, reverse=True)[:self.FIND_MOST + 1]

    def post_observations(self, run_id: str, batch: ObservationBatch, *, token: str | None = None) -> IngestResult:
        return self._call(IngestResult, "POST", f"/v1/runs/{run_id}/observations", token=token,
                          content=batch.model_dump_json(), headers={"Content-Type": "application/json"})

    def list_decisions(self, run_id: str, *, offset: int = 0, limit: int = 100,
                       token: str | None = None) -> DecisionPage:
        return self._call(DecisionPage, "GET", f"/v1/runs/{run_id}/decisions", params={"offset": offset, "limit": limit},
                          token=token)

    def halt(self, run_id: str, *, token: str | None = None) -> RunPublic:
        return self._call(RunPublic, "POST", f"/v1/runs/{run_id}/halt", token=token)

    def finish(self, run_id: str, *, token: str | None = None) -> RunPublic:
        return self._call(RunPublic, "POST", f"/v1/runs/{run_id}/finish", token=token)
