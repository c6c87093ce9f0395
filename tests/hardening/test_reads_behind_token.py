"""Reads behind the token: with ACTUATOR_ADMIN_TOKEN set, nothing about runs or policies is
readable anonymously (issue 51, item 8).

Every read route is enumerated from the app's own route table (every GET, and the POSTs that
only read), so a read added later without auth fails here. Against the real service under uvicorn
on Postgres: anonymous and unknown tokens get 401 with ``WWW-Authenticate: Bearer``, a viewer
token and the admin token read everything, a run's agent token reads its own run (200) and
nothing else (403, whether the other run exists or not); no read changes anything stored. Open
mode (no admin token) stays as it was: every read open.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from starlette.routing import Mount
from typer.testing import CliRunner

from actuator.api.app import create_app
from actuator._exceptions import Forbidden, Unauthorized
from actuator.cli import app as cli
from actuator.client import ActuatorClient
from actuator.config import Settings
from actuator.testing import Service, make_service
from harden import POLICY, StoreView, bearer, post_obs, register

ADMIN = "admin-" + uuid.uuid4().hex
VIEWER, VIEWER2 = "viewer-" + uuid.uuid4().hex, "viewer2-" + uuid.uuid4().hex
TOKEN_ENV = {"ACTUATOR_VIEWER_TOKEN": f"{VIEWER},{VIEWER2}"}
# POST routes that only read (nothing stored): a read like the GETs.
READ_POSTS = {("POST", "/v1/runs/{run_id}/stream/ticket")}
# What stays open in token mode, and why: nothing in it is about a run or a policy.
OPEN_IN_TOKEN_MODE = {
    ("GET", "/"): "a redirect to /ui",
    ("MOUNT", "/ui/static"): "the console's scripts, styles and vendored libraries",
}
# /healthz and /metrics: closed in token mode unless ACTUATOR_HEALTH_PUBLIC / ACTUATOR_METRICS_PUBLIC.
SERVICE_READS = {"/healthz", "/metrics"}
FILL = {"name": POLICY["name"], "version": "1"}


def routes(settings: Settings) -> list[tuple[str, str]]:
    """(method, path) of every route of the app these settings make (no lifespan: nothing starts)."""
    out = []
    for r in iter_route_contexts(create_app(settings).routes):
        if isinstance(getattr(r, "route", None), Mount) or r.methods is None:
            out.append(("MOUNT", r.path))
            continue
        out.extend((m, r.path) for m in sorted(r.methods) if m != "HEAD")
    return out


def read_routes(settings: Settings) -> list[tuple[str, str]]:
    return [(m, p) for m, p in routes(settings) if m == "GET" or (m, p) in READ_POSTS]


def token_settings() -> Settings:
    return Settings(database_url="sqlite://", admin_token=ADMIN, viewer_token=f"{VIEWER},{VIEWER2}")


def concrete(path: str, run_id: str) -> str:
    for param in [p.strip("{}") for p in path.split("/") if p.startswith("{")]:
        value = run_id if param == "run_id" else FILL.get(param)
        assert value is not None, f"{path}: no value for path parameter {param!r}; add one to FILL"
        path = path.replace("{" + param + "}", value)
    return path


def read(url: str, method: str, path: str, token: str | None, **kw: Any) -> httpx.Response:
    """One read; a stream is opened for one second at most and closed after its head."""
    if path.endswith("/stream"):
        kw.setdefault("params", {})["max_seconds"] = 1
    headers = kw.pop("headers", None) or bearer(token)
    with httpx.stream(method, url + path, headers=headers, timeout=30, follow_redirects=True, **kw) as r:
        if not path.endswith("/stream"):
            r.read()
        return r


@pytest.fixture(scope="module")
def env(postgres, tmp_path_factory) -> Iterator[tuple[Service, StoreView, dict, dict]]:  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("reads")
    db = postgres.create_database(f"reads{os.getpid()}_{time.monotonic_ns()}")
    svc = make_service(db, admin_token=ADMIN, extra_env=TOKEN_ENV, log_dir=str(tmp)).start()
    assert httpx.post(f"{svc.url}/v1/policies", json=POLICY, headers=bearer(ADMIN)).status_code == 201
    a = register(svc.url, admin=ADMIN, policy=POLICY["name"], name="run-a")
    b = register(svc.url, admin=ADMIN, policy=POLICY["name"], name="run-b")
    r = post_obs(svc.url, a, [{"seq": i, "step": i + 1, "probes": {"kl_drift": 0.9}} for i in range(3)])
    assert r.status_code == 200 and r.json()["decisions"], r.text
    r = httpx.post(f"{svc.url}/v1/runs/{a['id']}/knobs/learning_rate/override", headers=bearer(ADMIN),
                   json={"value": 1e-3, "note": "secret-operator-note"})
    assert r.status_code == 200, r.text
    view = StoreView(db)
    yield svc, view, a, b
    view.close()
    svc.stop()


def test_the_route_table_has_no_unguarded_read() -> None:
    """Every route is a read, a write, or listed above as open with its reason; the docs pages
    are off in token mode and /openapi.json is a read."""
    table = routes(token_settings())
    reads = read_routes(token_settings())
    assert len(reads) >= 17, reads  # the enumeration really found the API and the console
    assert {("GET", "/v1/runs"), ("GET", "/v1/runs/{run_id}/stream"), ("GET", "/ui/runs/{run_id}"),
            ("GET", "/openapi.json"), ("GET", "/metrics")} <= set(reads)
    paths = {p for _, p in table}
    assert not {"/docs", "/redoc", "/docs/oauth2-redirect"} & paths, "the API docs pages are off in token mode"
    mounts = {("MOUNT", p) for m, p in table if m == "MOUNT"}
    assert mounts <= set(OPEN_IN_TOKEN_MODE), f"a mount with no reason to be open: {mounts - set(OPEN_IN_TOKEN_MODE)}"


def test_anonymous_and_unknown_tokens_read_nothing(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    before = view.snapshot([a["id"], b["id"]])
    checked = []
    for method, path in read_routes(token_settings()):
        if (method, path) in OPEN_IN_TOKEN_MODE:
            continue
        url_path = concrete(path, a["id"])
        for token, why in ((None, "no token"), ("not-a-token-" + uuid.uuid4().hex, "an unknown token"),
                           ("act_" + uuid.uuid4().hex, "a forged run token")):
            r = read(svc.url, method, url_path, token)
            assert r.status_code == 401, (method, path, why, r.status_code, r.text if not path.endswith("/stream") else "")
            assert r.headers.get("www-authenticate") == "Bearer", (method, path, why)
            if not path.endswith("/stream"):
                # nothing of the run or the policy in the answer (the console's locked page included)
                for secret in (a["name"], "secret-operator-note", "kl_drift", POLICY["name"]):
                    assert secret not in r.text, (method, path, why, secret)
        # not a bearer token
        r = read(svc.url, method, url_path, None, headers={"Authorization": f"Basic {ADMIN}"})
        assert r.status_code == 401, (method, path, "Basic")
        checked.append(path)
    assert SERVICE_READS <= set(checked)
    assert view.snapshot([a["id"], b["id"]]) == before, "a refused read changed what is stored"


def test_viewer_and_admin_read_everything_and_change_nothing(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    before = view.snapshot([a["id"], b["id"]])
    for method, path in read_routes(token_settings()):
        for token in (VIEWER, VIEWER2, ADMIN):
            r = read(svc.url, method, concrete(path, a["id"]), token)
            assert r.status_code == 200, (method, path, r.status_code, r.text if not path.endswith("/stream") else "")
    # what the viewer reads is the run's data, override note included
    runs = httpx.get(f"{svc.url}/v1/runs", headers=bearer(VIEWER)).json()
    assert {a["id"], b["id"]} <= {r["id"] for r in runs}
    events = httpx.get(f"{svc.url}/v1/runs/{a['id']}/events", headers=bearer(VIEWER)).json()
    assert "secret-operator-note" in json.dumps(events)
    assert 'actuator_' in httpx.get(f"{svc.url}/metrics", headers=bearer(VIEWER)).text
    assert view.snapshot([a["id"], b["id"]]) == before, "a read changed what is stored"


def test_a_viewer_token_writes_nothing(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    before = view.snapshot([a["id"], b["id"]])
    for method, path, body in (("POST", f"/v1/runs/{a['id']}/pause", None), ("POST", f"/v1/runs/{a['id']}/halt", None),
                               ("POST", "/v1/policies", POLICY),
                               ("POST", f"/v1/runs/{a['id']}/observations",
                                {"observations": [{"seq": 99, "step": 99, "probes": {"kl_drift": 0.1}}]})):
        r = httpx.request(method, svc.url + path, headers=bearer(VIEWER), json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    assert view.snapshot([a["id"], b["id"]]) == before


def test_a_run_token_reads_its_run_and_nothing_else(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    unknown = "no-such-run-" + uuid.uuid4().hex[:8]
    own = others = elsewhere = 0
    for method, path in read_routes(token_settings()):
        if (method, path) in OPEN_IN_TOKEN_MODE:
            continue
        if "{run_id}" in path:
            r = read(svc.url, method, concrete(path, a["id"]), a["token"])
            assert r.status_code == 200, (method, path, r.status_code)
            own += 1
            # another run's, and a run that does not exist: the same 403 (no existence leak)
            for other in (b["id"], unknown):
                r = read(svc.url, method, concrete(path, other), a["token"])
                assert r.status_code == 403, (method, path, other, r.status_code)
                others += 1
        else:
            r = read(svc.url, method, concrete(path, a["id"]), a["token"])
            assert r.status_code == 403, (method, path, r.status_code)
            elsewhere += 1
    assert own >= 7 and elsewhere >= 8, (own, elsewhere)
    # the admin and a viewer see the unknown run as unknown
    assert httpx.get(f"{svc.url}/v1/runs/{unknown}", headers=bearer(VIEWER)).status_code == 404


def _events(lines: Iterator[str], kinds: set[str], until: float) -> list[str]:
    seen = []
    for line in lines:
        if line.startswith("event: "):
            seen.append(line.removeprefix("event: "))
            if kinds <= set(seen) or time.monotonic() > until:
                break
    return seen


def test_a_stream_ticket_opens_one_run_s_stream_for_a_minute(env) -> None:  # type: ignore[no-untyped-def]
    from actuator.api.deps import stream_ticket  # here: the rest of the module runs on a service without tickets

    svc, view, a, b = env
    settings = token_settings()
    t = httpx.post(f"{svc.url}/v1/runs/{a['id']}/stream/ticket", headers=bearer(VIEWER))
    assert t.status_code == 200 and t.json()["expires_in"] == 60, t.text
    ticket = t.json()["ticket"]
    assert VIEWER not in ticket and ADMIN not in ticket
    # the ticket opens run A's stream, without any header, and the stream carries A's events
    with httpx.stream("GET", f"{svc.url}/v1/runs/{a['id']}/stream", params={"ticket": ticket, "max_seconds": 20},
                      timeout=30) as r:
        assert r.status_code == 200
        assert post_obs(svc.url, a, [{"seq": 10, "step": 20, "probes": {"kl_drift": 0.5}}]).status_code == 200
        assert "observation" in _events(r.iter_lines(), {"observation"}, time.monotonic() + 20)
    refused = {
        "run B's stream": (b["id"], ticket),
        "tampered": (a["id"], ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB")),
        "expired": (a["id"], stream_ticket(settings, a["id"], now=time.time() - 61)),
        "signed with another admin token": (a["id"], stream_ticket(
            Settings(database_url="sqlite://", admin_token="other"), a["id"])),
    }
    for why, (run_id, bad) in refused.items():
        r = read(svc.url, "GET", f"/v1/runs/{run_id}/stream", None, params={"ticket": bad})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (why, r.status_code)
    # a run's token gets a ticket for its run only
    assert httpx.post(f"{svc.url}/v1/runs/{a['id']}/stream/ticket", headers=bearer(a["token"])).status_code == 200
    assert httpx.post(f"{svc.url}/v1/runs/{b['id']}/stream/ticket", headers=bearer(a["token"])).status_code == 403


def test_the_cli_reads_with_a_viewer_token(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    runner = CliRunner()
    out = runner.invoke(cli, ["runs", "--url", svc.url], env={"COLUMNS": "200"})
    assert out.exit_code == 1 and "401" in out.output and "--token" in out.output, out.output
    out = runner.invoke(cli, ["runs", "--url", svc.url], env={"COLUMNS": "200", "ACTUATOR_TOKEN": VIEWER})
    assert out.exit_code == 0 and a["id"] in out.output and b["id"] in out.output, out.output
    out = runner.invoke(cli, ["decisions", "run-a", "--url", svc.url, "--token", VIEWER], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "manual override" in out.output, out.output
    out = runner.invoke(cli, ["policy", "show", POLICY["name"], "--url", svc.url, "--token", VIEWER],
                        env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "drift" in out.output, out.output


def test_the_client_reads_with_a_viewer_or_the_run_s_token(env) -> None:  # type: ignore[no-untyped-def]
    svc, view, a, b = env
    with ActuatorClient(svc.url) as anonymous:
        with pytest.raises(Unauthorized, match="401"):
            anonymous.list_runs()
        assert anonymous.get_run(a["id"], token=a["token"]).id == a["id"]  # the run's own token, for one request
        assert anonymous.list_decisions(a["id"], token=a["token"]).total >= 1
        with pytest.raises(Forbidden, match="403"):
            anonymous.list_decisions(b["id"], token=a["token"])
    with ActuatorClient(svc.url, token=VIEWER) as viewer:
        assert {a["id"], b["id"]} <= {r.id for r in viewer.list_runs()}
        assert viewer.get_policy(POLICY["name"])["name"] == POLICY["name"]
        assert viewer.health()["status"] == "ok"


def test_health_metrics_and_docs_open_only_when_configured(postgres, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = postgres.create_database(f"readsopen{os.getpid()}_{time.monotonic_ns()}")
    svc = make_service(db, admin_token=ADMIN, log_dir=str(tmp_path), serve_args=["--host", "127.0.0.1"], extra_env={
        "ACTUATOR_METRICS_PUBLIC": "true", "ACTUATOR_HEALTH_PUBLIC": "true", "ACTUATOR_DOCS_PUBLIC": "true",
        **TOKEN_ENV}).start()
    try:
        # `actuator serve` says what is open
        logs = " ".join(svc.logs().split())
        assert "token mode: reads need a token: 2 viewer tokens" in logs, logs[-2000:]
        assert "open without one: /metrics, /healthz, /docs" in logs, logs[-2000:]
        for path in ("/metrics", "/healthz", "/openapi.json", "/docs", "/redoc"):
            assert httpx.get(svc.url + path).status_code == 200, path
        run = register(svc.url, admin=ADMIN, policy=POLICY)
        for path in ("/v1/runs", f"/v1/runs/{run['id']}", "/v1/policies", "/ui"):
            assert httpx.get(svc.url + path).status_code == 401, path
    finally:
        svc.stop()


def test_open_mode_reads_stay_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path)).start()
    try:
        assert httpx.post(f"{svc.url}/v1/policies", json=POLICY).status_code == 201
        run = register(svc.url, policy=POLICY["name"])
        settings = Settings(database_url="sqlite://")
        reads = read_routes(settings)
        assert {"/docs", "/redoc", "/openapi.json"} <= {p for _, p in reads}
        for method, path in reads:
            r = read(svc.url, method, concrete(path, run["id"]), None)
            assert r.status_code == 200, (method, path, r.status_code)
    finally:
        svc.stop()


def test_viewer_tokens_need_an_admin_token() -> None:
    with pytest.raises(ValueError, match="viewer_token: viewer tokens need ACTUATOR_ADMIN_TOKEN"):
        Settings(database_url="sqlite://", viewer_token="v")
    with pytest.raises(ValueError, match="must not be the admin token"):
        Settings(database_url="sqlite://", admin_token="same", viewer_token="v,same")
    s = Settings(database_url="sqlite://", admin_token="a")
    assert s.token_mode and not s.metrics_open and not s.health_open and not s.docs_open
    s = Settings(database_url="sqlite://")
    assert not s.token_mode and s.metrics_open and s.health_open and s.docs_open
