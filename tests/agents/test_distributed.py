"""A real 2-process torch.distributed run (gloo, CPU): every rank applies rank 0's decisions at the
same step boundary, so the learning rate each optimizer really used is identical on both ranks at
every step; only rank 0 registers and posts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from actuator.testing import free_port

WORKER = Path(__file__).with_name("dist_worker.py")
STEPS = 16


def test_two_ranks_apply_identical_decisions_at_every_step(tmp_path, sqlite_service):
    service = sqlite_service  # tests/conftest.py: actuator.testing make_service(...).start() on SQLite
    port = free_port()
    procs, outs, logs = [], [], []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        out = tmp_path / f"rank{rank}.json"
        log = open(tmp_path / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, str(WORKER), "--url", service.url, "--out", str(out), "--steps", str(STEPS)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path), start_new_session=True))
        outs.append(out)
        logs.append(log)
    deadline = time.monotonic() + 120
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for log in logs:
            log.close()
    for rank, p in enumerate(procs):
        assert p.returncode == 0, (tmp_path / f"rank{rank}.log").read_text()[-4000:]
    r0, r1 = (json.loads(o.read_text()) for o in outs)

    # A real DDP run: a gloo process group of two, the model wrapped, gradients all-reduced (the
    # ranks saw different data shards yet end with the same weights).
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["ddp"] == "DistributedDataParallel", r
        assert r["global_step"] == STEPS and len(r["used"]) == STEPS
    assert r0["checksum"] == r1["checksum"]

    # Identical learning rates at every optimizer step, read from each rank's optimizer.
    assert r0["used"] == r1["used"]
    # ... and they changed mid-run because of decisions, applied at the same boundaries on both.
    assert r0["applied"], "the controller must have produced decisions mid-run"
    assert r0["applied"] == r1["applied"]
    mid_run = [e for e in r0["applied"] if e["step"] < STEPS]  # one may land at the final boundary
    assert mid_run
    for entry in mid_run:
        # optimizer step k+1 (used[k]) ran with the peak applied at the boundary after step k,
        # times the linear schedule's own factor at that step
        assert r0["used"][entry["step"]] == pytest.approx(entry["applied"] * r0["shape"][entry["step"]], rel=1e-9)

    # Only rank 0 probes, so only rank 0 holds a frozen reference copy (issue 18, item 7): the
    # other rank allocated nothing for probes, not even a set-up suite.
    assert r0["probe_reference"] and r0["probe_modules"] == 1 and r0["suite_started"]
    assert not r1["probe_reference"] and r1["probe_modules"] == 0 and not r1["suite_started"]

    # Only rank 0 talked to the service.
    assert r0["is_main"] and r0["has_sender"] and r0["run_id"] and r0["sent"] == r0["observations"] > 0
    assert not r1["is_main"] and not r1["has_sender"] and r1["run_id"] is None and r1["observations"] == 0
    runs = httpx.get(f"{service.url}/v1/runs").json()
    assert [r["id"] for r in runs] == [r0["run_id"]]
    state = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}").json()
    assert state["last_seq"] == r0["observations"] - 1 and state["state"] == "finished"
    decisions = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}/decisions").json()["items"]
    assert [d["number"] for d in decisions][: len(r0["applied"])] == [e["number"] for e in r0["applied"]]
