"""HTML answers besides the console's: the API's docs (Swagger UI at ``/docs``, ReDoc at
``/redoc``) from vendored files (``api/static/vendor/``, pinned in its VERSIONS by
``scripts/vendor-ui.sh``; nothing from a CDN), and the headers of every HTML answer.

Every HTML answer carries a Content-Security-Policy and ``X-Frame-Options: DENY``: the console's
(``console.SECURITY_HEADERS``), the docs' and the report page's (below, each as narrow as the page
allows), and any other HTML answer the console's by default (``app.HtmlHeaders``)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from actuator import __version__

from .console import SECURITY_HEADERS

__all__ = ["router", "DOCS_HEADERS", "REPORT_HEADERS"]

_STATIC = "/ui/static"

# Swagger UI and ReDoc set inline style attributes and ReDoc starts a worker from a blob: scripts
# from this origin only, still nothing inline, no framing.
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; "
            "form-action 'self'; frame-ancestors 'none'")
DOCS_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": DOCS_CSP}
# The report page: no script at all, its one style sheet inline, its plot a data: image.
REPORT_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
REPORT_HEADERS = {**SECURITY_HEADERS, "Content-Security-Policy": REPORT_CSP}

router = APIRouter(include_in_schema=False)


def _page(title: str, head: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="{_STATIC}/favicon.svg" type="image/svg+xml">{head}</head><body>{body}</body></html>',
        headers=DOCS_HEADERS)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return _page(f"Actuator {__version__} - Swagger UI",
                 f'<link rel="stylesheet" href="{_STATIC}/vendor/swagger-ui/swagger-ui.css">',
                 f'<div id="swagger-ui" data-openapi="/openapi.json"></div>'
                 f'<script src="{_STATIC}/vendor/swagger-ui/swagger-ui-bundle.js"></script>'
                 f'<script src="{_STATIC}/docs.js"></script>')


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    # The standalone bundle starts on its own on the <redoc spec-url> element.
    return _page(f"Actuator {__version__} - ReDoc", "",
                 f'<redoc spec-url="/openapi.json"></redoc><script src="{_STATIC}/vendor/redoc/redoc.standalone.js">'
                 "</script>")
