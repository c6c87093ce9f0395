"""Every HTML answer carries a Content-Security-Policy and X-Frame-Options (the report page, the
API docs, the console), and the docs load nothing from another origin: Swagger UI and ReDoc are
served by the service from vendored, pinned files, and still render under their policy (headless
Chromium). Against the real service under uvicorn, with an admin token."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actuator.testing import Service, make_service
from harden import bearer, post_obs, register, wait_until
from test_open_mode import chromium  # noqa: F401 - the module's headless Chromium fixture

ADMIN = "admin-" + uuid.uuid4().hex
VENDOR = Path(__file__).resolve().parents[2] / "api" / "static" / "vendor"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("html-headers")
    service = make_service(f"sqlite:///{tmp / 'a.db'}", admin_token=ADMIN, log_dir=str(tmp),
                           extra_env={"ACTUATOR_DOCS_PUBLIC": "true"}).start()  # token mode closes /docs otherwise
    yield service
    service.stop()


def _directives(csp: str) -> dict[str, list[str]]:
    return {d.split()[0]: d.split()[1:] for d in (p.strip() for p in csp.split(";")) if d}


def test_every_html_answer_has_a_csp_and_x_frame_options(svc):
    run = register(svc.url, admin=ADMIN)
    assert post_obs(svc.url, run, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.3}}]).status_code == 200
    # Token mode: the console's pages need a token to read (anonymous: the page that asks for one, 401).
    pages = [("/docs", None, 200), ("/redoc", None, 200), ("/ui", ADMIN, 200), (f"/ui/runs/{run['id']}", ADMIN, 200),
             ("/ui", None, 401), (f"/v1/runs/{run['id']}/report?format=html", ADMIN, 200)]
    for path, token, status in pages:
        r = httpx.get(svc.url + path, headers=bearer(token), timeout=120)
        assert r.status_code == status and r.headers["content-type"].startswith("text/html"), (path, r.status_code)
        assert r.headers.get("x-frame-options") == "DENY", (path, dict(r.headers))
        csp = _directives(r.headers.get("content-security-policy", ""))
        assert csp.get("frame-ancestors") == ["'none'"] and csp.get("default-src") == ["'none'"], (path, csp)
        # no inline script anywhere, and scripts only from the service itself
        assert "'unsafe-inline'" not in csp.get("script-src", []) and "'unsafe-eval'" not in csp.get("script-src", [])
        assert all(s == "'self'" for s in csp.get("script-src", [])), (path, csp)
    # the report page: no script at all
    r = httpx.get(f"{svc.url}/v1/runs/{run['id']}/report?format=html", headers=bearer(ADMIN), timeout=120)
    assert "script-src" not in r.headers["content-security-policy"] and "<script" not in r.text


def test_the_docs_load_only_pinned_files_the_service_serves(svc):
    pinned = (VENDOR / "VERSIONS").read_text()
    assert re.search(r"^swagger-ui-dist@5\.\d+\.\d+ sha512-", pinned, re.M), pinned
    assert re.search(r"^redoc@2\.\d+\.\d+ sha512-", pinned, re.M), pinned
    for page in ("/docs", "/redoc"):
        html = httpx.get(svc.url + page).text
        refs = re.findall(r'(?:src|href|spec-url)="([^"]+)"', html) + re.findall(r'data-openapi="([^"]+)"', html)
        assert refs and all(ref.startswith("/") and not ref.startswith("//") for ref in refs), (page, refs)
        for ref in refs:  # each one is the service's own, byte for byte the vendored file
            r = httpx.get(svc.url + ref, timeout=30)
            assert r.status_code == 200, (page, ref)
            if "/vendor/" in ref:
                assert r.content == (VENDOR / ref.split("/vendor/", 1)[1]).read_bytes(), ref


def test_swagger_ui_and_redoc_render_under_their_policy(svc, chromium):  # noqa: F811
    from selenium.webdriver.common.by import By

    chromium.get(f"{svc.url}/docs")
    wait_until(lambda: chromium.find_elements(By.CSS_SELECTOR, ".opblock"), 60, "Swagger UI's operations")
    assert "/v1/policies/simulate" in chromium.find_element(By.TAG_NAME, "body").text
    chromium.get(f"{svc.url}/redoc")
    wait_until(lambda: "simulate" in chromium.find_element(By.TAG_NAME, "body").text.lower(), 60,
               "ReDoc's operations")
