"""Backends fail under a live run: Postgres restarted, Redis stopped (then back).

While an agent streams observations through the real BackgroundSender, the backend goes away.
Every request that needs it gets a 503 with Retry-After and a JSON body (never a stack trace);
an ingest needs only the store (live events are best effort, after the commit);
the service recovers by itself when the backend is back (no restart of the service); nothing is
lost: every observation is stored exactly once, and every decision reaches the agent.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from harden import (
    KNOBS,
    POLICY,
    SimAgent,
    StoreView,
    bearer,
    no_traceback,
    register,
    restart_redis_same_port,
    wait_until,
)
from actuator.testing import make_service, start_postgres, start_redis

DRIFT = 0.3  # above the policy's setpoint: the controller keeps lowering the learning rate


def assert_unavailable(resp: httpx.Response, what: str) -> None:
    assert resp.status_code == 503, (what, resp.status_code, resp.text[:300])
    assert resp.headers.get("retry-after", "").isdigit(), (what, dict(resp.headers))
    assert resp.headers["content-type"].startswith("application/json"), what
    body = resp.json()
    assert ("detail" in body or body.get("status") == "degraded") and no_traceback(resp.text), (what, resp.text)


def drive(agent: SimAgent, steps: range, pause: float = 0.01) -> None:
    for step in steps:
        agent.step(step, DRIFT)
        time.sleep(pause)


def check_nothing_lost(db: str, run: dict, agent: SimAgent) -> None:
    view = StoreView(db)
    try:
        assert view.seqs(run["id"]) == list(range(agent.seq))
        stored = view.store.get_run(run["id"])
        assert stored.decision_count > 0
        # every decision reached the agent, each once, in order
        assert agent.applied == list(range(1, stored.decision_count + 1))
    finally:
        view.close()
    assert agent.sender.stats.dropped == 0


@pytest.fixture
def own_postgres():
    pg = start_postgres()  # its own server: this test stops it
    yield pg
    pg.remove()  # stopped already if the test failed there


def test_postgres_restart_mid_run(own_postgres, tmp_path):
    db = own_postgres.create_database("restart")
    svc = make_service(db, log_dir=str(tmp_path)).start()
    try:
        run, probe_run = register(svc.url), register(svc.url)
        agent = SimAgent(svc.url, run)
        drive(agent, range(1, 41))
        assert wait_until(lambda: agent.sender.stats.sent >= 40, 20, "delivery before the outage")

        own_postgres.stop()
        drive(agent, range(41, 61))  # training goes on: observations pile up in the sender
        url, rid = svc.url, probe_run["id"]
        auth = bearer(probe_run["token"])
        assert_unavailable(httpx.get(f"{url}/healthz"), "healthz")
        assert_unavailable(httpx.get(f"{url}/v1/runs/{rid}"), "get run")
        assert_unavailable(httpx.get(f"{url}/v1/runs"), "list runs")
        assert_unavailable(httpx.get(f"{url}/v1/runs/{rid}/decisions"), "decisions")
        assert_unavailable(httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS}), "register")
        assert_unavailable(httpx.post(f"{url}/v1/runs/{rid}/observations", headers=auth,
                                      json={"observations": [{"seq": 0, "step": 1}]}), "observations")
        assert_unavailable(httpx.post(f"{url}/v1/policies", json={**POLICY, "name": "during-outage"}), "policy")
        assert_unavailable(httpx.post(f"{url}/v1/runs/{rid}/halt", headers=auth), "halt")
        drive(agent, range(61, 81))
        assert agent.sender.stats.outages >= 1 and not agent.sender.stats.connected

        own_postgres.start()
        # the service recovers by itself, no restart: a pooled connection the restart closed is
        # dropped at checkout (its socket polls readable) or fails once and is retried on a fresh one
        wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 30, "healthz after Postgres is back")
        drive(agent, range(81, 121))
        assert agent.finish(30), "backlog not delivered after recovery"
        check_nothing_lost(db, run, agent)
        r = httpx.post(f"{url}/v1/runs/{rid}/observations", headers=auth,
                       json={"observations": [{"seq": 0, "step": 1}]})
        assert r.status_code == 200 and r.json()["accepted"] == 1  # the refused post stored nothing
        assert agent.request_threads and agent.requests_on_caller() == 0, \
            "handing an observation over must never wait on the network"
    finally:
        svc.stop()
    logs = svc.logs()
    assert no_traceback(logs), logs[-3000:]
    assert "store unavailable" in logs


def test_redis_stopped_mid_run(postgres, tmp_path):
    redis_server = start_redis()  # its own server: this test stops it
    db = postgres.create_database(f"redis_{uuid.uuid4().hex[:10]}")
    svc = make_service(db, redis_url=redis_server.url, log_dir=str(tmp_path)).start()
    try:
        run, probe_run = register(svc.url), register(svc.url)
        agent = SimAgent(svc.url, run)
        drive(agent, range(1, 31))
        assert wait_until(lambda: agent.sender.stats.sent >= 30, 20, "delivery before the outage")

        redis_server.stop()
        url, rid = svc.url, probe_run["id"]
        auth = bearer(probe_run["token"])
        assert_unavailable(httpx.get(f"{url}/healthz"), "healthz")
        # the ingest is durable (Postgres) and needs no Redis: 200 with its decisions, live events
        # skipped (the run's stream gets a gap once Redis is back)
        r = httpx.post(f"{url}/v1/runs/{rid}/observations", headers=auth,
                       json={"observations": [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.5}}]})
        assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
        # reading durable state needs no Redis
        assert httpx.get(f"{url}/v1/runs/{rid}").status_code == 200
        # a live stream ends cleanly (the client reconnects after its retry interval)
        t0 = time.monotonic()
        with httpx.stream("GET", f"{url}/v1/runs/{rid}/stream", params={"max_seconds": 10}, timeout=15) as resp:
            assert resp.status_code == 200
            body = "".join(resp.iter_text())
        assert "retry:" in body and time.monotonic() - t0 < 5
        drive(agent, range(31, 61))
        assert wait_until(lambda: agent.sender.stats.sent >= 60, 20, "delivery while Redis is down")
        assert agent.sender.stats.outages == 0  # control never stopped

        redis_server = restart_redis_same_port(redis_server)
        wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 30, "healthz after Redis is back")
        drive(agent, range(61, 91))
        assert agent.finish(30), "backlog not delivered after recovery"
        check_nothing_lost(db, run, agent)
        r = httpx.post(f"{url}/v1/runs/{rid}/observations", headers=auth,
                       json={"observations": [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.5}}]})
        assert r.status_code == 200 and r.json()["duplicates"] == 1  # stored during the outage, once
    finally:
        svc.stop()
        redis_server.stop()
    logs = svc.logs()
    assert no_traceback(logs), logs[-3000:]
    assert "live state (Redis) unreachable" in logs
