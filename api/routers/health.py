"""Liveness/readiness and Prometheus exposition."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from actuator.schemas import HealthPublic

from ..deps import HealthReaderDep, MetricsReaderDep, ReaderDep, ServicesDep
from ..errors import error_responses

router = APIRouter(tags=["health"])
# Token mode without ACTUATOR_DOCS_PUBLIC: the API document for a token holder (a client
# generator sends the header), in place of FastAPI's open /openapi.json.
api_document = APIRouter(include_in_schema=False)


@api_document.get("/openapi.json")
def openapi(_: ReaderDep, request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/healthz", response_model=HealthPublic, summary="Service health: store and live state reachable",
            responses={**error_responses(401, 403),
                       503: {"model": HealthPublic, "description": "A backend is unreachable (Retry-After)"}},
            description="Open in open mode; in token mode it needs a viewer or the admin token unless "
                        "ACTUATOR_HEALTH_PUBLIC=true.")
def healthz(_: HealthReaderDep, services: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {}
    ok = True
    # (check name, backend label of actuator_backend_errors_total, probe)
    for name, backend, probe in (("store", "store", services.store.ping), ("live", "redis", services.live.ping)):
        try:
            probe()
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - health reports any backend failure
            checks[name] = f"error: {type(exc).__name__}"
            services.metrics.backend_errors.labels(backend).inc()
            ok = False
    health = HealthPublic(status="ok" if ok else "degraded", checks=checks)
    return JSONResponse(health.model_dump(), status_code=200 if ok else 503,
                        headers={} if ok else {"Retry-After": "2"})


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
def metrics(_: MetricsReaderDep, services: ServicesDep) -> Response:
    """Every worker's metrics when the service runs with several (``PROMETHEUS_MULTIPROC_DIR``)."""
    body, content_type = services.metrics.render()
    return Response(body, media_type=content_type)
