"""docker-compose.yml, the Dockerfile and the Prometheus config agree with the service: the port
it listens on, /metrics, /healthz, and the paths Grafana and Prometheus load their files from.
``docker compose config`` (or Debian's docker-compose) validates the file where it is installed."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
from urllib.parse import urlparse

import pytest
import yaml

from actuator.api.app import create_app
from actuator.cli import serve
from actuator.config import Settings
from dash import DASHBOARD_FILES, REPO
from prom import REPO_SCRAPE_CONFIG

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
SERVICE_PORT = Settings.model_fields["port"].default


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _paths(routes, prefix: str = "") -> set[str]:  # type: ignore[no-untyped-def]
    out = set()
    for r in routes:
        if hasattr(r, "path"):
            out.add(prefix + r.path)
        elif hasattr(r, "original_router"):  # FastAPI >= 0.16x keeps included routers as one entry
            out |= _paths(r.original_router.routes, prefix + r.include_context.prefix)
    return out


def _routes(tmp_path) -> set[str]:  # type: ignore[no-untyped-def]
    """Every path the app serves (the live tests also scrape /metrics and poll /healthz for real)."""
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}"))  # no lifespan: nothing starts
    return _paths(app.routes)


# Published ports bind to this address unless the operator sets ACTUATOR_BIND.
BIND = "${ACTUATOR_BIND:-127.0.0.1}"


def _mounts(service: dict) -> dict[str, str]:
    """container path -> repository path, for the bind mounts of a service."""
    out = {}
    for v in service.get("volumes", []):
        src, dst, *_ = v.split(":")
        if src.startswith("./"):
            out[dst] = src[2:]
    return out


def test_one_port_everywhere(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert inspect.signature(serve).parameters["port"].default == SERVICE_PORT == 8000
    c = compose()["services"]["controller"]
    assert f"{BIND}:{SERVICE_PORT}:{SERVICE_PORT}" in c["ports"]
    health = " ".join(c["healthcheck"]["test"])
    assert f"127.0.0.1:{SERVICE_PORT}/healthz" in health
    prom = yaml.safe_load(REPO_SCRAPE_CONFIG.read_text())
    [job] = prom["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"controller:{SERVICE_PORT}"]
    routes = _routes(tmp_path)
    assert job["metrics_path"] in routes and job["metrics_path"] == "/metrics"
    assert "/healthz" in routes
    docker = DOCKERFILE.read_text()
    assert f"EXPOSE {SERVICE_PORT}" in docker
    assert f"--host 0.0.0.0 --port {SERVICE_PORT}" in docker
    assert f"127.0.0.1:{SERVICE_PORT}/healthz" in docker


def test_controller_waits_for_its_dependencies_and_migrates() -> None:
    s = compose()["services"]
    assert set(s) == {"postgres", "redis", "controller", "prometheus", "grafana"}
    c = s["controller"]
    assert c["depends_on"] == {"postgres": {"condition": "service_healthy"},
                               "redis": {"condition": "service_healthy"}}
    for dep in ("postgres", "redis"):
        assert s[dep]["healthcheck"]["test"]
    env = c["environment"]
    assert env["ACTUATOR_MIGRATE_ON_START"] == "true"
    assert urlparse(env["ACTUATOR_DATABASE_URL"].replace("${POSTGRES_PASSWORD:-actuator}", "pw")).hostname == "postgres"
    assert urlparse(env["ACTUATOR_REDIS_URL"]).hostname == "redis"
    # several workers => multiprocess metrics in a directory that starts empty
    assert env["PROMETHEUS_MULTIPROC_DIR"] in [t.split(":")[0] for t in c["tmpfs"]]
    Settings(database_url=env["ACTUATOR_DATABASE_URL"].replace("${POSTGRES_PASSWORD:-actuator}", "pw"))
    docker = DOCKERFILE.read_text()
    assert docker.startswith("#") and "FROM python:3.11-slim" in docker
    assert not re.search(r"pip install[^\n]*\[train", docker), "the service image must not install torch"
    assert re.search(r"pip install[^\n]*\"\.\[server\]\"", docker), "the service needs the [server] extra"


def test_prometheus_and_grafana_load_the_repository_files() -> None:
    s = compose()["services"]
    prom = s["prometheus"]
    mounts = _mounts(prom)
    config_arg = next(a for a in prom["command"] if a.startswith("--config.file="))
    config_path = config_arg.split("=", 1)[1]
    assert (REPO / mounts[config_path]).resolve() == REPO_SCRAPE_CONFIG.resolve()

    graf = s["grafana"]
    mounts = _mounts(graf)
    for dst, src in mounts.items():
        assert (REPO / src).exists(), f"{src} mounted at {dst} is missing"
    assert mounts["/etc/grafana/provisioning/datasources"] == "dashboards/grafana/provisioning/datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == "dashboards/grafana/provisioning/dashboards"
    provider = yaml.safe_load((REPO / mounts["/etc/grafana/provisioning/dashboards"] / "actuator.yml").read_text())
    dash_dir = provider["providers"][0]["options"]["path"]
    assert (REPO / mounts[dash_dir]).resolve() == DASHBOARD_FILES[0].parent.resolve()
    home = graf["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / mounts[dash_dir] / home.removeprefix(dash_dir + "/")).exists()
    # Grafana reaches Prometheus by its compose name and port
    ds = yaml.safe_load((REPO / mounts["/etc/grafana/provisioning/datasources"] / "prometheus.yml").read_text())
    url = urlparse(ds["datasources"][0]["url"])
    assert url.hostname == "prometheus" and f"{BIND}:{url.port}:{url.port}" in prom["ports"]
    assert graf["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert graf["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_published_ports_are_loopback_unless_told_and_grafana_has_no_default_password() -> None:
    s = compose()["services"]
    published = {name: svc["ports"] for name, svc in s.items() if "ports" in svc}
    assert set(published) == {"controller", "prometheus", "grafana"}, "postgres and redis stay unpublished"
    for name, ports in published.items():
        assert all(p.startswith(BIND + ":") for p in ports), (name, ports)
    password = s["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert password.startswith("${GRAFANA_ADMIN_PASSWORD:?"), password


def test_promtool_accepts_the_scrape_config() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: apt-get install -y prometheus"
    r = subprocess.run([promtool, "check", "config", str(REPO_SCRAPE_CONFIG)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _compose_command() -> list[str] | None:
    if shutil.which("docker"):
        r = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if r.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_validates() -> None:
    cmd = _compose_command()
    if cmd is None:
        if os.environ.get("CI"):  # `make test` installs Debian's docker-compose: in CI this must run
            pytest.fail("docker-compose is missing: `make test` installs it (apt-get install docker-compose)")
        pytest.skip("no docker compose plugin or docker-compose here; the structure is checked by the tests above")
    required = {"ACTUATOR_ADMIN_TOKEN": "t", "GRAFANA_ADMIN_PASSWORD": "p"}
    env = {**os.environ, **required}
    r = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, env=env,
                       timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    # the admin token and Grafana's admin password are required, not defaulted
    for name in required:
        r = subprocess.run([*cmd, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True,
                           env={k: v for k, v in env.items() if k != name}, timeout=120, cwd=REPO)
        assert r.returncode != 0 and name in r.stdout + r.stderr
