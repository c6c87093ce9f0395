"""Live state: ``publish_many`` is ``touch`` plus ``publish`` of each event, in one go; ``follow``
numbers events 1, 2, 3, ..., resumes after any number, reports trimmed ones as a gap, and shares
one blocking read among every follower of a worker (Redis)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import actuator.live as live_module
from actuator.live import LiveEvent, MemoryLive, RedisLive

from servers import start_redis

EVENTS: list[dict[str, Any]] = [
    {"kind": "guardrail_breach", "step": 3, "guardrail": "cap", "value": 5.5, "threshold": 5.0},
    {"kind": "observation", "seq": 1, "step": 3, "probes": {"kl": 0.2}, "knobs": {"lr": 1e-4}},
    {"kind": "observation", "seq": 2, "step": 4, "probes": {}, "knobs": {}},
    {"kind": "decision", "number": 1, "step": 5, "knob": "lr", "old_value": 1e-4, "new_value": 9e-5,
     "reason": "kl 0.2 above setpoint 0.1: lr 0.0001 -> 9e-05"},
]


def make(request: pytest.FixtureRequest, keep: int = 1000) -> Any:
    if request.param == "memory":
        return MemoryLive(keep=keep)
    return RedisLive(request.getfixturevalue("redis_server").url, keep=keep)


@pytest.fixture(params=["memory", "redis"])
def live(request: pytest.FixtureRequest) -> Any:
    lv = make(request)
    yield lv
    lv.close()


@pytest.fixture(params=["memory", "redis"])
def small_live(request: pytest.FixtureRequest) -> Any:
    """Keeps about 10 events per run (Redis trims whole nodes of 100: about 100 to 200)."""
    lv = make(request, keep=10)
    yield lv
    lv.close()


def run_async(live: Any, main: Any) -> Any:
    """One event loop per test, and the live state's async side closed on it."""

    async def wrapped() -> Any:
        try:
            return await main()
        finally:
            await live.aclose()

    return asyncio.run(wrapped())


async def take(events: AsyncIterator[LiveEvent], n: int, timeout: float = 5.0) -> list[LiveEvent]:
    out: list[LiveEvent] = []
    async with asyncio.timeout(timeout):
        async for ev in events:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def kept(live: Any, run: str, after: int | None = None) -> list[LiveEvent]:
    """Every event the live state has after ``after`` (what a client catching up gets)."""
    events = live.follow(run, after)
    out: list[LiveEvent] = []
    try:
        while True:
            async with asyncio.timeout(0.5):
                out.append(await anext(events))
    except TimeoutError:
        return out
    finally:
        await events.aclose()


def decoded(events: list[LiveEvent]) -> list[tuple[int, dict[str, Any]]]:
    for ev in events:
        assert ev.kind == json.loads(ev.data)["kind"]
    return [(ev.id, json.loads(ev.data)) for ev in events]


def test_publish_many_is_publish_of_each_in_order(live: Any) -> None:
    one, many = f"one-{uuid.uuid4().hex}", f"many-{uuid.uuid4().hex}"
    for ev in EVENTS:
        live.publish(one, ev)
    live.publish_many(many, EVENTS[:1])
    live.publish_many(many, iter(EVENTS[1:]))  # any iterable

    async def main() -> None:
        assert decoded(await kept(live, many)) == decoded(await kept(live, one)) == list(enumerate(EVENTS, start=1))
        assert decoded(await kept(live, many, after=2)) == [(3, EVENTS[2]), (4, EVENTS[3])]
        # Interleaved with single publishes, the ids stay one sequence.
        live.publish(many, {"kind": "state", "to": "paused", "reason": "r"})
        live.publish_many(many, [{"kind": "state", "to": "running", "reason": "r"}])
        assert [e.id for e in await kept(live, many)] == [1, 2, 3, 4, 5, 6]
        assert json.loads((await kept(live, many, after=4))[-1].data)["to"] == "running"

    run_async(live, main)


def test_publish_many_touches_only_when_asked(live: Any) -> None:
    run = f"touch-{uuid.uuid4().hex}"
    live.publish_many(run, EVENTS[:1])
    assert live.last_seen(run) is None
    live.publish_many(run, [], touch=7)  # nothing to publish: still a touch
    seen = live.last_seen(run)
    assert seen is not None
    live.publish_many(run, EVENTS[1:], touch=8)
    assert live.last_seen(run) >= seen
    live.publish_many(run, [])  # nothing at all: no round trip, no error
    assert [e for _, e in decoded(run_async(live, lambda: kept(live, run)))] == EVENTS


def test_follow_resumes_exactly_and_reports_trimmed_events_as_one_gap(small_live: Any) -> None:
    run = f"trim-{uuid.uuid4().hex}"
    for i in range(300):
        small_live.publish(run, {"kind": "observation", "seq": i})

    async def main() -> None:
        everything = await kept(small_live, run)  # no Last-Event-ID: what is kept, no gap
        first = everything[0].id
        assert 1 < first and [e.id for e in everything] == list(range(first, 301))
        assert await kept(small_live, run, after=300) == []
        tail = await kept(small_live, run, after=295)
        assert [e.id for e in tail] == [296, 297, 298, 299, 300]
        resumed = await kept(small_live, run, after=5)
        gap = resumed[0]
        assert (gap.kind, gap.id) == ("gap", first - 1)
        assert json.loads(gap.data) == {"kind": "gap", "reason": "trimmed", "first": 6, "last": first - 1}
        assert resumed[1:] == everything
        # ahead of the live state: it lost its events and numbers from 1 again
        ahead = await kept(small_live, run, after=1000)
        assert (ahead[0].kind, ahead[0].id) == ("gap", 0)
        assert json.loads(ahead[0].data) == {"kind": "gap", "reason": "restarted", "last_event_id": 1000}
        assert ahead[1:] == everything

    run_async(small_live, main)


def test_every_follower_of_a_run_gets_its_live_events_and_no_other_runs(live: Any) -> None:
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    live.publish(a, {"kind": "observation", "seq": 0})

    async def main() -> None:
        followers = [live.follow(a) for _ in range(5)]
        heads = await asyncio.gather(*(take(f, 1, timeout=2) for f in followers))
        assert all([e.id for e in h] == [1] for h in heads)
        waiting = [asyncio.create_task(take(f, 3)) for f in followers]
        await asyncio.sleep(0.3)  # every follower is waiting on the (shared, blocking) read
        other = live.follow(b, 0)  # a run new to that read: it is woken and re-armed with it
        other_waiting = asyncio.create_task(take(other, 1))
        await asyncio.sleep(0.3)
        # Published from another thread, as the ingest route does.
        await asyncio.to_thread(live.publish_many, a, [{"kind": "observation", "seq": s} for s in (1, 2, 3)])
        for task in waiting:
            assert [json.loads(e.data)["seq"] for e in await task] == [1, 2, 3]
        await asyncio.sleep(0.3)
        assert not other_waiting.done()  # run b heard nothing of run a
        await asyncio.to_thread(live.publish, b, {"kind": "state", "to": "paused"})
        # well within the 10 s the shared read blocks for: the wake worked
        assert [e.id for e in await asyncio.wait_for(other_waiting, 2)] == [1]
        for f in [*followers, other]:
            await f.aclose()

    run_async(live, main)


def test_a_follower_that_falls_behind_reads_from_its_cursor(redis_server: Any, monkeypatch: Any) -> None:
    """A follower whose client reads slowly queues at most a few batches; past that it re-reads
    the stream from its own cursor, so nothing kept is lost."""
    monkeypatch.setattr(live_module, "_BACKLOG", 3)
    live = RedisLive(redis_server.url)
    run = f"slow-{uuid.uuid4().hex}"

    async def main() -> None:
        events = live.follow(run, 0)
        first = asyncio.create_task(take(events, 1))
        await asyncio.sleep(0.3)
        for s in range(20):  # separate publishes: the shared read hands them on in many batches
            await asyncio.to_thread(live.publish, run, {"kind": "observation", "seq": s})
            await asyncio.sleep(0.02)
        assert [e.id for e in await first] == [1]
        assert [e.id for e in await take(events, 19)] == list(range(2, 21))
        await events.aclose()

    try:
        run_async(live, main)
    finally:
        live.close()


def test_followers_end_with_the_error_when_redis_goes_away() -> None:
    server = start_redis()
    live = RedisLive(server.url)
    run = f"gone-{uuid.uuid4().hex}"

    async def main() -> None:
        events = live.follow(run, 0)
        waiting = asyncio.create_task(take(events, 1, timeout=20))
        await asyncio.sleep(0.3)
        server.stop()
        with pytest.raises(Exception) as info:
            await waiting
        assert type(info.value).__module__.startswith("redis")

    try:
        run_async(live, main)
    finally:
        live.close()
        if server.proc.poll() is None:
            server.stop()
