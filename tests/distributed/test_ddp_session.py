"""Issue 52, one rule for collectives: a plain PyTorch loop under ``ControlSession`` in a real
2-process DDP run (gloo, CPU; tests/distributed/ddp_session_worker.py), the session driven on
every rank as under FSDP2 and the Trainer callback. Only rank 0 talks to the service and probes
(on its full replica); rank 0's knobs, plan and decisions reach the other rank at the same step
boundaries, so both replicas step with the same learning rates and stay identical."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ranks import run_two_ranks

WORKER = Path(__file__).with_name("ddp_session_worker.py")
STEPS = 12


def test_ddp_custom_loop_session_applies_rank0s_decisions_on_every_rank(tmp_path, sqlite_service):
    service = sqlite_service
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", service.url, "--steps", str(STEPS)],
                           lambda rank, port: {"DDP_TEST_RANK": str(rank), "DDP_TEST_PORT": str(port)}, timeout=150)
    for r in (r0, r1):
        assert r["world_size"] == 2 and not r["sharded"], r

    # Only rank 0 talked to the service: one run, its observations delivered; rank 1 sent nothing.
    assert r0["is_main"] and r0["run_id"] and r0["observations"] > 0 and r0["delivered"]
    assert not r1["is_main"] and r1["run_id"] is None and r1["observations"] == 0 and r1["history"] == []
    assert [r["id"] for r in httpx.get(f"{service.url}/v1/runs").json()] == [r0["run_id"]]

    # Rank 0's decisions applied at the same boundaries with the same values on both ranks, every
    # rank's value gathered and agreeing, the optimizers really stepped with them, and the service's
    # acknowledged values are the ranks' values.
    assert r0["applied"], "the controller must have produced decisions mid-run"
    assert r0["applied"] == r1["applied"]
    assert r0["checked"] and r1["checked"] and r0["mismatches"] == r1["mismatches"] == 0
    assert r0["knob_values"] == r1["knob_values"]
    assert r0["used"] == r1["used"] and len(r0["used"]) == STEPS and len(set(r0["used"])) > 1
    decisions = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}/decisions").json()["items"]
    acked = {d["number"]: d["applied_value"] for d in decisions if d["applied_value"] is not None}
    assert set(acked) == {e["number"] for e in r1["applied"]}
    assert all(acked[e["number"]] == pytest.approx(e["applied"], rel=1e-12) for e in r1["applied"])
    assert r0["checksum"] == r1["checksum"]  # the replicas stayed identical

    # Both ranks went through the same lifecycle, the agreement with rank 0 included.
    assert r0["phases"][:7] == r1["phases"][:7] == ["open", "agree", "bind", "identify", "register", "share",
                                                    "start"]
    assert [p for p in r0["phases"] if p == "step"] == [p for p in r1["phases"] if p == "step"]
