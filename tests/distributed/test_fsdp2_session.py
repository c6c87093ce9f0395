"""Issue 39, the custom-loop path: a real 2-process FSDP2 run (gloo, CPU mesh) of a plain PyTorch
loop under ``ControlSession`` (tests/distributed/fsdp_session_worker.py). The session sees the
``fully_shard``-ed model at ``begin()``: only rank 0 talks to the service, the probes run on both
ranks in lockstep, and rank 0's decisions are applied identically on both. (The KL anchor and the
rollback are the Trainer callback's: tests/distributed/test_fsdp2.py.)"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ranks import assert_probes_match_single_process, assert_sharded_like_the_model, run_two_ranks

WORKER = Path(__file__).with_name("fsdp_session_worker.py")
STEPS = 12


def test_fsdp2_custom_loop_session_probes_in_lockstep_and_applies_decisions_alike(tmp_path, sqlite_service):
    service = sqlite_service
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", service.url, "--steps", str(STEPS)],
                           lambda rank, port: {"FSDP_TEST_RANK": str(rank), "FSDP_TEST_PORT": str(port)}, timeout=150)

    # Really sharded: each rank holds about half of every parameter (the halves add up to the model),
    # and the drift probe's frozen reference is sharded the same way: no rank holds more than its shard.
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["backend"] == "gloo" and r["sharded"], r
    assert_sharded_like_the_model(r0, r1)

    # Probe values: the same on both ranks, and equal to the same probes run in one process on the
    # gathered, unsharded weights (and, at the start, on the seed model).
    assert_probes_match_single_process(r0, r1)

    # Decisions: applied at the same boundaries with the same values on both ranks, every rank's value
    # gathered and agreeing, the optimizers really stepped with them, and the service's acknowledged
    # values are the ranks' values.
    assert r0["applied"], "the controller must have produced decisions mid-run"
    assert r0["applied"] == r1["applied"]
    assert r0["checked"] and r1["checked"] and r0["mismatches"] == r1["mismatches"] == 0
    assert r0["knob_values"] == r1["knob_values"]
    assert r0["used"] == r1["used"] and len(r0["used"]) == STEPS and len(set(r0["used"])) > 1
    decisions = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}/decisions").json()["items"]
    acked = {d["number"]: d["applied_value"] for d in decisions if d["applied_value"] is not None}
    assert set(acked) == {e["number"] for e in r1["applied"]}
    assert all(acked[e["number"]] == pytest.approx(e["applied"], rel=1e-12) for e in r1["applied"])

    # Only rank 0 talked to the service: one run, its observations delivered.
    assert r0["is_main"] and r0["run_id"] and r0["observations"] > 0 and r0["delivered"]
    assert not r1["is_main"] and r1["run_id"] is None and r1["observations"] == 0 and r1["history"] == []
    assert [r["id"] for r in httpx.get(f"{service.url}/v1/runs").json()] == [r0["run_id"]]
