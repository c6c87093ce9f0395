"""A real Prometheus (Debian's ``prometheus`` package) for tests: on loopback, its own temporary
storage, a fast scrape interval, configured from the repository's scrape config."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from actuator.testing import need_binary, wait_until, free_port

REPO = Path(__file__).resolve().parents[2]
REPO_SCRAPE_CONFIG = REPO / "dashboards" / "prometheus" / "prometheus.yml"


def scrape_config_for(target: str, *, interval: str = "1s", source: Path = REPO_SCRAPE_CONFIG) -> dict[str, Any]:
    """The repository's Prometheus config with only the scrape targets and intervals changed, so
    the job name and metrics path under test are the ones docker-compose uses."""
    config = copy.deepcopy(yaml.safe_load(source.read_text()))
    config.setdefault("global", {}).update({"scrape_interval": interval, "evaluation_interval": interval})
    # rule files beside the source (as docker-compose mounts them beside its config): absolute here
    config["rule_files"] = [str(source.parent / f) for f in config.get("rule_files", [])]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [target]}]
        job.pop("scrape_interval", None)
    return config


@dataclass
class Prometheus:
    url: str
    port: int
    proc: subprocess.Popen
    workdir: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return Path(self.workdir, "prometheus.log").read_text(errors="replace")

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        """GET /api/v1/<path>; returns the JSON body whatever the status (errors included)."""
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        return r.json()

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        return self.api("query", **params)

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> dict[str, Any]:
        return self.api("query_range", query=expr, start=start, end=end, step=step)

    def label_values(self, label: str, match: str | None = None, start: float | None = None) -> list[str]:
        params: dict[str, Any] = {}
        if match:
            params["match[]"] = match
        if start is not None:
            params["start"] = start
        body = self.api(f"label/{label}/values", **params)
        assert body.get("status") == "success", body
        return list(body["data"])

    def series(self, match: str, start: float | None = None) -> list[dict[str, str]]:
        params: dict[str, Any] = {"match[]": match}
        if start is not None:
            params["start"] = start
        body = self.api("series", **params)
        assert body.get("status") == "success", body
        return list(body["data"])

    def targets_up(self) -> bool:
        body = self.api("targets")
        active = body.get("data", {}).get("activeTargets", [])
        return bool(active) and all(t.get("health") == "up" for t in active)


def start_prometheus(config: dict[str, Any], timeout: float = 30.0) -> Prometheus:
    binary = need_binary("prometheus", "prometheus")
    workdir = tempfile.mkdtemp(prefix="actuator-prom-")
    cfg = Path(workdir, "prometheus.yml")
    cfg.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(os.path.join(workdir, "prometheus.log"), "ab")
    proc = subprocess.Popen(
        [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir}/data",
         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    prom = Prometheus(f"http://127.0.0.1:{port}", port, proc, workdir)
    try:
        wait_until(lambda: proc.poll() is None and httpx.get(f"{prom.url}/-/ready", timeout=1).status_code == 200,
              timeout, "prometheus")
    except Exception:
        logs = prom.logs()
        prom.stop()
        raise RuntimeError(f"prometheus did not start: {logs[-2000:]}") from None
    return prom


def poll(check, timeout: float, interval: float = 0.5):  # type: ignore[no-untyped-def]
    """Call ``check`` until it returns something truthy; return the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)
