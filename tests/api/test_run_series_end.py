"""Issue 17, break 6: a run's Prometheus series end with the run. Once it is finished or halted
they stay ACTUATOR_METRICS_RETIRE_AFTER seconds (a scrape sees the final values), then /metrics
no longer has them, and a late observation does not bring them back. Read from a real service:
one uvicorn process, and `actuator serve --workers 2` (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actuator.testing import make_service

POLICY = {"name": "series", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                             "setpoint": 0.1, "kp": 1.0}],
          "guardrails": [{"name": "stop", "probe": "kl_drift", "bound": "upper", "threshold": 5.0,
                          "action": "halt"}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]
RETIRE_AFTER = 2.0


@pytest.fixture(params=["one-process", "two-workers"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    env = {"ACTUATOR_METRICS_RETIRE_AFTER": str(RETIRE_AFTER)}
    serve_args = None
    db = f"sqlite:///{tmp_path / 'actuator.db'}"
    if request.param == "two-workers":
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")
        os.mkdir(env["PROMETHEUS_MULTIPROC_DIR"])
        serve_args = ["--workers", "2"]
        # several workers need Postgres (`actuator serve` refuses them on SQLite)
        db = request.getfixturevalue("postgres").create_database(f"series_end_{os.getpid()}_{time.monotonic_ns()}")
    svc = make_service(db, log_dir=str(tmp_path), serve_args=serve_args, extra_env=env).start(timeout=90)
    yield svc.url
    svc.stop()


def _post(url: str, run: dict, seq: int, drift: float) -> httpx.Response:
    return httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                      json={"observations": [{"seq": seq, "step": seq + 1, "probes": {"kl_drift": drift},
                                              "knobs": {"learning_rate": 1e-3}}]})


def _series(url: str, run: dict) -> list[str]:
    return [line for line in httpx.get(f"{url}/metrics").text.splitlines() if f'run="{run["id"]}"' in line]


def test_series_of_finished_and_halted_runs_are_removed(url: str) -> None:
    runs = [httpx.post(f"{url}/v1/runs", json={"name": name, "policy": POLICY, "knobs": KNOBS}).json()
            for name in ("finished", "halted", "running")]
    for run in runs:
        for seq in range(3):  # several requests: in two-worker mode both workers write the run's series
            assert _post(url, run, seq, 0.2).status_code == 200
    finished, halted, running = runs
    assert all(_series(url, run) for run in runs)

    assert httpx.post(f"{url}/v1/runs/{finished['id']}/finish").json()["state"] == "finished"
    assert _post(url, halted, 3, 9.0).json()["state"] == "halted"  # the guardrail halts it
    # the final state is exported first, so Prometheus can scrape it
    assert any('state="finished"} 1.0' in line for line in _series(url, finished))
    assert any('state="halted"} 1.0' in line for line in _series(url, halted))

    deadline = time.monotonic() + RETIRE_AFTER + 10
    while time.monotonic() < deadline and (_series(url, finished) or _series(url, halted)):
        time.sleep(0.3)
    assert _series(url, finished) == [] and _series(url, halted) == []
    assert any('state="running"} 1.0' in line for line in _series(url, running))
    # a late observation of a halted run is stored, and exports nothing
    for seq in (4, 5):
        assert _post(url, halted, seq, 0.2).status_code == 200
    assert _series(url, halted) == []
    assert "actuator_observations_ingested_total" in httpx.get(f"{url}/metrics").text
