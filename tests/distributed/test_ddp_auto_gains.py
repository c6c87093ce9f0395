"""gains auto under DDP, two real processes (gloo, CPU), a policy given by name: only rank 0 fetches
the stored policy, so only rank 0 can plan the warm-up step test. Rank 0's plan is shared at train
start, so the step test moves the learning rate on both ranks at the same steps and every optimizer
step runs with the same lr on both (before the plan was shared, rank 0 alone stepped its lr and the
replicas trained with different learning rates)."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from ranks import run_two_ranks

WORKER = Path(__file__).with_name("ddp_auto_gains_worker.py")
STEPS, WARMUP, LR = 24, 12, 5e-3
POLICY = {"name": "ddp-auto-gains", "controllers": [{
    "name": "hold", "probe": "custom.plant", "knob": "learning_rate", "setpoint": 1.6, "gains": "auto",
    "kp": 0.5, "ki": 0.1}]}


def test_the_step_test_moves_the_lr_of_every_rank_alike(tmp_path, sqlite_service):
    url = sqlite_service.url
    assert httpx.post(f"{url}/v1/policies", json=POLICY).status_code == 201  # stored: the agent names it
    r0, r1 = run_two_ranks(
        tmp_path, WORKER, ["--url", url, "--policy", POLICY["name"], "--steps", str(STEPS), "--warmup", str(WARMUP)],
        lambda rank, port: dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), timeout=300)

    for r in (r0, r1):
        assert r["world_size"] == 2 and r["ddp"] == "DistributedDataParallel", r
        assert r["global_step"] == STEPS and len(r["used"]) == STEPS
    assert r0["knows_policy"] and not r1["knows_policy"], "only rank 0 resolved the policy's name"
    # the same step test on both ranks, inside the warm-up
    assert r0["window"] is not None and r0["window"] == r1["window"]
    start, end = r0["window"]
    assert 0 <= start < end <= WARMUP

    # every optimizer step ran with the same lr on both ranks, and the replicas stayed alike
    assert r0["used"] == r1["used"]
    assert r0["checksum"] == r1["checksum"]
    assert r0["applied"] == r1["applied"]
    # the schedule's peak (lr used / the schedule's own factor) moved by e**0.5 during the test's
    # last steps and was back at its value from its end on: used[k] is optimizer step k+1, run with
    # what the boundary after step k applied
    for r in (r0, r1):
        peak = {k: r["used"][k] / r["shape"][k] for k in range(end) if r["shape"][k] > 0}
        moved = [k for k, p in peak.items() if p == pytest.approx(LR * math.exp(0.5), rel=1e-9)]
        assert moved, f"rank {r['rank']}: the step test never moved the learning rate"
        assert moved == list(range(moved[0], end)) and moved[0] > start
        assert all(p == pytest.approx(LR, rel=1e-9) for k, p in peak.items() if k < moved[0])
        assert r["used"][end] / r["shape"][end] == pytest.approx(LR, rel=1e-9)
    assert all(e["step"] >= end for e in r0["applied"]), "decisions wait for the test's end"

    # the stored run shows the window, and the service tuned (or fell back) at its end
    run = r0["run_id"]
    assert run and r1["run_id"] is None
    state = httpx.get(f"{url}/v1/runs/{run}").json()
    auto = state["controllers"]["hold"]["auto"]
    assert (auto["start"], auto["end"]) == (start, end)
    events = httpx.get(f"{url}/v1/runs/{run}/events", params={"limit": 500}).json()
    assert {e["kind"] for e in events} & {"auto_gains", "auto_gains_fallback"}, events


def test_a_test_ended_early_ends_on_every_rank_alike(tmp_path, sqlite_service):
    """A setpoint the step test carries the plant past (1.2; the test takes it toward 1.4): the
    service ends the test early and the controller's decisions arrive inside the window. They reach
    both ranks at the same boundary (rank 0's broadcast), so both end the test there, apply the
    same values and keep training with the same lr."""
    url = sqlite_service.url
    policy = {**POLICY, "name": "ddp-auto-early", "controllers": [{**POLICY["controllers"][0], "setpoint": 1.2}]}
    assert httpx.post(f"{url}/v1/policies", json=policy).status_code == 201
    r0, r1 = run_two_ranks(
        tmp_path, WORKER, ["--url", url, "--policy", policy["name"], "--steps", str(STEPS), "--warmup", str(WARMUP),
                           "--pause", "0.3"],  # the answers must land inside the warm-up, on a loaded machine too
        lambda rank, port: dict(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), timeout=300)
    assert r0["window"] is None and r1["window"] is None, "both ranks ended their step test"
    end = httpx.get(f"{url}/v1/runs/{r0['run_id']}").json()["controllers"]["hold"]["auto"]["end"]  # the plan's
    early = [e for e in r0["applied"] if e["step"] < end]
    assert early, "the controller's decisions reached the ranks inside the planned window"
    assert r0["applied"] == r1["applied"] and r0["used"] == r1["used"] and r0["checksum"] == r1["checksum"]
    events = httpx.get(f"{url}/v1/runs/{r0['run_id']}/events", params={"limit": 500}).json()
    (ev,) = [e["payload"] for e in events if e["kind"] in ("auto_gains", "auto_gains_fallback")]
    assert ev["step"] < end
