"""A typed httpx client for the controller service (used by the agent, the CLI and tests)."""

from __future__ import annotations

from typing import Any

import httpx

from ._exceptions import ClientError, Forbidden, NotFound, RequestRejected, ServiceUnavailable, Unauthorized
from .schemas import DecisionPage, IngestResult, ObservationBatch, RunCreate, RunCreated, RunPublic, RunState

__all__ = ["ActuatorClient"]


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        detail: Any = resp.json().get("detail")
    except ValueError:
        detail = resp.text[:500]
    message = detail.get("message") if isinstance(detail, dict) else detail
    text = f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {message}"
    cls: type[ClientError]
    if resp.status_code == 401:
        cls = Unauthorized
    elif resp.status_code == 403:
        cls = Forbidden
    elif resp.status_code == 404:
        cls = NotFound
    elif resp.status_code >= 500 or resp.status_code == 429:
        cls = ServiceUnavailable
    else:
        cls = RequestRejected
    raise cls(text, status_code=resp.status_code, detail=detail)


class ActuatorClient:
    """``ActuatorClient("http://127.0.0.1:8000", token=...)``. Network failures and 5xx raise
    :class:`ServiceUnavailable`; 4xx raise a :class:`RequestRejected` subclass."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 5.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ActuatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, *, token: str | None = None, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        tok = token or self.token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        try:
            resp = self._http.request(method, path, headers=headers, **kw)
        except httpx.HTTPError as exc:
            raise ServiceUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        _raise_for(resp)
        return resp

    # -- service ---------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz").json()

    # -- policies ----------------------------------------------------------------------------
    def create_policy(self, document: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/policies", json=document).json()

    def get_policy(self, name: str, version: int | None = None) -> dict[str, Any]:
        path = f"/v1/policies/{name}" + (f"/versions/{version}" if version else "")
        return self._request("GET", path).json()

    def validate_policy(self, document: dict[str, Any]) -> dict[str, Any]:
        return self._request("POST", "/v1/policies/validate", json=document).json()

    def tune_policy(self, run_id: str, controller: str, *, aggressiveness: float = 1.0,
                    policy: str | dict[str, Any] | None = None, horizon: int | None = None) -> dict[str, Any]:
        """``POST /v1/policies/tune``: the fitted model, proposed gains, predicted response, policy."""
        body: dict[str, Any] = {"run_id": run_id, "controller": controller, "aggressiveness": aggressiveness}
        if policy is not None:
            body["policy"] = policy
        if horizon is not None:
            body["horizon"] = horizon
        return dict(self._request("POST", "/v1/policies/tune", json=body, timeout=120).json())

    # -- runs --------------------------------------------------------------------------------
    def register_run(self, body: RunCreate | dict[str, Any], *, timeout: float | None = None) -> RunCreated:
        """``timeout`` overrides the client's for this request (registration stores a policy and
        the run: slower than an ingest, and worth a longer wait than a retry of it)."""
        payload = body.model_dump(mode="json") if isinstance(body, RunCreate) else body
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        return RunCreated.model_validate(self._request("POST", "/v1/runs", json=payload, **extra).json())

    def list_runs(self, **params: Any) -> list[RunPublic]:
        params = {k: v for k, v in params.items() if v is not None}
        return [RunPublic.model_validate(r) for r in self._request("GET", "/v1/runs", params=params).json()]

    def get_run(self, run_id: str) -> RunState:
        return RunState.model_validate(self._request("GET", f"/v1/runs/{run_id}").json())

    def post_observations(self, run_id: str, batch: ObservationBatch, *, token: str | None = None) -> IngestResult:
        resp = self._request("POST", f"/v1/runs/{run_id}/observations", token=token,
                             content=batch.model_dump_json(), headers={"Content-Type": "application/json"})
        return IngestResult.model_validate(resp.json())

    def list_decisions(self, run_id: str, *, offset: int = 0, limit: int = 100) -> DecisionPage:
        resp = self._request("GET", f"/v1/runs/{run_id}/decisions", params={"offset": offset, "limit": limit})
        return DecisionPage.model_validate(resp.json())

    def halt(self, run_id: str, *, token: str | None = None) -> RunPublic:
        return RunPublic.model_validate(self._request("POST", f"/v1/runs/{run_id}/halt", token=token).json())

    def finish(self, run_id: str, *, token: str | None = None) -> RunPublic:
        return RunPublic.model_validate(self._request("POST", f"/v1/runs/{run_id}/finish", token=token).json())
