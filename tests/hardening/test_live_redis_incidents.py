"""Live streams survive ordinary Redis incidents, in production mode (Postgres, Redis, two uvicorn
workers). Redis losing its data (FLUSHALL) or restarting loses the run's stream numbering; the
numbering that follows is another epoch, and every client is told: a connected one gets a `gap`
and then the new events, one reconnecting with an id of the lost numbering gets a `restarted`
gap instead of a silent resume at a number that now means another event, and one whose id is
older than what is kept gets a `trimmed` gap. Events are driven through the real ingest route and
read as Server-Sent Events over HTTP."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from harden import post_obs, register, restart_redis_same_port, wait_until
from actuator.testing import Redis, Service, make_service, start_redis

QUIET = {"name": "quiet-live"}  # no controllers, no guardrails: each observation is exactly one event


@pytest.fixture
def production(postgres: Any, tmp_path: Any) -> Iterator[tuple[Service, Redis]]:
    """The service as deployed: two workers, Postgres, and a Redis of its own (the tests flush and
    restart it)."""
    server = start_redis()
    db = postgres.create_database(f"live_{uuid.uuid4().hex[:12]}")
    svc = make_service(db, redis_url=server.url, log_dir=str(tmp_path), serve_args=["--workers", "2"]).start()
    try:
        yield svc, server
    finally:
        svc.stop()
        server.stop()


def post(url: str, run: dict[str, Any], seqs: range) -> None:
    for start in range(seqs.start, seqs.stop, 100):
        batch = [{"seq": s, "step": s + 1, "probes": {"kl_drift": 0.1}} for s in range(start, min(start + 100, seqs.stop))]
        r = post_obs(url, run, batch)
        assert r.status_code == 200, r.text


def sse(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """Events with data, as the SSE spec parses them (comments and the retry field skipped)."""
    event: dict[str, str] = {}
    for line in resp.iter_lines():
        if line == "":
            if "data" in event:
                yield {**event, "json": json.loads(event["data"])}
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


class Listener:
    """One SSE connection read in a thread, as a browser tab holds it open (until the server ends
    it, or the observation ``until_seq`` arrives)."""

    def __init__(self, url: str, run_id: str, *, last_event_id: str | None = None, seconds: float = 20,
                 until_seq: int | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.opened = threading.Event()
        self.ended = threading.Event()
        headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
        self._thread = threading.Thread(target=self._read, args=(url, run_id, headers, seconds, until_seq),
                                        daemon=True)
        self._thread.start()

    def _read(self, url: str, run_id: str, headers: dict[str, str], seconds: float, until_seq: int | None) -> None:
        try:
            with httpx.stream("GET", f"{url}/v1/runs/{run_id}/stream", params={"max_seconds": seconds},
                              headers=headers, timeout=seconds + 30) as resp:
                assert resp.status_code == 200, resp.read()
                self.opened.set()
                for ev in sse(resp):
                    self.events.append(ev)
                    if until_seq is not None and ev["json"].get("seq") == until_seq:
                        return
        finally:
            self.opened.set()
            self.ended.set()

    def seqs(self) -> list[int]:
        return [e["json"]["seq"] for e in self.events if e["event"] == "observation"]

    def has_seq(self, seq: int) -> bool:
        return seq in self.seqs()


def read_all(url: str, run_id: str, last_seq: int, last_event_id: str | None = None) -> list[dict[str, Any]]:
    """What one connection gets up to the observation ``last_seq`` (or in 10 s, if it never comes)."""
    listener = Listener(url, run_id, last_event_id=last_event_id, seconds=10, until_seq=last_seq)
    assert listener.ended.wait(40)
    return listener.events


def following(url: str, events: int, seconds: float, until_seq: int | None = None) -> tuple[dict[str, Any], Listener]:
    """A quiet run with ``events`` events, and a connection that has received them all."""
    run = register(url, policy=QUIET)
    post(url, run, range(events))
    listener = Listener(url, run["id"], seconds=seconds, until_seq=until_seq)
    wait_until(lambda: listener.has_seq(events - 1), 10, "the events before the incident")
    return run, listener


def test_a_connected_stream_keeps_receiving_after_flushall(production: tuple[Service, Redis]) -> None:
    svc, server = production
    run, listener = following(svc.url, 60, seconds=15, until_seq=99)
    seen = len(listener.events)

    redis.Redis.from_url(server.url).flushall()
    post(svc.url, run, range(60, 100))
    wait_until(lambda: listener.has_seq(99) or listener.ended.is_set(), 20, "the events after the flush")

    after = listener.events[seen:]
    assert after, "silence after FLUSHALL: no event, no gap, no end"
    assert after[0]["event"] == "gap" and after[0]["json"]["reason"] == "restarted"
    assert [e["json"]["seq"] for e in after[1:]] == list(range(60, 100))  # every event after the flush, in order
    # The gap's id is in the new numbering: a reconnect after it resumes without another gap.
    resumed = read_all(svc.url, run["id"], 99, last_event_id=after[0]["id"])
    assert [e["json"]["seq"] for e in resumed] == list(range(60, 100))


def test_reconnecting_after_a_redis_restart_is_told_and_misses_nothing(production: tuple[Service, Redis]) -> None:
    svc, server = production
    run, listener = following(svc.url, 30, seconds=30)
    last_id = listener.events[-1]["id"]

    server.stop()
    assert listener.ended.wait(20), "a stream whose Redis went away must end (the client reconnects)"
    server.proc = restart_redis_same_port(server).proc  # the fixture stops the server it yielded
    wait_until(lambda: httpx.get(f"{svc.url}/healthz").status_code == 200, 30, "healthz after the restart")
    # More events than the client had seen: the new numbering passes its old id.
    post(svc.url, run, range(30, 130))

    got = read_all(svc.url, run["id"], 129, last_event_id=last_id)
    assert got and got[0]["event"] == "gap" and got[0]["json"]["reason"] == "restarted", got[:2]
    assert [e["json"]["seq"] for e in got[1:]] == list(range(30, 130))  # none silently missed


def test_an_id_before_what_is_kept_gets_a_trimmed_gap(production: tuple[Service, Redis]) -> None:
    """In the current numbering, an id older than what is kept gets a `trimmed` gap naming exactly
    the missing numbers; an id of the numbering lost in a FLUSHALL, or a plain number from before
    numberings had epochs, gets a `restarted` gap, though its number alone looks merely trimmed."""
    svc, server = production
    run = register(svc.url, policy=QUIET)
    post(svc.url, run, range(20))
    old_id = read_all(svc.url, run["id"], 19)[-1]["id"]

    redis.Redis.from_url(server.url).flushall()
    post(svc.url, run, range(20, 30))
    early = read_all(svc.url, run["id"], 29)
    assert [e["json"]["seq"] for e in early] == list(range(20, 30))
    early_id = early[4]["id"]  # the 5th event of the new numbering
    post(svc.url, run, range(30, 1530))  # the live state keeps about the last 1,000 per run

    kept = read_all(svc.url, run["id"], 1529)
    kept_seqs = [e["json"]["seq"] for e in kept]
    assert kept_seqs == list(range(kept_seqs[0], 1530)) and kept_seqs[0] > 25

    trimmed = read_all(svc.url, run["id"], 1529, last_event_id=early_id)
    gap = trimmed[0]
    number = int(early_id.rpartition("-")[2])
    assert gap["event"] == "gap" and gap["json"]["reason"] == "trimmed", gap
    assert gap["json"]["first"] == number + 1 and gap["json"]["last"] == int(kept[0]["id"].rpartition("-")[2]) - 1
    assert trimmed[1:] == kept

    for stale in (old_id, "5"):
        got = read_all(svc.url, run["id"], 1529, last_event_id=stale)
        assert got[0]["event"] == "gap" and got[0]["json"]["reason"] == "restarted", (stale, got[0])
        assert got[1:] == kept
