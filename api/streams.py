"""Live event streams (GET /v1/runs/{id}/stream): how many a worker holds open, and how one client's
pace is kept apart from the run's.

* Caps: at most ``stream_max_per_run`` streams of one run and ``stream_max_per_client`` streams of
  one client address are open at once in a worker process; past either, 429 with Retry-After
  before the stream starts. Fan-out costs the serving event loop per stream and per event: the
  run's own agent shares that loop.
* A bounded send queue: a task follows the run into a queue of at most ``stream_queue`` events,
  and the response sends from the queue at the client's pace (publishing never waits on a stream:
  the live state keeps the events, and a follower reads them from its cursor). A client that takes
  nothing from a full queue for ``stream_drop_after`` seconds is behind: its follower stops, it is
  sent what was queued and then a ``gap`` event (reason ``behind``, naming the last event it was
  sent), and its stream ends; it reconnects with ``Last-Event-ID``. A client that does not read
  even that within another ``stream_drop_after`` seconds has its connection cut
  (``scope["actuator.abort"]``, set by the outermost middleware, see api/app.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from fastapi import Request
from fastapi.sse import ServerSentEvent

from actuator.live import EventId, LiveEvent, encode_event
from actuator.schemas import Gap

from .deps import Services
from .errors import ApiError
from actuator._exceptions import ActuatorError

__all__ = ["StreamSlots", "stream_events", "take_stream_slot", "RESPONSES_429"]

log = logging.getLogger("actuator.api")

RETRY_AFTER_S = 10  # a refused stream's Retry-After: streams end at their client's pace, not ours
RESPONSES_429: dict[int | str, dict[str, Any]] = {429: {
    "description": "Too many live streams of this run or of this client (ACTUATOR_STREAM_MAX_PER_RUN, "
                   "ACTUATOR_STREAM_MAX_PER_CLIENT): retry after Retry-After seconds",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorPublic"}}}}}


class StreamSlots:
    """Streams open in this process, per run and per client address."""

    def __init__(self, per_run: int, per_client: int) -> None:
        self.per_run, self.per_client = per_run, per_client
        self._runs: dict[str, int] = {}
        self._clients: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, run_id: str, client: str) -> str | None:
        """Count one more stream; or the cap it would pass (``"run"`` or ``"client"``), counting nothing."""
        with self._lock:
            if self._runs.get(run_id, 0) >= self.per_run:
                return "run"
            if self._clients.get(client, 0) >= self.per_client:
                return "client"
            self._runs[run_id] = self._runs.get(run_id, 0) + 1
            self._clients[client] = self._clients.get(client, 0) + 1
            return None

    def give(self, run_id: str, client: str) -> None:
        with self._lock:
            for counts, key in ((self._runs, run_id), (self._clients, client)):
                left = counts.get(key, 0) - 1
                if left > 0:
                    counts[key] = left
                else:
                    counts.pop(key, None)


def _slots(request: Request, services: Services) -> StreamSlots:
    slots: StreamSlots | None = getattr(request.app.state, "stream_slots", None)
    if slots is None:
        slots = StreamSlots(services.settings.stream_max_per_run, services.settings.stream_max_per_client)
        request.app.state.stream_slots = slots
    return slots


def take_stream_slot(run_id: str, request: Request, services: Services) -> Callable[[], None]:
    """A slot for a stream, or 429 naming the cap when none is free. Returns what gives it back
    (call it once the stream's response has ended)."""
    slots = _slots(request, services)
    client = request.client.host if request.client else "-"
    cap = slots.take(run_id, client)
    if cap is not None:
        services.metrics.streams_refused.labels(cap).inc()
        setting, limit, whose = (("ACTUATOR_STREAM_MAX_PER_RUN", slots.per_run, f"run {run_id}") if cap == "run" else
                                 ("ACTUATOR_STREAM_MAX_PER_CLIENT", slots.per_client, f"client {client}"))
        raise ApiError(429, f"{whose} already has {limit} live streams open in this worker ({setting}); close one "
                       f"or retry after {RETRY_AFTER_S} s", headers={"Retry-After": str(RETRY_AFTER_S)})
    return lambda: slots.give(run_id, client)


class _Behind(ActuatorError):
    """The client fell ``stream_queue`` events behind."""


class _Relay:
    """A task that follows the run into a queue of at most ``size`` events, apart from the sending.
    While the queue is full the follower waits (the live state keeps the events, not this queue);
    a client that takes none of them for ``patience`` seconds is behind: the follower stops."""

    def __init__(self, events: AsyncGenerator[LiveEvent, None], size: int, patience: float,
                 on_behind: Callable[[], None]) -> None:
        self.queue: deque[LiveEvent] = deque()
        self.size, self.patience, self.on_behind = size, patience, on_behind
        self.behind = False
        self.error: BaseException | None = None
        self.ended = False
        self._ready = asyncio.Event()
        self._taken = asyncio.Event()
        self._task = asyncio.create_task(self._pump(events), name="actuator-stream-relay")

    async def _pump(self, events: AsyncGenerator[LiveEvent, None]) -> None:
        try:
            async for ev in events:
                while len(self.queue) >= self.size:
                    self._taken.clear()
                    try:
                        await asyncio.wait_for(self._taken.wait(), self.patience)
                    except TimeoutError:
                        self.behind = True
                        self.on_behind()
                        return
                self.queue.append(ev)
                self._ready.set()
        except Exception as exc:  # noqa: BLE001 - handed to the sender, which ends the stream
            self.error = exc
        finally:
            self.ended = True
            self._ready.set()
            await events.aclose()

    async def next(self, timeout: float) -> LiveEvent | None:
        """The next queued event; None when none comes within ``timeout`` seconds. Raises the
        follower's error, :class:`_Behind`, or StopAsyncIteration once the queue is drained."""
        while not self.queue:
            if self.ended:
                if self.error is not None:
                    raise self.error
                raise _Behind() if self.behind else StopAsyncIteration()
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        self._taken.set()
        return self.queue.popleft()

    async def aclose(self) -> None:
        if not self._task.done():
            self._task.cancel()
        await asyncio.wait({self._task})  # cancelled and finished (its error, if any, is not ours to raise)


def _cut_later(request: Request, seconds: float) -> None:
    """Cut the connection in ``seconds`` unless its response has ended by then (a client that
    stopped reading never takes its gap: nothing else would free its connection)."""
    abort: Callable[[], None] | None = request.scope.get("actuator.abort")
    if abort is not None:
        asyncio.get_running_loop().call_later(seconds, abort)


async def stream_events(request: Request, services: Services, run_id: str, after: EventId | None,
                        max_seconds: float) -> AsyncIterator[ServerSentEvent]:
    """The stream's Server-Sent Events: ``retry``, then the run's events (keep-alive comments while
    it is quiet) until ``max_seconds``, the live state fails, or the client falls behind."""
    settings = services.settings
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    yield ServerSentEvent(retry=2000)

    def behind() -> None:
        services.metrics.streams_dropped.inc()
        _cut_later(request, settings.stream_drop_after)

    relay = _Relay(services.live.follow(run_id, after), settings.stream_queue, settings.stream_drop_after, behind)
    last_sent: EventId | None = None
    try:
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                ev = await relay.next(min(settings.stream_keepalive, left))
            except StopAsyncIteration:
                return
            except _Behind:
                kind, data = encode_event(Gap.behind(str(last_sent) if last_sent is not None else None))
                log.info("a stream of run %s took none of its %d queued events for %g s: sent a gap and ended it",
                         run_id, settings.stream_queue, settings.stream_drop_after)
                yield ServerSentEvent(event=kind, raw_data=data)  # no id: a reconnect resumes after last_sent
                return
            except Exception as exc:  # noqa: BLE001 - the response has started: no 503 possible now
                # Live state unreachable: end the stream cleanly; the client reconnects after the
                # retry interval sent above (instead of a traceback and a cut connection).
                if type(exc).__module__.startswith("redis"):
                    services.metrics.backend_errors.labels("redis").inc()
                log.warning("live events unavailable for a stream: %s", type(exc).__name__)
                return
            if ev is None:
                if loop.time() < deadline:
                    yield ServerSentEvent(comment="ping")
                continue
            yield ServerSentEvent(id=str(ev.id), event=ev.kind, raw_data=ev.data)
            last_sent = ev.id
    finally:
        await relay.aclose()

