"""gains auto in a loop of your own under FSDP2 (``ControlSession.begin`` on a ``fully_shard``-ed
model, two real processes, gloo, CPU mesh), against a service that does not take the warm-up step
test. Only rank 0 hears that at its registration and cancels the test; it shares that with every
rank, so no rank runs the test (before, the other rank ran it alone: its learning rate moved and
rank 0's did not, and the ranks' collectives no longer lined up)."""

from __future__ import annotations

import sys
from pathlib import Path

from ranks import run_two_ranks

sys.path.insert(0, str(Path(__file__).parents[1] / "agents"))  # the agent tests' helpers
from test_auto_gains_session import older_service  # noqa: E402

WORKER = Path(__file__).with_name("fsdp_session_auto_worker.py")
STEPS = 8


def test_a_test_rank0_cancels_runs_on_no_rank(tmp_path, sqlite_service):
    with older_service(sqlite_service.url, unreachable_first=0) as url:
        r0, r1 = run_two_ranks(tmp_path, WORKER, ["--url", url, "--steps", str(STEPS)],
                               lambda rank, port: {"FSDP_TEST_RANK": str(rank), "FSDP_TEST_PORT": str(port)},
                               timeout=150)
    for r in (r0, r1):
        assert r["sharded"] and len(r["used"]) == STEPS, r
    assert r0["is_main"] and r0["run_id"] and not r1["is_main"]
    assert r0["window"] is None and r1["window"] is None, "the test rank 0 cancelled runs on no rank"
    # the fallback gains act from the first reading (the service had no window), on both ranks alike
    assert r0["applied"] and r0["applied"] == r1["applied"]
    assert r0["used"] == r1["used"] and r0["mismatches"] == r1["mismatches"] == 0
