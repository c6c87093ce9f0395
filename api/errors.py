"""The service's one error envelope: the exception routers raise, the handlers that answer every
error with it, and the ``responses=`` declarations that put it in the OpenAPI document.

Every 4xx and 5xx body is :class:`~actuator.schemas.ErrorPublic`:
``{"detail": {"message": "...", "errors": [{"loc": ..., "msg": ..., "type": ...}]}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from actuator.schemas import ErrorDetail, ErrorItem, ErrorPublic
from actuator._exceptions import ActuatorError

__all__ = ["ApiError", "error_response", "error_responses", "install_error_handlers"]

log = logging.getLogger("actuator.api")

_DESCRIPTIONS = {
    400: "The body could not be read (not UTF-8)",
    401: "No bearer token, not a bearer token, or a token the service does not know",
    403: "The token does not grant this (another run's token, a run's token outside its run, not the admin "
         "token)",
    404: "No such run or policy",
    409: "The request conflicts with the run's state or its stored observations",
    413: "Request body over ACTUATOR_MAX_BODY_BYTES",
    422: "Invalid request: every problem with its field",
    429: "Too many requests of this kind in progress (a concurrency cap): retry after Retry-After seconds",
    503: "Store or live state unavailable: retry after Retry-After seconds",
}


class ApiError(ActuatorError, StarletteHTTPException):
    """An error answer. ``errors`` are ``{"loc", "msg"[, "type"]}`` mappings; the message defaults
    to all of them on one line."""

    def __init__(self, status_code: int, message: str | None = None,
                 errors: Iterable[Mapping[str, Any]] = (), headers: Mapping[str, str] | None = None) -> None:
        items = [ErrorItem.model_validate(e) for e in errors]
        if message is None:
            message = "; ".join(f"{e.loc}: {e.msg}" for e in items)
        self.error = ErrorDetail(message=message, errors=items)
        super().__init__(status_code, message, dict(headers) if headers else None)

    @classmethod
    def invalid(cls, loc: str, msg: str, status_code: int = 422) -> ApiError:
        """One field is wrong: ``loc: msg``."""
        return cls(status_code, f"{loc}: {msg}", [{"loc": loc, "msg": msg}])


def error_responses(*codes: int, by_reference: bool = False) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: the envelope under each status it can answer.

    ``by_reference``: for a route whose own answer is not JSON (Server-Sent Events). FastAPI puts
    a ``model`` under the route's media type, which would declare the JSON errors as
    text/event-stream; these name application/json and refer to the ErrorPublic component (which
    the routes answering JSON register)."""
    if by_reference:
        return {code: {"description": _DESCRIPTIONS[code],
                       "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}}}
                for code in codes}
    return {code: {"model": ErrorPublic, "description": _DESCRIPTIONS[code]} for code in codes}


def error_response(exc: ApiError) -> JSONResponse:
    body = ErrorPublic(detail=exc.error).model_dump(mode="json", exclude_none=True)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


def _loc(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc)


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return cause.split(kind)[0] is not None
    return isinstance(cause, kind)


def _allowed(request: Request) -> str:
    """The methods of the resource at the request's path (each method is its own route). As in
    OpenAPI, a concrete path comes before a templated one: /v1/policies/schema is not the policy
    named 'schema'."""
    matching: dict[int, set[str]] = {}
    for route in iter_route_contexts(request.app.routes):
        regex, path = getattr(route, "path_regex", None), route.path or ""
        if regex is not None and regex.match(request.url.path):
            matching.setdefault(path.count("{"), set()).update(route.methods or ())
    return ", ".join(sorted(matching[min(matching)])) if matching else ""


def install_error_handlers(app: FastAPI, max_body_bytes: int) -> None:
    """Answer every error the app or the libraries raise with the envelope."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": _loc(e.get("loc", ())), "msg": str(e.get("msg", "")).removeprefix("Value error, "),
                   "type": e.get("type")} for e in exc.errors()]
        return error_response(ApiError(422, None, errors))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc, ApiError):
            return error_response(exc)
        if exc.status_code == 413:  # the body limit (starlette.middleware.body_limit)
            return error_response(ApiError(413, f"request body over {max_body_bytes} bytes", headers=exc.headers))
        # FastAPI turns an error met while parsing the body into a bare 400 (invalid UTF-8, ...).
        if exc.status_code == 400:
            if _caused_by(exc, RecursionError):
                return error_response(ApiError(422, None, [{"loc": "body", "msg": "JSON nested too deeply",
                                                     "type": "json_invalid"}]))
            return error_response(ApiError(400, None, [{"loc": "body", "msg": str(exc.detail), "type": "body_unreadable"}]))
        if exc.status_code == 405:  # Starlette's Allow names only the first route of the path
            return error_response(ApiError(405, str(exc.detail), headers={**(exc.headers or {}), "Allow": _allowed(request)}))
        # The framework's own (unknown path 404, 405 with its Allow header, ...): its text as the message.
        return error_response(ApiError(exc.status_code, str(exc.detail), headers=exc.headers))

    @app.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # A value the database refuses (out of its integer range, NUL in text, ...): the request's
        # fault, and deterministic, so a 422 (a 5xx would make agents retry it forever).
        log.warning("store refused a value on %s: %s", request.url.path, type(exc.orig).__name__)
        return error_response(ApiError.invalid("body", "a value is outside what the store can hold"))

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeout)  # every pooled connection busy for pool_timeout seconds
    async def store_down(request: Request, exc: Exception) -> JSONResponse:
        app.state.metrics.backend_errors.labels("store").inc()
        log.warning("store unavailable on %s: %s", request.url.path, type(exc).__name__)
        return error_response(ApiError(503, "store unavailable, retry later", headers={"Retry-After": "2"}))

    try:
        import redis.exceptions as rexc

        @app.exception_handler(rexc.RedisError)
        async def redis_down(request: Request, exc: Exception) -> JSONResponse:
            app.state.metrics.backend_errors.labels("redis").inc()
            log.warning("redis error on %s: %s", request.url.path, type(exc).__name__)
            return error_response(ApiError(503, "live state unavailable, retry later", headers={"Retry-After": "2"}))
    except ImportError:  # pragma: no cover
        pass
