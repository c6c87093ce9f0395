"""Live state: when each run was last heard from, and event fan-out for live streams.

Two implementations with one interface: :class:`MemoryLive` (embedded default, one process) and
:class:`RedisLive` (production: shared by every worker and replica). Durable state is never kept
here; losing Redis loses nothing but liveness timestamps and in-flight stream events.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import Any, Protocol

__all__ = ["LiveState", "MemoryLive", "RedisLive", "make_live"]


class LiveState(Protocol):
    def ping(self) -> None: ...
    def touch(self, run_id: str, step: int) -> None: ...
    def last_seen(self, run_id: str) -> float | None: ...
    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...
    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None: ...
    def recent(self, run_id: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]: ...
    def close(self) -> None: ...


class MemoryLive:
    """In-process live state; events kept in a bounded ring per run."""

    def __init__(self, keep: int = 1000) -> None:
        self._seen: dict[str, float] = {}
        self._events: dict[str, deque[tuple[int, dict[str, Any]]]] = defaultdict(lambda: deque(maxlen=keep))
        self._ids: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()

    def ping(self) -> None:
        return None

    def touch(self, run_id: str, step: int) -> None:
        self._seen[run_id] = time.time()

    def last_seen(self, run_id: str) -> float | None:
        return self._seen.get(run_id)

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        with self._lock:
            self._ids[run_id] += 1
            self._events[run_id].append((self._ids[run_id], event))

    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None:
        """``publish`` of each event, in order (and ``touch(run_id, touch)`` first unless None)."""
        if touch is not None:
            self.touch(run_id, touch)
        with self._lock:
            ring = self._events[run_id]
            for event in events:
                self._ids[run_id] += 1
                ring.append((self._ids[run_id], event))

    def recent(self, run_id: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        with self._lock:
            return [(i, e) for i, e in self._events.get(run_id, ()) if i > after]

    def close(self) -> None:
        return None


class RedisLive:
    """Redis-backed live state: a hash of last-seen times and a capped stream per run."""

    def __init__(self, url: str, keep: int = 1000) -> None:
        import redis

        self._r = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._keep = keep

    def ping(self) -> None:
        self._r.ping()

    def touch(self, run_id: str, step: int) -> None:
        self._r.hset("actuator:last_seen", run_id, time.time())

    def last_seen(self, run_id: str) -> float | None:
        v = self._r.hget("actuator:last_seen", run_id)
        return float(v) if v is not None else None

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        self._r.xadd(f"actuator:events:{run_id}", {"e": json.dumps(event, default=str)},
                     maxlen=self._keep, approximate=True)

    def publish_many(self, run_id: str, events: Iterable[dict[str, Any]], *, touch: int | None = None) -> None:
        """The same stream entries as ``publish`` of each event in order (and the ``touch`` first
        unless None), sent as one pipeline: one round trip and one connection checkout for all.
        Not a transaction: like separate calls, another writer's entries may land in between."""
        key = f"actuator:events:{run_id}"
        pipe = self._r.pipeline(transaction=False)
        if touch is not None:
            pipe.hset("actuator:last_seen", run_id, time.time())
        for event in events:
            pipe.xadd(key, {"e": json.dumps(event, default=str)}, maxlen=self._keep, approximate=True)
        if len(pipe):
            pipe.execute()

    def recent(self, run_id: str, after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for i, (eid, fields) in enumerate(self._r.xrange(f"actuator:events:{run_id}"), start=1):
            if i > after:
                out.append((i, json.loads(fields[b"e"])))
        return out

    def close(self) -> None:
        self._r.close()


def make_live(redis_url: str | None) -> LiveState:
    return RedisLive(redis_url) if redis_url else MemoryLive()
