"""Issue 39: a real 2-process FSDP2 run (gloo, CPU mesh) under control. A tiny Llama is
``fully_shard``-ed before a real ``Trainer`` (tests/distributed/fsdp_worker.py); the probes run on
both ranks in lockstep, decisions are applied identically on both, a KL anchor is on the loss, and a
guardrail's rollback restores the sharded weights."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ranks import (assert_probes_match_single_process, assert_rolled_back_alike, assert_sharded_like_the_model,
                   run_two_ranks)

WORKER = Path(__file__).with_name("fsdp_worker.py")
STEPS = 14
BAD_FROM = 8  # fsdp_worker.BAD_FROM


def test_fsdp2_run_probes_in_lockstep_applies_decisions_alike_and_rolls_back_shards(tmp_path, sqlite_service):
    service = sqlite_service
    # No RANK / WORLD_SIZE: the worker makes the process group; the Trainer sees one process.
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", service.url, "--steps", str(STEPS)],
                           lambda rank, port: {"FSDP_TEST_RANK": str(rank), "FSDP_TEST_PORT": str(port)}, timeout=240)

    # Really sharded, not DDP: one gloo group of two, the Trainer did not wrap the model, and each
    # rank holds about half of every parameter (the halves add up to the model).
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["backend"] == "gloo", r
        assert r["wrapped"] == "FSDPLlamaForCausalLM" and r["distributed_type"] == "DistributedType.NO", r
        assert r["global_step"] == STEPS
    # Each rank holds about half the model, and the drift probes' frozen reference is sharded the
    # same way: no rank holds more than its shard.
    assert r0["reference_numel"] is not None and r1["reference_numel"] is not None
    assert_sharded_like_the_model(r0, r1)

    # Probe values: the same on both ranks (they ran the same passes), and equal to the same probes
    # run in one process on the gathered, unsharded weights (and, at the start, on the seed model).
    assert_probes_match_single_process(r0, r1)

    # Decisions: applied at the same boundaries with the same values on both ranks, the values every
    # rank held agreed (no mismatch gathered), and the optimizers really stepped with them.
    assert r0["applied"], "the controller must have produced decisions mid-run"
    assert r0["applied"] == r1["applied"] and r0["mismatches"] == r1["mismatches"] == 0
    assert r0["knob_values"] == r1["knob_values"]
    assert r0["used"] == r1["used"] and len(set(r0["used"])) > 1
    decisions = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}/decisions").json()["items"]
    acked = {d["number"]: d["applied_value"] for d in decisions if d["applied_value"] is not None}
    assert acked and all(acked[e["number"]] == pytest.approx(e["applied"], rel=1e-12)
                         for e in r1["applied"] if e["number"] in acked)

    # The KL anchor's term ran on both ranks alike, and it keeps no reference model (a top-k cache).
    for r in (r0, r1):
        assert r["anchor"]["forwards"] >= STEPS and r["anchor"]["last_weight"] == 0.5
        assert not r["anchor"]["holds_reference"]
    assert r0["anchor"]["last_kl"] == pytest.approx(r1["anchor"]["last_kl"], rel=1e-6) and r0["anchor"]["last_kl"] > 0

    # The canary's breach rolled both ranks back to the same checkpoint, each to its own saved shards;
    # only rank 0 talked to the service.
    assert_rolled_back_alike(r0, r1, BAD_FROM)
    assert [r["id"] for r in httpx.get(f"{service.url}/v1/runs").json()] == [r0["run_id"]]
