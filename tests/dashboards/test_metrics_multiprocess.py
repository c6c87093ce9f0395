"""Several uvicorn workers (``actuator serve --workers 2``) with ``PROMETHEUS_MULTIPROC_DIR``:
/metrics, whichever worker answers it, shows the sum of what every worker counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from actuator.testing import Postgres, wait_until, free_port

POLICY = {"name": "mp-drift", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.1, "kp": 1.0, "ki": 0.2}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]


def _ingested_by_pid(mp_dir: Path) -> dict[str, float]:
    """What each worker process wrote to its own counter file."""
    out = {}
    for f in mp_dir.glob("counter_*.db"):
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(f)):
            if json.loads(key)[0] == "actuator_observations_ingested":
                out[f.stem.split("_", 1)[1]] = value
    return out


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_two_workers_expose_one_aggregated_view(postgres: Postgres, tmp_path: Path) -> None:
    mp_dir = tmp_path / "prometheus-multiproc"
    mp_dir.mkdir()
    db = postgres.create_database(f"mp_{os.getpid()}")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(mp_dir)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "actuator.cli", "serve", "--workers", "2", "--port", str(port),
         "--database-url", db, "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 60, "actuator serve --workers 2")
        run = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS}, timeout=30).json()
        headers = {"Authorization": f"Bearer {run['token']}"}

        def post(seq: int) -> int:
            # a fresh connection per request, so the kernel hands them to either worker
            obs = {"seq": seq, "step": 5 * (seq + 1), "probes": {"kl_drift": 0.1 + 0.01 * (seq % 7)},
                   "knobs": {"learning_rate": 1e-3}}
            return httpx.post(f"{url}/v1/runs/{run['id']}/observations", json={"observations": [obs]},
                              headers=headers, timeout=30).status_code

        posted = 0
        with ThreadPoolExecutor(8) as pool:
            while posted < 240:
                assert set(pool.map(post, range(posted, posted + 24))) == {200}
                posted += 24
                if len([v for v in _ingested_by_pid(mp_dir).values() if v > 0]) >= 2:
                    break
        per_pid = _ingested_by_pid(mp_dir)
        assert len([v for v in per_pid.values() if v > 0]) == 2, f"requests did not reach both workers: {per_pid}"
        assert sum(per_pid.values()) == posted

        for _ in range(4):  # whichever worker answers, the same merged view
            samples = _samples(httpx.get(f"{url}/metrics", timeout=10).text)
            assert [s.value for s in samples["actuator_observations_ingested_total"]] == [posted]
            counts = [s.value for s in samples["actuator_request_duration_seconds_count"]
                      if s.labels["route"] == "/v1/runs/{run_id}/observations" and s.labels["status"] == "200"]
            assert counts == [posted]
            # gauges: one series per label set (mostrecent across workers), no per-worker "pid" label
            knob = [s for s in samples["actuator_knob_value"] if s.labels.get("run") == run["id"]]
            assert len(knob) == 1 and "pid" not in knob[0].labels and knob[0].value == 1e-3
            state = {s.labels["state"]: s.value for s in samples["actuator_run_state"] if s.labels["run"] == run["id"]}
            assert state == {"running": 1.0, "paused": 0.0, "halted": 0.0, "finished": 0.0}
            decisions = sum(s.value for s in samples["actuator_decisions_total"] if s.labels["run"] == run["id"])
            api = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 1}).json()["total"]
            assert decisions == api
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the process group this test started
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
