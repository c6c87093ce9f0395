"""Issue 54: real 2-process DeepSpeed ZeRO-2 and ZeRO-3 runs (gloo, ``DS_ACCELERATOR=cpu``) under
control through the HF ``Trainer`` (tests/distributed/deepspeed_worker.py), one launch per stage:
probes in lockstep equal to the unsharded values, decisions applied alike with the lr DeepSpeed
steps equal on both ranks at every step, the KL anchor's weight moving the loss, a rollback that
loads DeepSpeed's checkpoint on every rank, and a resume. The first launch on a machine compiles
one DeepSpeed op (``deepspeed_shm_comm``, into ~/.cache/torch_extensions; the ``ds_ops`` fixture
pays it once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from ranks import assert_probes_match_single_process, assert_rolled_back_alike, run_two_ranks

WORKER = Path(__file__).with_name("deepspeed_worker.py")
STEPS = 14
BAD_FROM = 8  # deepspeed_worker.BAD_FROM
RESUME_STEPS = 3  # deepspeed_worker.RESUME_STEPS


def torchrun_env(rank: int, port: int) -> dict[str, str]:
    return dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu")


def lr_equal_on_both_ranks(r0: dict, r1: dict, steps: int) -> None:
    """One lr per optimizer step on each rank, the same on both, at every step."""
    assert r0 == r1 and sorted(map(int, r0)) == list(range(1, steps + 1)), (r0, r1)
    assert all(len(v) == 1 for v in r0.values()), r0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_under_control(stage, tmp_path, sqlite_service, ds_ops):
    service = sqlite_service
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", service.url, "--steps", str(STEPS), "--stage", str(stage)],
                           torchrun_env, timeout=420)

    # Really DeepSpeed, at that stage, over one gloo group of two; the callback took the sharded path.
    for r in (r0, r1):
        assert r["world_size"] == 2 and r["backend"] == "gloo", r
        assert r["engine"] == "DeepSpeedEngine" and r["zero_stage"] == stage and r["sharded"], r
        assert r["inner_optimizer"] == "AdamW" and r["global_step"] == STEPS
    if stage == 3:  # each rank holds about half of every parameter; the drift reference is partitioned too
        full = r0["model_numel"][1]
        assert max(r0["model_numel"][0], r1["model_numel"][0]) < 0.6 * full
        assert r0["reference_numel"][1] == full and max(r0["reference_numel"][0], r1["reference_numel"][0]) < 0.6 * full

    # Probes in lockstep: the same values on both ranks, equal to the same probes run in one
    # process on the gathered full weights (and, at the start, on the seed model).
    assert_probes_match_single_process(r0, r1)

    # Decisions: applied at the same boundaries with the same values on both ranks; the lr the
    # torch optimizer under DeepSpeed really stepped with is the same on both ranks at every step,
    # and from the step after a decision on it is the value applied (read back = used).
    assert r0["applied"], "the controller must have produced decisions mid-run"
    assert r0["applied"] == r1["applied"] and r0["mismatches"] == r1["mismatches"] == 0
    assert r0["knob_values"] == r1["knob_values"]
    lr_equal_on_both_ranks(r0["lr"], r1["lr"], STEPS)
    used = {int(k): v[0] for k, v in r0["lr"].items()}
    assert len(set(used.values())) > 1
    rolled_back_at = r0["rollbacks"][0]["at_step"] if r0["rollbacks"] else None
    checked = 0
    for e in r0["applied"]:
        nxt = e["step"] + 1
        if e["knob"] == "learning_rate" and nxt in used and e["step"] != rolled_back_at:
            later = [x for x in r0["applied"] if x["knob"] == "learning_rate" and x["step"] == e["step"]]
            if later[-1] is e:
                assert used[nxt] == pytest.approx(e["applied"], rel=1e-12), (e, used)
                checked += 1
    assert checked, r0["applied"]
    decisions = httpx.get(f"{service.url}/v1/runs/{r0['run_id']}/decisions").json()["items"]
    acked = {d["number"]: d["applied_value"] for d in decisions if d["applied_value"] is not None}
    assert acked and all(acked[e["number"]] == pytest.approx(e["applied"], rel=1e-12)
                         for e in r1["applied"] if e["number"] in acked)

    # The KL anchor ran on both ranks alike, and its weight, set through the kl_weight knob on every
    # rank, moves the loss by exactly w x KL on the same batch.
    for r in (r0, r1):
        assert r["anchor"]["forwards"] >= STEPS
        m = r["anchor"]["moved"]
        assert m["applied_0.0"] == 0.0 and m["applied_1.5"] == 1.5
        assert m["kl_1.5"] > 0 and m["loss_1.5"] - m["loss_0.0"] == pytest.approx(1.5 * m["kl_1.5"], rel=1e-4)
    assert r0["anchor"]["moved"] == pytest.approx(r1["anchor"]["moved"], rel=1e-6)

    # The canary's breach rolled both ranks back to the same checkpoint: each rank's partitions (or
    # replica) are those saved at that step, loaded from DeepSpeed's checkpoint. Only rank 0 talked
    # to the service.
    assert_rolled_back_alike(r0, r1, BAD_FROM)

    # Resume: DeepSpeed loaded each rank's partitions of the last checkpoint, the same run continued
    # to its new end, with the lr again equal on both ranks at every step.
    q0, q1 = r0["resume"], r1["resume"]
    last = r0["last_checkpoint"]
    for q in (q0, q1):
        assert q["loaded_equal_to_saved"] and q["global_step"] == last + RESUME_STEPS and q["mismatches"] == 0, q
    assert q0["run_id"] == r0["run_id"] and q0["observations"] > r0["observations"] - 1
    assert q0["knob_values"] == q1["knob_values"]
    assert q0["lr"] == q1["lr"] and sorted(map(int, q0["lr"])) == list(range(last + 1, last + RESUME_STEPS + 1))
    runs = httpx.get(f"{service.url}/v1/runs").json()
    assert [r["id"] for r in runs] == [r0["run_id"]] and runs[0]["last_step"] == last + RESUME_STEPS


@pytest.fixture(scope="session")
def ds_ops():
    """DeepSpeed's CPU accelerator compiles one op on first use (about 90 s here, cached in
    ~/.cache/torch_extensions): pay it once, before the timed launches."""
    import subprocess
    import sys

    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    subprocess.run([sys.executable, "-c", "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load()"],
                   env=env, check=True, timeout=600, capture_output=True)
