"""Issue 56 on a real 2-process FSDP2 run (gloo, CPU mesh; tests/distributed/fsdp_rewind_worker.py):
with no checkpoint of the Trainer's own, the agent's healthy saves (every rank's shards) give the
canary's rollback its target; both ranks rewind alike to the shards they saved and step on with the
damped learning rate; keep-best loads the best reading's shards on every rank at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

from ranks import run_two_ranks

WORKER = Path(__file__).with_name("fsdp_rewind_worker.py")
STEPS = 16
BAD_FROM, PEAK, LR = 9, 4, 5e-3  # fsdp_rewind_worker's


def test_fsdp2_rewinds_to_the_agents_healthy_save_and_keeps_the_best(tmp_path, sqlite_service):
    r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", sqlite_service.url, "--steps", str(STEPS)],
                           lambda rank, port: {"FSDP_TEST_RANK": str(rank), "FSDP_TEST_PORT": str(port)}, timeout=300)
    for r in (r0, r1):
        assert r["sharded"] and r["global_step"] == STEPS
        # One rewind on each rank, the same one, to an agent's save before the fault.
        assert len(r["rollbacks"]) == 1, r["rollbacks"]
        assert r["restored_equal_to_saved"] and r["restored_changed"]
        # The optimizer stepped with the damped learning rate from the rewind on, on every rank.
        at = r["rollbacks"][0]["at_step"]
        assert r["used"][at - 1] == pytest.approx(LR) and r["used"][at] == pytest.approx(LR * 0.5)
        # Keep-best: every rank's model is the peak's shards at the end, not the last step's.
        assert r["final_is_peak"] and not r["final_is_last"]
    rb0, rb1 = r0["rollbacks"][0], r1["rollbacks"][0]
    assert rb0 == rb1 and rb0["to_step"] < BAD_FROM <= rb0["at_step"]
    assert rb0["checkpoint"].endswith(f"out-0/actuator-rewind/checkpoint-{rb0['to_step']}")
    assert r0["is_main"] and not r1["is_main"]
    assert r0["kept"]["step"] == PEAK and r0["kept"]["loaded"] is True
    assert f"checkpoint-{PEAK}" in r0["own"] and f"checkpoint-{rb0['to_step']}" in r0["own"]
    assert r1["own"] == []  # rank 0's folder holds every rank's shards; rank 1 writes none of its own
