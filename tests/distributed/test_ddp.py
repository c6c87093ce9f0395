"""A real 2-process torch.distributed run (gloo, CPU): every rank applies rank 0's decisions at the
same step boundary, so the learning rate each optimizer really used is identical on both ranks at
every step; only rank 0 registers and posts."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ranks import run_two_ranks

WORKER = Path(__file__).with_name("ddp_worker.py")
STEPS = 16


def test_two_ranks_apply_identical_decisions_at_every_step(tmp_path, sqlite_service):
    service = sqlite_service  # tests/conftest.py: a real service on SQLite
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", service.url, "--steps", str(STEPS)], lambda rank, port: dict(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port)))

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
