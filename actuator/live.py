"""Live state: when each run was last heard from, and event fan-out for live streams.

Two implementations with one interface: :class:`MemoryLive` (embedded default, one process) and
:class:`RedisLive` (production: shared by every worker and replica). Durable state is never kept
here; losing Redis loses nothing but liveness timestamps and in-flight stream events.

Events of a run are numbered 1, 2, 3, ... in publish order, and only the last ``keep`` are kept.
:meth:`LiveState.follow` resumes exactly after any number; what was trimmed away meanwhile comes
back as one ``gap`` event naming the missing numbers, never as silence. A follower costs nothing
while its run is quiet: it waits to be woken (in process), or on the one blocking ``XREAD`` its
worker shares among all its followers (Redis).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, cast

__all__ = ["LiveEvent", "LiveState", "MemoryLive", "RedisLive", "make_live"]

_CHUNK = 500  # events per read while catching up, and per run per shared read
_BLOCK_MS = 10_000  # the shared XREAD re-arms this often (and then drops runs nobody follows)
_BACKLOG = 64  # batches queued for one follower before it re-reads from its cursor instead


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One event of a run's live stream. ``data`` is the event as JSON text: encoded once when
    published and sent as is to every follower."""

    id: int
    kind: str
    data: str


def _encode(event: dict[str, Any]) -> tuple[str, str]:
    return str(event.get("kind", "message")), json.dumps(event, default=str)


def _trimmed(first: int, last: int) -> LiveEvent:
    """Events ``first..last`` are no longer kept. Carries id ``last``: a client that reconnects
    after it is not told again."""
    return LiveEvent(last, "gap", json.dumps({"kind": "gap", "reason": "trimmed", "first": first, "last": last}))


def _restarted(after: int) -> LiveEvent:
    """The client has seen more events than the live state has numbered: the live state was lost
    (Redis or the process restarted) and numbering began again at 1. Carries id 0: what follows
    counts from the start."""
    return LiveEvent(0, "gap", json.dumps({"kind": "gap", "reason": "restarted", "last_event_id": after}))


class _Source(Protocol):
    """What :func:`_follow` needs of a backend for one follower of one run."""

    async def read(self, after: int) -> list[LiveEvent]: ...  # up to _CHUNK kept events after `after`
    async def last_id(self) -> int: ...  # the number of the last event published (0: none)
    async def wait(self, cursor: int) -> list[LiveEvent]: ...  # the next events; may overlap or skip


async def _follow(source: _Source, after: int | None) -> AsyncIterator[LiveEvent]:
    """The one follow algorithm of both backends: catch up from ``after`` (``None``: from the
    oldest kept event, no gap reported), then wait for new events. Ids are contiguous, so a
    skipped number is a trimmed event and is reported as such."""
    entries = await source.read(after or 0)
    if after and not entries and await source.last_id() < after:
        yield _restarted(after)  # and go on as a new client: what is kept, no second gap
        after = None
        entries = await source.read(0)
    cursor = after if after is not None else (entries[0].id - 1 if entries else await source.last_id())
    while True:
        for ev in entries:
            if ev.id <= cursor:
                continue
            if ev.id > cursor + 1:
                yield _trimmed(cursor + 1, ev.id - 1)
            yield ev
            cursor = ev.id
        if len(entries) >= _CHUNK:  # more kept than one read returns: keep reading
            entries = await source.read(cursor)
        else:
            entries = await source.wait(cursor)


class LiveState(Protocol):
    def ping(self) -> None: ...
    def touch(self, run_id: str, step: int) -> None: ...
    def last_seen(self, run_id: str) -> float | None: ...
    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...
    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None: ...
    def follow(self, run_id: str, after: int | None = None) -> AsyncGenerator[LiveEvent, None]:
        """The run's events after number ``after`` (``None``: every kept event), then new ones as
        they are published, until the caller stops (and closes it: ``aclose()``). Raises if the
        backend fails."""
        ...
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


class MemoryLive:
    """In-process live state; events kept in a bounded ring per run."""

    def __init__(self, keep: int = 1000) -> None:
        self._seen: dict[str, float] = {}
        self._events: dict[str, deque[LiveEvent]] = defaultdict(lambda: deque(maxlen=keep))
        self._ids: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        # Publishers run in the thread pool; followers wait on their event loop.
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)

    def ping(self) -> None:
        return None

    def touch(self, run_id: str, step: int) -> None:
        self._seen[run_id] = time.time()

    def last_seen(self, run_id: str) -> float | None:
        return self._seen.get(run_id)

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        self.publish_many(run_id, (event,))

    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None:
        """``publish`` of each event, in order (and ``touch(run_id, touch)`` first unless None)."""
        if touch is not None:
            self.touch(run_id, touch)
        encoded = [_encode(e) for e in events]
        if not encoded:
            return
        with self._lock:
            ring = self._events[run_id]
            for kind, data in encoded:
                self._ids[run_id] += 1
                ring.append(LiveEvent(self._ids[run_id], kind, data))
            waiters = list(self._waiters.get(run_id, ()))
        for loop, woken in waiters:
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # that follower's loop closed as we published: nobody to wake
                pass

    def _after(self, run_id: str, after: int) -> list[LiveEvent]:
        with self._lock:
            ring = self._events.get(run_id)
            if not ring:
                return []
            start = max(0, after - ring[0].id + 1)  # ids in a ring are contiguous
            return list(islice(ring, start, start + _CHUNK))

    def follow(self, run_id: str, after: int | None = None) -> AsyncGenerator[LiveEvent, None]:
        return _follow_memory(self, run_id, after)

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _MemoryFollower:
    def __init__(self, live: MemoryLive, run_id: str) -> None:
        self.live, self.run_id = live, run_id
        self.woken = asyncio.Event()

    async def read(self, after: int) -> list[LiveEvent]:
        return self.live._after(self.run_id, after)

    async def last_id(self) -> int:
        with self.live._lock:
            return self.live._ids.get(self.run_id, 0)

    async def wait(self, cursor: int) -> list[LiveEvent]:
        while True:
            self.woken.clear()  # before reading: a publish in between sets it again
            entries = self.live._after(self.run_id, cursor)
            if entries:
                return entries
            await self.woken.wait()


async def _follow_memory(live: MemoryLive, run_id: str, after: int | None) -> AsyncGenerator[LiveEvent, None]:
    follower = _MemoryFollower(live, run_id)
    waiter = (asyncio.get_running_loop(), follower.woken)
    with live._lock:
        live._waiters[run_id].add(waiter)
    try:
        async for ev in _follow(follower, after):
            yield ev
    finally:
        with live._lock:
            live._waiters[run_id].discard(waiter)
            if not live._waiters[run_id]:
                del live._waiters[run_id]


class RedisLive:
    """Redis-backed live state: a hash of last-seen times and a capped stream per run.

    Stream entry ids are ``0-<n>``, n = 1, 2, 3, ...: Redis numbers them itself (``XADD 0-*``,
    Redis 7), atomically whichever worker publishes, and keeps counting across trimming. The keys
    are ``actuator:run-stream:<run>``, not the earlier ``actuator:events:<run>``, whose
    time-based ids these numbers could not follow."""

    def __init__(self, url: str, keep: int = 1000) -> None:
        import redis

        self._url = url
        self._r = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._keep = keep
        self._hub: _RedisHub | None = None

    @staticmethod
    def _key(run_id: str) -> str:
        return f"actuator:run-stream:{run_id}"

    def ping(self) -> None:
        self._r.ping()

    def touch(self, run_id: str, step: int) -> None:
        self._r.hset("actuator:last_seen", run_id, time.time())

    def last_seen(self, run_id: str) -> float | None:
        v = self._r.hget("actuator:last_seen", run_id)
        return float(v) if v is not None else None

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        self.publish_many(run_id, (event,))

    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None:
        """The same stream entries as ``publish`` of each event in order (and the ``touch`` first
        unless None), sent as one pipeline: one round trip and one connection checkout for all.
        Not a transaction: like separate calls, another writer's entries may land in between."""
        key = self._key(run_id)
        pipe = self._r.pipeline(transaction=False)
        if touch is not None:
            pipe.hset("actuator:last_seen", run_id, time.time())
        for event in events:
            kind, data = _encode(event)
            pipe.xadd(key, {"k": kind, "e": data}, id="0-*", maxlen=self._keep, approximate=True)
        if len(pipe):
            pipe.execute()

    def follow(self, run_id: str, after: int | None = None) -> AsyncGenerator[LiveEvent, None]:
        if self._hub is None:  # built on first use, on the serving event loop
            self._hub = _RedisHub(self._url)
        return self._hub.follow(self._key(run_id), after)

    def close(self) -> None:
        self._r.close()

    async def aclose(self) -> None:
        if self._hub is not None:
            await self._hub.aclose()
            self._hub = None


# Stream replies as these clients get them (no decode_responses, RESP2). redis-py types every
# reply for either setting (bytes | str | None ...), hence the casts where they are read.
_Entries = list[tuple[bytes, dict[bytes, bytes]]]
_ReadReply = list[tuple[bytes, _Entries]] | None


def _entry(eid: bytes, fields: dict[bytes, bytes]) -> LiveEvent:
    return LiveEvent(int(eid.rpartition(b"-")[2]), fields[b"k"].decode(), fields[b"e"].decode())


class _RedisFollower:
    def __init__(self, hub: _RedisHub, key: str) -> None:
        self.hub, self.key = hub, key
        self.batches: deque[list[LiveEvent] | BaseException] = deque()
        self.arrived = asyncio.Event()
        self.behind = False  # its backlog overflowed: re-read from the cursor
        self.registered = False

    def push(self, batch: list[LiveEvent] | BaseException) -> None:
        if isinstance(batch, BaseException) or len(self.batches) < _BACKLOG:
            self.batches.append(batch)
        else:
            self.behind = True
        self.arrived.set()

    async def read(self, after: int) -> list[LiveEvent]:
        entries = cast(_Entries, await self.hub.client.xrange(self.key, min=f"(0-{after}", max="+", count=_CHUNK))
        return [_entry(eid, f) for eid, f in entries]

    async def last_id(self) -> int:
        last = cast(_Entries, await self.hub.client.xrevrange(self.key, count=1))
        return _entry(*last[0]).id if last else 0

    async def wait(self, cursor: int) -> list[LiveEvent]:
        if not self.registered:
            self.registered = True
            shared = await self.hub.register(self, cursor)
            if shared > cursor:  # the shared read is past our cursor: read the difference ourselves
                return await self.read(cursor)
        while not self.batches:
            if self.behind:
                self.behind = False
                return await self.read(cursor)
            self.arrived.clear()
            await self.arrived.wait()
        batch = self.batches.popleft()
        if isinstance(batch, BaseException):
            raise batch
        if batch[0].id > cursor + 1:  # a jump: trimmed, or we fell behind; the stream says which
            return await self.read(cursor)
        return batch


class _RedisHub:
    """One worker's followers of every run share one blocking ``XREAD`` on a connection of its
    own; each entry is decoded once and handed to every follower of its run. A follower reads
    by itself only while catching up. A run followed for the first time wakes the shared read
    (one entry on this worker's wake stream) so the read re-arms with it."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.client = aredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        # No silent retry of the shared read: on a new connection Redis may have restarted and
        # numbered from 1 again, below every cursor held here. Failing ends the streams; clients
        # reconnect with Last-Event-ID and are told of the restart.
        self._reader = aredis.Redis.from_url(url, socket_timeout=_BLOCK_MS / 1000 + 5.0, socket_connect_timeout=2.0,
                                             single_connection_client=True, retry=Retry(NoBackoff(), 0))
        self._followers: dict[str, set[_RedisFollower]] = {}
        self._cursors: dict[str, int] = {}  # run stream -> last id the shared read has handed on
        self._wake = f"actuator:wake:{uuid.uuid4().hex}"
        self._wake_seen = b"0-0"
        self._woken = False  # a wake is on its way and the read has not re-armed since
        self._task: asyncio.Task[None] | None = None

    async def follow(self, key: str, after: int | None) -> AsyncGenerator[LiveEvent, None]:
        follower = _RedisFollower(self, key)
        try:
            async for ev in _follow(follower, after):
                yield ev
        finally:
            self._followers.get(key, set()).discard(follower)

    async def register(self, follower: _RedisFollower, cursor: int) -> int:
        """Hand ``follower`` every entry of its run after the returned id (at most ``cursor``'s
        successor is missing: the caller reads the difference when the returned id is larger)."""
        self._followers.setdefault(follower.key, set()).add(follower)
        new = follower.key not in self._cursors
        shared = self._cursors.setdefault(follower.key, cursor)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="actuator-live-reader")
        elif new and not self._woken:  # a run new to the running read: re-arm it
            self._woken = True
            pipe = self.client.pipeline(transaction=False)
            pipe.xadd(self._wake, {"w": b""}, maxlen=1)
            pipe.expire(self._wake, 3600)  # a worker killed without clean-up leaves no key for long
            await pipe.execute()
        return shared

    async def _run(self) -> None:
        while True:
            for key in [k for k, f in self._followers.items() if not f]:
                del self._followers[key]
                self._cursors.pop(key, None)
            if not self._followers:
                return
            self._woken = False
            streams: dict[Any, Any] = {self._wake: self._wake_seen}
            streams.update((k, f"0-{c}") for k, c in self._cursors.items())
            try:
                reply = cast(_ReadReply, await self._reader.xread(streams, count=_CHUNK, block=_BLOCK_MS))
            except Exception as exc:  # noqa: BLE001 - every follower ends with it; the clients reconnect
                self._fail(exc)
                return
            for raw_key, entries in reply or ():
                key = raw_key.decode()
                if key == self._wake:
                    self._wake_seen = entries[-1][0]
                    continue
                batch = [_entry(eid, f) for eid, f in entries]
                self._cursors[key] = batch[-1].id
                for follower in self._followers.get(key, ()):
                    follower.push(batch)

    def _fail(self, exc: BaseException) -> None:
        for followers in self._followers.values():
            for follower in followers:
                follower.push(exc)
        self._followers.clear()
        self._cursors.clear()

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - shutting down
                pass
        try:
            await self.client.delete(self._wake)
        except Exception:  # noqa: BLE001 - Redis gone: the key expires by itself
            pass
        await self.client.aclose()
        await self._reader.aclose()


def make_live(redis_url: str | None) -> LiveState:
    return RedisLive(redis_url) if redis_url else MemoryLive()
