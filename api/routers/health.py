"""Liveness/readiness and Prometheus exposition."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..deps import ServicesDep

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Service health: store and live state reachable")
def healthz(services: ServicesDep) -> JSONResponse:
    checks: dict[str, str] = {}
    ok = True
    for name, probe in (("store", services.store.ping), ("live", services.live.ping)):
        try:
            probe()
            checks[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - health reports any backend failure
            checks[name] = f"error: {type(exc).__name__}"
            services.metrics.backend_errors.labels(name).inc()
            ok = False
    return JSONResponse({"status": "ok" if ok else "degraded", "checks": checks},
                        status_code=200 if ok else 503, headers={} if ok else {"Retry-After": "2"})


@router.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
def metrics(services: ServicesDep) -> Response:
    return Response(generate_latest(services.metrics.registry), media_type=CONTENT_TYPE_LATEST)
