"""Live state: when each run was last heard from, and event fan-out for live streams.

Two implementations with one interface: :class:`MemoryLive` (embedded default, one process) and
:class:`RedisLive` (production: shared by every worker and replica). Durable state is never kept
here; losing Redis loses nothing but liveness timestamps and in-flight stream events.

Events of a run are numbered 1, 2, 3, ... in publish order within an **epoch**: the time the
numbering started (microseconds since 1970), taken when the run's first event is kept, stored in
every event id (``<epoch>-<n>``, see :class:`EventId`). Live state that loses its events (Redis
flushed or restarted, the process restarted) starts a new epoch, so a number never comes to mean
another event. Only the last ``keep`` events are kept. :meth:`LiveState.follow` resumes exactly
after any id; what it cannot resume is said, never left as silence: events trimmed away come back
as one ``gap`` event naming the missing numbers (``"trimmed"``), and an id of another epoch as a
``gap`` telling the client to resync from the durable report (``"restarted"``). A follower costs
nothing while its run is quiet: it waits to be woken (in process), or on the one blocking
``XREAD`` its worker shares among all its followers (Redis).

Publishing is best effort: it comes after the store's commit, so an ingest whose observations and
decisions are stored answers with them whatever Redis does. :class:`RedisLive` waits at most
``publish_timeout`` for Redis; once a publish fails it stops trying for a while (0.5 s, doubling to
5 s while Redis stays away) and counts, per run, the events it did not publish; the run's next
published events start with one ``gap`` event naming how many were missed (``"unpublished"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

from .schemas import Event, Gap

__all__ = ["EventId", "LiveEvent", "LiveState", "MemoryLive", "RedisLive", "encode_event", "make_live"]

_CHUNK = 500  # events per read while catching up, and per run per shared read
_BLOCK_MS = 10_000  # the shared XREAD re-arms this often (and then drops runs nobody follows)
_BACKLOG = 64  # batches queued for one follower before it re-reads from its cursor instead
_RETRY_FIRST, _RETRY_MAX = 0.5, 5.0  # seconds publishing pauses after a failure (doubling while it fails)
_FLUSH_RUNS = 50  # other runs' gaps published along with one publish, at most

log = logging.getLogger("actuator.live")


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """An event's place in its run's stream, ordered as Redis orders stream ids: the epoch its
    numbering started in, then its number ``n`` (1, 2, 3, ...) in that epoch. Text form
    ``<epoch>-<n>``, which is the Redis stream entry id itself."""

    epoch: int
    n: int

    # At most 19 digits each: below 2**64, so any id a client sends is a valid Redis stream id.
    PATTERN: ClassVar[str] = r"^\d{1,19}(-\d{1,19})?$"

    def __str__(self) -> str:
        return f"{self.epoch}-{self.n}"

    @property
    def previous(self) -> EventId:
        return EventId(self.epoch, self.n - 1)

    @classmethod
    def parse(cls, text: str) -> EventId:
        """``<epoch>-<n>``; a plain ``<n>`` (an id sent before epochs existed) is epoch 0, the epoch
        of streams numbered then. Raises ValueError on anything else."""
        if not re.fullmatch(cls.PATTERN, text):
            raise ValueError(f"not an event id: {text[:40]!r}")
        epoch, _, n = text.rpartition("-")
        return cls(int(epoch or 0), int(n))


ORIGIN = EventId(0, 0)  # before every event: a follower that has seen nothing yet


@dataclass(frozen=True, slots=True)
class LiveEvent:
    """One event of a run's live stream. ``data`` is the event (an :data:`actuator.schemas.Event`)
    as JSON text: encoded once when published and sent as is to every follower."""

    id: EventId
    kind: str
    data: str


def encode_event(event: Event) -> tuple[str, str]:
    """The event's kind and JSON text (``kind`` first; json.dumps' spacing, as the stream always had)."""
    return event.kind, json.dumps({"kind": event.kind, **event.model_dump(by_alias=True)})


def _epoch_now() -> int:
    return time.time_ns() // 1000


def _trimmed(epoch: int, first: int, last: int) -> LiveEvent:
    """Events ``first..last`` are no longer kept. Carries the id of ``last``: a client that
    reconnects after it is not told again."""
    return LiveEvent(EventId(epoch, last), *encode_event(Gap.trimmed(first, last)))


def _restarted(after: EventId, resume: EventId) -> LiveEvent:
    """``after`` belongs to a numbering the live state no longer has (it lost its events: Redis or
    the process restarted, or Redis was flushed): whatever came after it is unknown here, so the
    client resyncs from the durable report. Carries ``resume``, the id just before the events
    that follow (``after`` itself while no event of the new numbering exists yet)."""
    return LiveEvent(resume, *encode_event(Gap.restarted(str(after))))


class _Source(Protocol):
    """What :func:`_follow` needs of a backend for one follower of one run."""

    async def read(self, after: EventId) -> list[LiveEvent]: ...  # up to _CHUNK kept events with ids > after
    async def last_id(self) -> EventId | None: ...  # the id of the last event kept (None: none)
    async def wait(self, cursor: EventId) -> list[LiveEvent]: ...  # the next events; may overlap or skip


async def _continues(source: _Source, after: EventId, entries: list[LiveEvent]) -> bool:
    """Whether ``after`` is in the numbering the live state has now (``entries``: what it keeps
    after ``after``)."""
    if entries:
        return entries[0].id.epoch == after.epoch
    last = await source.last_id()
    return last is not None and last.epoch == after.epoch and last.n >= after.n


async def _follow(source: _Source, after: EventId | None) -> AsyncIterator[LiveEvent]:
    """The one follow algorithm of both backends: catch up from ``after`` (``None``: from the
    oldest kept event, no gap reported), then wait for new events. Numbers are contiguous within
    an epoch, so a skipped number is a trimmed event, and an event of another epoch means the
    numbering was lost; each is reported as such."""
    entries = await source.read(after or ORIGIN)
    if after is not None and after != ORIGIN and not await _continues(source, after, entries):
        entries = await source.read(ORIGIN)
        yield _restarted(after, entries[0].id.previous if entries else after)
        after = None  # and go on as a new client: what is kept, no second gap
    cursor = after if after is not None else (entries[0].id.previous if entries else ORIGIN)
    while True:
        for ev in entries:
            if cursor == ORIGIN:  # nothing seen yet: follow this event's numbering from its start
                cursor = EventId(ev.id.epoch, 0)
            if ev.id.epoch != cursor.epoch:  # numbering lost while following (the ids may sort either way)
                yield _restarted(cursor, ev.id.previous)
            elif ev.id.n <= cursor.n:
                continue
            elif ev.id.n > cursor.n + 1:
                yield _trimmed(cursor.epoch, cursor.n + 1, ev.id.n - 1)
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
    def publish(self, run_id: str, event: Event) -> None: ...
    def publish_many(self, run_id: str, events: Iterable[Event], *, touch: int | None = None) -> None: ...
    def follow(self, run_id: str, after: EventId | None = None) -> AsyncGenerator[LiveEvent, None]:
        """The run's events after ``after`` (``None``: every kept event), then new ones as they are
        published, until the caller stops (and closes it: ``aclose()``). Raises if the backend
        fails."""
        ...
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


class MemoryLive:
    """In-process live state; events kept in a bounded ring per run. A run's epoch is the time of
    its first event in this process: a restarted service numbers in a new one."""

    def __init__(self, keep: int = 1000) -> None:
        self._seen: dict[str, float] = {}
        self._events: dict[str, deque[LiveEvent]] = defaultdict(lambda: deque(maxlen=keep))
        self._last: dict[str, EventId] = {}  # run -> id of its last event
        self._lock = threading.Lock()
        # Publishers run in the thread pool; followers wait on their event loop.
        self._waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)

    def ping(self) -> None:
        return None

    def touch(self, run_id: str, step: int) -> None:
        self._seen[run_id] = time.time()

    def last_seen(self, run_id: str) -> float | None:
        return self._seen.get(run_id)

    def publish(self, run_id: str, event: Event) -> None:
        self.publish_many(run_id, (event,))

    def publish_many(self, run_id: str, events: Iterable[Event], *, touch: int | None = None) -> None:
        """``publish`` of each event, in order (and ``touch(run_id, touch)`` first unless None)."""
        if touch is not None:
            self.touch(run_id, touch)
        encoded = [encode_event(e) for e in events]
        if not encoded:
            return
        with self._lock:
            ring = self._events[run_id]
            last = self._last.get(run_id) or EventId(_epoch_now(), 0)
            for kind, data in encoded:
                last = EventId(last.epoch, last.n + 1)
                ring.append(LiveEvent(last, kind, data))
            self._last[run_id] = last
            waiters = list(self._waiters.get(run_id, ()))
        for loop, woken in waiters:
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # that follower's loop closed as we published: nobody to wake
                pass

    def _after(self, run_id: str, after: EventId) -> list[LiveEvent]:
        with self._lock:
            ring = self._events.get(run_id)
            if not ring:
                return []
            first = ring[0].id  # a ring holds one epoch, its numbers contiguous
            if after < first:
                start = 0
            elif after.epoch == first.epoch:
                start = after.n - first.n + 1
            else:
                return []
            return [ring[i] for i in range(start, min(start + _CHUNK, len(ring)))]

    def follow(self, run_id: str, after: EventId | None = None) -> AsyncGenerator[LiveEvent, None]:
        return _follow_memory(self, run_id, after)

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class _MemoryFollower:
    def __init__(self, live: MemoryLive, run_id: str) -> None:
        self.live, self.run_id = live, run_id
        self.woken = asyncio.Event()

    async def read(self, after: EventId) -> list[LiveEvent]:
        return self.live._after(self.run_id, after)

    async def last_id(self) -> EventId | None:
        with self.live._lock:
            return self.live._last.get(self.run_id)

    async def wait(self, cursor: EventId) -> list[LiveEvent]:
        while True:
            self.woken.clear()  # before reading: a publish in between sets it again
            entries = self.live._after(self.run_id, cursor)
            if entries:
                return entries
            await self.woken.wait()


async def _follow_memory(live: MemoryLive, run_id: str, after: EventId | None) -> AsyncGenerator[LiveEvent, None]:
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


# Publishes a run's events (and its touch) atomically, whichever worker runs it. The stream's last
# entry holds the epoch; a stream that does not exist (never did, or was lost with a FLUSHALL or a
# restart) starts a new one at Redis's own clock, in microseconds, so its ids sort after any id of
# the numbering that was lost: the shared blocking read sees them at once. Event numbers follow
# from Redis (XADD <epoch>-*), and keep counting across trimming.
# KEYS: the run's stream, the last-seen hash. ARGV: keep, run id, touch time ("": none), then
# kind, data, kind, data, ...
_PUBLISH = """
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
if #ARGV < 4 then return 0 end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
local epoch, id
if last then
  epoch = string.match(last[1], '^%d+')
  id = epoch .. '-*'
else
  redis.call('DEL', KEYS[1])  -- an emptied stream would refuse ids below its last one
  local t = redis.call('TIME')
  epoch = t[1] .. string.format('%06d', tonumber(t[2]))
  id = epoch .. '-1'
end
for i = 4, #ARGV, 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], id, 'k', ARGV[i], 'e', ARGV[i + 1])
  id = epoch .. '-*'
end
return 0
"""

# The last entry id of each stream (false: none), for the shared read's periodic check.
_LAST_IDS = """
local ids = {}
for i, key in ipairs(KEYS) do
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  ids[i] = last and last[1] or false
end
return ids
"""


class _Unpublished:
    """What a process could not publish while Redis was unreachable: per run, how many events; and
    when to try again (a circuit breaker: a hung Redis costs one ``publish_timeout`` per retry
    interval, not one per request). Thread-safe: publishers run in the thread pool."""

    def __init__(self, on_missed: Callable[[int], None] | None) -> None:
        self._lock = threading.Lock()
        self._missed: dict[str, int] = {}
        self._retry_at = 0.0
        self._backoff = 0.0
        self._since: float | None = None  # when the current outage began
        self._on_missed = on_missed

    def skipping(self) -> bool:
        return time.monotonic() < self._retry_at

    def add(self, run_id: str, count: int) -> None:
        if count <= 0:
            return
        with self._lock:
            self._missed[run_id] = self._missed.get(run_id, 0) + count
        if self._on_missed is not None:
            self._on_missed(count)

    def take(self, run_id: str) -> tuple[int, dict[str, int]]:
        """This run's missed count and up to ``_FLUSH_RUNS`` other runs', removed (put them back
        with :meth:`add` if they cannot be published)."""
        with self._lock:
            own = self._missed.pop(run_id, 0)
            others = {r: self._missed.pop(r) for r in list(self._missed)[:_FLUSH_RUNS]}
        return own, others

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self._since is None
            if first:
                self._since = time.monotonic()
            self._backoff = min(_RETRY_MAX, self._backoff * 2 if self._backoff else _RETRY_FIRST)
            self._retry_at = time.monotonic() + self._backoff
        if first:
            log.warning("live state (Redis) unreachable (%s: %s): live events are not published until it answers "
                        "again; ingests and decisions go on, and each run's stream gets a gap", type(exc).__name__, exc)

    def recovered(self) -> None:
        if self._since is None:
            return
        with self._lock:
            since, self._since, self._backoff = self._since, None, 0.0
            runs, events = len(self._missed), sum(self._missed.values())
        if since is not None:
            log.warning("live state (Redis) reachable again after %.1f s; its streams get a gap for the events "
                        "not published%s", time.monotonic() - since,
                        f" ({events} events of {runs} runs still to be marked)" if runs else "")


class RedisLive:
    """Redis-backed live state: a hash of last-seen times and a capped stream per run.

    Stream entry ids are the event ids, ``<epoch>-<n>``. The keys are ``actuator:run-stream:<run>``
    (streams numbered before epochs existed, ``0-<n>``, go on in their epoch 0), not the earlier
    ``actuator:events:<run>``, whose time-based ids these numbers could not follow."""

    def __init__(self, url: str, keep: int = 1000, *, publish_timeout: float = 0.5,
                 on_unpublished: Callable[[int], None] | None = None) -> None:
        import redis

        self._url = url
        self._r = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        # Publishing comes after the store's commit, on the request's path: its own connections with
        # a short timeout, so a hung Redis holds a request for at most that.
        self._pub = redis.Redis.from_url(url, socket_timeout=publish_timeout, socket_connect_timeout=publish_timeout)
        self._publish = self._pub.register_script(_PUBLISH)
        self._keep = keep
        self._hub: _RedisHub | None = None
        self._unpublished = _Unpublished(on_unpublished)

    @staticmethod
    def _key(run_id: str) -> str:
        return f"actuator:run-stream:{run_id}"

    def ping(self) -> None:
        self._r.ping()

    def touch(self, run_id: str, step: int) -> None:
        self.publish_many(run_id, (), touch=step)

    def last_seen(self, run_id: str) -> float | None:
        v = self._r.hget("actuator:last_seen", run_id)
        return float(v) if v is not None else None

    def publish(self, run_id: str, event: Event) -> None:
        self.publish_many(run_id, (event,))

    def publish_many(self, run_id: str, events: Iterable[Event], *, touch: int | None = None) -> None:
        """The same stream entries as ``publish`` of each event in order (and the ``touch`` first
        unless None), in one script call: one round trip for all, and the events contiguous.
        Never raises for Redis: what cannot be published is counted, and the run's next published
        events start with a gap saying how many were missed."""
        import redis

        fields = [part for event in events for part in encode_event(event)]
        if touch is None and not fields:
            return
        if self._unpublished.skipping():
            self._unpublished.add(run_id, len(fields) // 2)
            return
        own, others = self._unpublished.take(run_id)
        # This run's publish first (the request's own), then the gaps of runs that missed events
        # and have published nothing since.
        calls = [(run_id, [*(encode_event(Gap.unpublished(own)) if own else ()), *fields], touch, own + len(fields) // 2)]
        calls += [(other, list(encode_event(Gap.unpublished(n))), None, n) for other, n in others.items()]
        for i, (run, args, touched, _) in enumerate(calls):
            try:
                self._publish(keys=[self._key(run), "actuator:last_seen"],
                              args=[self._keep, run, "" if touched is None else time.time(), *args])
            except redis.RedisError as exc:
                for later_run, _, _, later_count in calls[i:]:
                    self._unpublished.add(later_run, later_count)
                self._unpublished.failed(exc)
                return
        self._unpublished.recovered()

    def follow(self, run_id: str, after: EventId | None = None) -> AsyncGenerator[LiveEvent, None]:
        if self._hub is None:  # built on first use, on the serving event loop
            self._hub = _RedisHub(self._url)
        return self._hub.follow(self._key(run_id), after)

    def close(self) -> None:
        self._r.close()
        self._pub.close()

    async def aclose(self) -> None:
        if self._hub is not None:
            await self._hub.aclose()
            self._hub = None


# Stream replies as these clients get them (no decode_responses, RESP2). redis-py types every
# reply for either setting (bytes | str | None ...), hence the casts where they are read.
_Entries = list[tuple[bytes, dict[bytes, bytes]]]
_ReadReply = list[tuple[bytes, _Entries]] | None


def _event_id(raw: bytes) -> EventId:
    epoch, _, n = raw.partition(b"-")
    return EventId(int(epoch), int(n))


def _entry(eid: bytes, fields: dict[bytes, bytes]) -> LiveEvent:
    return LiveEvent(_event_id(eid), fields[b"k"].decode(), fields[b"e"].decode())


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

    async def read(self, after: EventId) -> list[LiveEvent]:
        entries = cast(_Entries, await self.hub.client.xrange(self.key, min=f"({after}", max="+", count=_CHUNK))
        return [_entry(eid, f) for eid, f in entries]

    async def last_id(self) -> EventId | None:
        last = cast(_Entries, await self.hub.client.xrevrange(self.key, count=1))
        return _event_id(last[0][0]) if last else None

    async def wait(self, cursor: EventId) -> list[LiveEvent]:
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
        first = batch[0].id
        if first.epoch != cursor.epoch or first.n > cursor.n + 1:
            # A jump: trimmed, we fell behind, or a new epoch; the stream says which (an epoch
            # sorting below ours is not after our cursor: then the batch is all there is).
            return await self.read(cursor) or batch
        return batch


class _RedisHub:
    """One worker's followers of every run share one blocking ``XREAD`` on a connection of its
    own; each entry is decoded once and handed to every follower of its run. A follower reads
    by itself only while catching up. A run followed for the first time wakes the shared read
    (one entry on this worker's wake stream) so the read re-arms with it.

    A new epoch's ids sort after the old ones (Redis's clock), so the read sees a recreated stream
    by itself. A clock set back between two epochs would hide one below the read's cursor: every
    ``_BLOCK_MS`` the read compares each stream's last id with its cursor (one script call for
    all runs) and, for a stream now below it, hands on what it keeps."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # Followers' own reads are retried once: a pooled connection to a Redis that has since
        # restarted fails on first use, and a read is safe to repeat (a restart shows in the epoch).
        self.client = aredis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0,
                                            retry=Retry(NoBackoff(), 1))
        # No silent retry of the shared read: a failure ends the streams, and their clients
        # reconnect with Last-Event-ID (told of a restart by its epoch) instead of waiting on a
        # Redis that may stay away.
        self._reader = aredis.Redis.from_url(url, socket_timeout=_BLOCK_MS / 1000 + 5.0, socket_connect_timeout=2.0,
                                             single_connection_client=True, retry=Retry(NoBackoff(), 0))
        self._last_ids = self._reader.register_script(_LAST_IDS)
        self._followers: dict[str, set[_RedisFollower]] = {}
        self._cursors: dict[str, EventId] = {}  # run stream -> last id the shared read has handed on
        self._wake = f"actuator:wake:{uuid.uuid4().hex}"
        self._wake_seen = b"0-0"
        self._woken = False  # a wake is on its way and the read has not re-armed since
        self._task: asyncio.Task[None] | None = None

    async def follow(self, key: str, after: EventId | None) -> AsyncGenerator[LiveEvent, None]:
        follower = _RedisFollower(self, key)
        try:
            async for ev in _follow(follower, after):
                yield ev
        finally:
            self._followers.get(key, set()).discard(follower)

    async def register(self, follower: _RedisFollower, cursor: EventId) -> EventId:
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
        loop = asyncio.get_running_loop()
        next_check = loop.time() + _BLOCK_MS / 1000
        while True:
            for key in [k for k, f in self._followers.items() if not f]:
                del self._followers[key]
                self._cursors.pop(key, None)
            if not self._followers:
                return
            self._woken = False
            streams: dict[Any, Any] = {self._wake: self._wake_seen}
            streams.update((k, str(c)) for k, c in self._cursors.items())
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
            if loop.time() >= next_check:
                next_check = loop.time() + _BLOCK_MS / 1000
                try:
                    await self._rewind_sunken()
                except Exception as exc:  # noqa: BLE001 - as a failed read
                    self._fail(exc)
                    return

    async def _rewind_sunken(self) -> None:
        """A stream whose last id is below the read's cursor was recreated in an epoch that sorts
        lower: read it from its start (the followers see the epoch change and say so)."""
        keys = list(self._cursors)
        last_ids = cast(list[bytes | None], await self._last_ids(keys=keys)) if keys else []
        for key, last in zip(keys, last_ids):
            if last is not None and _event_id(last) < self._cursors[key]:
                self._cursors[key] = ORIGIN

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


def make_live(redis_url: str | None, *, publish_timeout: float = 0.5,
              on_unpublished: Callable[[int], None] | None = None) -> LiveState:
    """Redis live state when a URL is given (``publish_timeout``: seconds a publish may wait for
    it; ``on_unpublished(n)``: told of every ``n`` events it could not publish), else in-process."""
    if redis_url:
        return RedisLive(redis_url, publish_timeout=publish_timeout, on_unpublished=on_unpublished)
    return MemoryLive()
