"""Live state: ``publish_many`` is ``touch`` plus ``publish`` of each event, in one go; ``follow``
numbers events 1, 2, 3, ... in one epoch, resumes after any id, reports trimmed ones and ids of
another epoch as a gap, and shares one blocking read among every follower of a worker (Redis)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

import actuator.live as live_module
from actuator.live import EventId, LiveEvent, MemoryLive, RedisLive
from actuator.schemas import EVENT, DecisionEvent, Event, GuardrailBreach, ObservationEvent, StateChanged

from actuator.testing import start_redis

# As the stream carries them (the JSON text is json.dumps of these dicts, byte for byte).
WIRE: list[dict[str, Any]] = [
    {"kind": "guardrail_breach", "step": 3, "guardrail": "cap", "action": "alert", "value": 5.5, "threshold": 5.0,
     "reason": "guardrail cap: kl 5.5 above threshold 5 (alert)"},
    {"kind": "observation", "seq": 1, "step": 3, "probes": {"kl": 0.2}, "knobs": {"lr": 1e-4}},
    {"kind": "observation", "seq": 2, "step": 4, "probes": {}, "knobs": {}},
    {"kind": "decision", "number": 1, "step": 5, "knob": "lr", "old_value": 1e-4, "new_value": 9e-5,
     "reason": "kl 0.2 above setpoint 0.1: lr 0.0001 -> 9e-05"},
]
EVENTS: list[Event] = [GuardrailBreach(**WIRE[0]), ObservationEvent(**WIRE[1]), ObservationEvent(**WIRE[2]),
                       DecisionEvent(**WIRE[3])]


def obs(seq: int) -> ObservationEvent:
    return ObservationEvent(seq=seq, step=seq, probes={}, knobs={})


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


@pytest.fixture
def redis_live() -> Any:
    """A RedisLive on a Redis of its own, and a plain client of that Redis to act behind the live
    state's back (FLUSHALL and all, which the session's shared server is spared)."""
    import redis

    server = start_redis()
    live, r = RedisLive(server.url), redis.Redis.from_url(server.url)
    yield live, r
    live.close()
    r.close()
    server.stop()


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


async def kept(live: Any, run: str, after: EventId | None = None) -> list[LiveEvent]:
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
    """(number, event) of each; all of one epoch; each one of the typed events."""
    for ev in events:
        assert ev.kind == json.loads(ev.data)["kind"] == EVENT.validate_json(ev.data).kind
    assert len({ev.id.epoch for ev in events}) <= 1
    return [(ev.id.n, json.loads(ev.data)) for ev in events]


def numbers(events: list[LiveEvent]) -> list[int]:
    return [n for n, _ in decoded(events)]


def test_publish_many_is_publish_of_each_in_order(live: Any) -> None:
    one, many = f"one-{uuid.uuid4().hex}", f"many-{uuid.uuid4().hex}"
    for ev in EVENTS:
        live.publish(one, ev)
    live.publish_many(many, EVENTS[:1])
    live.publish_many(many, iter(EVENTS[1:]))  # any iterable

    async def main() -> None:
        everything = await kept(live, many)
        assert decoded(everything) == decoded(await kept(live, one)) == list(enumerate(WIRE, start=1))
        assert [e.data for e in everything] == [json.dumps(w) for w in WIRE]  # the text the stream always sent
        epoch = everything[0].id.epoch
        assert decoded(await kept(live, many, after=EventId(epoch, 2))) == [(3, WIRE[2]), (4, WIRE[3])]
        # Interleaved with single publishes, the ids stay one sequence.
        live.publish(many, StateChanged(to="paused", reason="r"))
        live.publish_many(many, [StateChanged(to="running", reason="r")])
        assert [e.id for e in await kept(live, many)] == [EventId(epoch, n) for n in range(1, 7)]
        assert json.loads((await kept(live, many, after=EventId(epoch, 4)))[-1].data)["to"] == "running"

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
    assert [e for _, e in decoded(run_async(live, lambda: kept(live, run)))] == WIRE


def test_follow_resumes_exactly_and_reports_trimmed_events_as_one_gap(small_live: Any) -> None:
    run = f"trim-{uuid.uuid4().hex}"
    for i in range(300):
        small_live.publish(run, obs(i))

    async def main() -> None:
        everything = await kept(small_live, run)  # no Last-Event-ID: what is kept, no gap
        epoch, first = everything[0].id.epoch, everything[0].id.n
        assert 1 < first and numbers(everything) == list(range(first, 301))
        assert await kept(small_live, run, after=EventId(epoch, 300)) == []
        tail = await kept(small_live, run, after=EventId(epoch, 295))
        assert numbers(tail) == [296, 297, 298, 299, 300]
        resumed = await kept(small_live, run, after=EventId(epoch, 5))
        gap = resumed[0]
        assert (gap.kind, gap.id) == ("gap", EventId(epoch, first - 1))
        assert json.loads(gap.data) == {"kind": "gap", "reason": "trimmed", "first": 6, "last": first - 1}
        assert resumed[1:] == everything
        # ahead of the live state, or of another epoch (a plain number from before epochs is epoch
        # 0): the numbering it belongs to was lost; the client is told, then gets what is kept.
        for lost in (EventId(epoch, 1000), EventId(epoch - 1, 5), EventId(epoch + 1, 5), EventId.parse("5")):
            told = await kept(small_live, run, after=lost)
            assert (told[0].kind, told[0].id) == ("gap", EventId(epoch, first - 1)), lost
            assert json.loads(told[0].data) == {"kind": "gap", "reason": "restarted", "last_event_id": str(lost)}
            assert told[1:] == everything
        # "0" (or "<epoch>-0"): nothing seen yet, so what is not kept is merely trimmed
        for start in (EventId.parse("0"), EventId(epoch, 0)):
            from_start = await kept(small_live, run, after=start)
            assert json.loads(from_start[0].data) == {"kind": "gap", "reason": "trimmed", "first": 1, "last": first - 1}
            assert from_start[1:] == everything

    run_async(small_live, main)


def test_every_follower_of_a_run_gets_its_live_events_and_no_other_runs(live: Any) -> None:
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    live.publish(a, obs(0))

    async def main() -> None:
        followers = [live.follow(a) for _ in range(5)]
        heads = await asyncio.gather(*(take(f, 1, timeout=2) for f in followers))
        assert all(numbers(h) == [1] for h in heads)
        waiting = [asyncio.create_task(take(f, 3)) for f in followers]
        await asyncio.sleep(0.3)  # every follower is waiting on the (shared, blocking) read
        other = live.follow(b, EventId.parse("0"))  # a run new to that read: it is woken and re-armed with it
        other_waiting = asyncio.create_task(take(other, 1))
        await asyncio.sleep(0.3)
        # Published from another thread, as the ingest route does.
        await asyncio.to_thread(live.publish_many, a, [obs(s) for s in (1, 2, 3)])
        for task in waiting:
            assert [json.loads(e.data)["seq"] for e in await task] == [1, 2, 3]
        await asyncio.sleep(0.3)
        assert not other_waiting.done()  # run b heard nothing of run a
        await asyncio.to_thread(live.publish, b, StateChanged(to="paused"))
        # well within the 10 s the shared read blocks for: the wake worked
        assert numbers(await asyncio.wait_for(other_waiting, 2)) == [1]
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
        events = live.follow(run, EventId.parse("0"))
        first = asyncio.create_task(take(events, 1))
        await asyncio.sleep(0.3)
        for s in range(20):  # separate publishes: the shared read hands them on in many batches
            await asyncio.to_thread(live.publish, run, obs(s))
            await asyncio.sleep(0.02)
        assert numbers(await first) == [1]
        assert numbers(await take(events, 19)) == list(range(2, 21))
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
        events = live.follow(run, EventId.parse("0"))
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


def test_a_stream_recreated_below_the_shared_reads_cursor_is_found(redis_live: Any, monkeypatch: Any) -> None:
    """A new epoch sorts after the lost one by Redis's clock; a clock set back would recreate a
    run's stream below the shared read's cursor, where a blocking read never looks. The shared
    read checks each stream's last id every block, and the follower is told, then gets the
    events. Made here by renaming an older run's stream (an earlier epoch) onto the followed run."""
    monkeypatch.setattr(live_module, "_BLOCK_MS", 300)
    live, r = redis_live
    older, run = f"older-{uuid.uuid4().hex}", f"sunk-{uuid.uuid4().hex}"
    live.publish_many(older, [obs(s) for s in (100, 101)])
    live.publish(run, obs(0))

    async def main() -> None:
        events = live.follow(run)
        [head] = await take(events, 1)
        assert head.id.epoch > (await kept(live, older))[0].id.epoch
        waiting = asyncio.create_task(take(events, 3))
        await asyncio.sleep(0.5)  # the shared read is blocking past the run's event
        r.rename(RedisLive._key(older), RedisLive._key(run))
        gap, *rest = await waiting
        assert gap.kind == "gap" and json.loads(gap.data) == {"kind": "gap", "reason": "restarted",
                                                              "last_event_id": str(head.id)}
        assert [json.loads(e.data)["seq"] for e in rest] == [100, 101]
        assert gap.id == rest[0].id.previous  # a reconnect after the gap resumes at the next event
        await events.aclose()

    run_async(live, main)


def test_a_follower_across_a_flushall_is_told_and_gets_every_new_event(redis_live: Any) -> None:
    """FLUSHALL loses every stream: the next publish starts a new epoch, which the shared read,
    blocking at the old numbering's cursor, sees; the follower is told, then gets every event."""
    live, r = redis_live
    run = f"flushed-{uuid.uuid4().hex}"
    live.publish_many(run, [obs(s) for s in range(50)])

    async def main() -> None:
        events = live.follow(run)
        before = await take(events, 50)
        waiting = asyncio.create_task(take(events, 11))
        await asyncio.sleep(0.3)
        r.flushall()
        await asyncio.to_thread(live.publish_many, run, [obs(s) for s in range(50, 60)])
        gap, *rest = await waiting
        assert gap.kind == "gap" and json.loads(gap.data)["reason"] == "restarted"
        assert json.loads(gap.data)["last_event_id"] == str(before[-1].id)
        assert [json.loads(e.data)["seq"] for e in rest] == list(range(50, 60))
        assert numbers(rest) == list(range(1, 11)) and rest[0].id.epoch > before[0].id.epoch
        await events.aclose()

    run_async(live, main)
