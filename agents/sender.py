"""The background sender: training hands observations over and never waits on the network.

One daemon thread owns the HTTP client. ``submit`` is a non-blocking queue put; the thread
batches what is queued, registers the run first if that has not happened yet, posts, and puts
each :class:`IngestResult` in an inbox the callback drains at the next step boundary.

Outage: observations stay buffered (bounded: the oldest are dropped past ``max_buffer``, and
counted), retries back off exponentially up to ``max_backoff``, and one warning is logged per
outage. Sequence numbers are assigned by the caller, so redelivery after an outage is
idempotent on the service side.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from actuator._exceptions import RequestRejected, ServiceUnavailable
from actuator.client import ActuatorClient
from actuator.schemas import DecisionAck, IngestResult, ObservationBatch, ObservationCreate

__all__ = ["BackgroundSender", "SenderStats"]

log = logging.getLogger("actuator.agents")


@dataclass
class SenderStats:
    submitted: int = 0
    sent: int = 0
    dropped: int = 0
    failures: int = 0
    outages: int = 0
    last_error: str | None = None
    connected: bool = False
    disabled_reason: str | None = None
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=256))


class BackgroundSender:
    """Deliver observations for one run from a background thread.

    ``register`` is a callable run once in the thread before the first post (it returns
    ``(run_id, token)``); pass ``run_id``/``token`` instead when the run is registered already.
    """

    def __init__(
        self,
        client: ActuatorClient,
        *,
        run_id: str | None = None,
        token: str | None = None,
        register: Callable[[], tuple[str, str]] | None = None,
        batch_size: int = 64,
        max_buffer: int = 10_000,
        initial_backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        if run_id is None and register is None:
            raise ValueError("BackgroundSender needs run_id/token or a register callable")
        self.client = client
        self.run_id, self.token = run_id, token
        self._register = register
        self.batch_size = batch_size
        self.max_buffer = max_buffer
        self.initial_backoff, self.max_backoff = initial_backoff, max_backoff
        self.last_decision = 0  # highest decision number applied; written by the callback
        # Highest decision number the service has answered (in the inbox, so applied at the next
        # step boundary): asked from here on, so a capped answer's rest comes next, not its start.
        self._received = 0
        self.stats = SenderStats()
        # After a batch is refused (4xx), its observations go one per request, so that only the
        # ones the service refuses are dropped, not the good ones batched with them.
        self._isolate = 0
        self._queue: queue.SimpleQueue[ObservationCreate] = queue.SimpleQueue()
        self._pending: deque[ObservationCreate] = deque()
        # Acknowledgements of decisions (applied or set aside), sent with the next request. With
        # no observation left to send they ride on the last one delivered (a duplicate the
        # service ignores), so the last decisions of a run are acknowledged before it ends.
        self._acks: deque[DecisionAck] = deque()
        self._last_sent: ObservationCreate | None = None
        self._inbox: queue.SimpleQueue[IngestResult] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="actuator-sender", daemon=True)
        self._thread.start()

    # -- training side (never blocks) ----------------------------------------------------------
    def submit(self, obs: ObservationCreate) -> None:
        with self._lock:  # so the thread never marks itself idle between the clear and the put
            self.stats.submitted += 1
            self._idle.clear()
            self._queue.put(obs)
        self._wake.set()

    def acknowledge(self, ack: DecisionAck) -> None:
        """Tell the service what became of a decision (never blocks)."""
        with self._lock:
            self._acks.append(ack)
            while len(self._acks) > self.max_buffer:
                self._acks.popleft()
            self._idle.clear()
        self._wake.set()

    def report_outage(self, exc: Exception) -> None:
        """The caller found the service unreachable (before the first submit): that is this
        outage's one warning, and the thread will not warn again until it has reconnected."""
        self._outage(exc)

    def results(self) -> list[IngestResult]:
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    @property
    def backlog(self) -> int:
        return self._queue.qsize() + len(self._pending)

    def _has_work(self) -> bool:
        return bool(self._pending) or (bool(self._acks) and self._last_sent is not None)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for everything submitted to be delivered (or given up)."""
        self._wake.set()
        return self._idle.wait(timeout)

    def close(self, timeout: float = 5.0) -> bool:
        delivered = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=1.0)
        return delivered

    # -- the thread -------------------------------------------------------------------------
    def _drain_queue(self) -> None:
        while True:
            try:
                self._pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        overflow = len(self._pending) - self.max_buffer
        if overflow > 0:
            for _ in range(overflow):
                self._pending.popleft()
            self.stats.dropped += overflow

    def _loop(self) -> None:
        backoff = self.initial_backoff
        while not self._stop.is_set():
            with self._lock:
                self._drain_queue()
                if self.stats.disabled_reason is not None:
                    self._pending.clear()
                    self._acks.clear()
                if not self._has_work():
                    self._idle.set()
            if not self._has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self._send_once()
                backoff = self.initial_backoff
            except ServiceUnavailable as exc:
                self._outage(exc)
                # Jittered exponential backoff; a flush/close wakes us early but does not skip it.
                self._stop.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self.max_backoff)
            except RequestRejected as exc:
                self._rejected(exc)
            except Exception as exc:  # noqa: BLE001 - the sender thread must never die
                self.stats.failures += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("actuator sender: unexpected error; dropping the batch")
                for _ in range(min(self.batch_size, len(self._pending))):
                    self._pending.popleft()

    def _send_once(self) -> None:
        if self.run_id is None:
            assert self._register is not None
            try:
                self.run_id, self.token = self._register()
            except RequestRejected as exc:
                # A bad policy or knob spec: no retry can fix it. Training goes on, uncontrolled.
                self.stats.disabled_reason = f"registration refused: {exc}"
                log.error("actuator: the service refused to register this run (%s); training continues "
                          "WITHOUT control", exc)
                self._pending.clear()
                return
        size = 1 if self._isolate else min(self.batch_size, len(self._pending))
        batch = [self._pending[i] for i in range(size)]
        if not batch:  # acknowledgements only: they ride on the last observation delivered
            assert self._last_sent is not None
            batch, size = [self._last_sent], 0
        with self._lock:
            acks = list(self._acks)[:1000]
        start = time.perf_counter()
        try:
            result = self._post(batch, acks)
        except RequestRejected as exc:
            if not acks or exc.status_code != 422 or "applied" not in str(exc):
                raise
            # The service refused an acknowledgement (it should not: the agent acknowledges only
            # decisions it received). Drop them, never the observations they came with.
            log.warning("actuator: the service refused decision acknowledgements (%s); they are dropped", exc)
            self._drop_acks(len(acks))
            return
        self.stats.latencies.append(time.perf_counter() - start)
        self._drop_acks(len(acks))
        self._last_sent = batch[-1]
        for _ in range(size):
            self._pending.popleft()
        self._isolate = max(0, self._isolate - size)
        self.stats.sent += size
        if not self.stats.connected:
            if self.stats.outages:
                log.warning("actuator: controller reachable again; %d buffered observations delivered", size)
            self.stats.connected = True
        self._deliver(result)
        while result.more_decisions and result.decisions and not self._stop.is_set():
            # The answer stopped at the service's cap on decisions: ask for the rest now rather
            # than one page per observation. The batch's last observation again is a duplicate
            # (stored once, idempotent on seq); the answer carries the decisions after ours.
            try:
                result = self._post(batch[-1:])
            except RequestRejected as exc:
                if exc.status_code in (401, 403, 404):
                    raise  # the run is gone or the token wrong: _rejected turns control off
                log.warning("actuator: asking for the rest of the decisions was refused (%s); they come with "
                            "the next observation", exc)
                return  # not the next observation's fault: nothing queued is dropped
            self._deliver(result)

    def _drop_acks(self, n: int) -> None:
        """Forget the ``n`` oldest acknowledgements (sent, or refused)."""
        with self._lock:
            for _ in range(min(n, len(self._acks))):
                self._acks.popleft()

    def _post(self, batch: list[ObservationCreate], acks: list[DecisionAck] | None = None) -> IngestResult:
        last = max(self.last_decision, self._received)
        return self.client.post_observations(
            self.run_id, ObservationBatch(observations=batch, last_decision=last, applied=acks or []),
            token=self.token)

    def _deliver(self, result: IngestResult) -> None:
        if result.decisions:
            self._received = max(self._received, max(d.number for d in result.decisions))
        self._inbox.put(result)

    def _outage(self, exc: Exception) -> None:
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        if self.stats.connected or self.stats.outages == 0:
            self.stats.outages += 1
            log.warning("actuator: controller unreachable (%s); training continues with the last knob "
                        "values, observations are buffered and retried", exc)
        self.stats.connected = False

    def _rejected(self, exc: RequestRejected) -> None:
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        if exc.status_code in (401, 403, 404):
            # The run is gone or the token is wrong: nothing we send will ever be accepted.
            self.stats.disabled_reason = str(exc)
            log.error("actuator: the service refuses this run (%s); control is off for the rest of "
                      "training", exc)
        elif not self._isolate and min(self.batch_size, len(self._pending)) > 1:
            self._isolate = min(self.batch_size, len(self._pending))
            log.warning("actuator: the service refused a batch (%s); sending its %d observations one by one",
                        exc, self._isolate)
        else:
            log.error("actuator: the service rejected an observation (%s); it is dropped", exc)
            self._pending.popleft()
            self._isolate = max(0, self._isolate - 1)
