"""The background sender: training hands observations over and never waits on the network.

One daemon thread owns the HTTP client. ``submit`` is a non-blocking append to a bounded buffer;
the thread batches what is buffered, registers the run first if that has not happened yet, posts,
and puts each :class:`IngestResult` in an inbox the callback drains at the next step boundary.

Outage (no answer, an error status, an answer that cannot be read or is not complete within the
client's timeout): observations stay buffered, retries back off exponentially up to
``max_backoff``, and one warning is logged per outage. The buffer holds ``max_buffer``
observations at all times, a request hanging or not: past it the oldest are dropped, counted in
``stats.dropped`` and warned about (when dropping starts, and with the total when it stops).
Sequence numbers are assigned by the caller, so redelivery after an outage is idempotent on the
service side. An answer larger than the client's ``max_answer_bytes`` is abandoned unread: an outage
like any other, also counted in ``stats.oversize``.

Decision numbers belong to the service's history (its epoch). When that history changes under the
agent (a store restored from a backup numbers decisions again from its restored count), the
service says where the agent's decisions resume (``IngestResult.resumed_after``), or an older one
refuses an acknowledgement of a decision it no longer has: the sender then starts a new
*generation*, puts a :class:`Resync` in the inbox before the answer, and drops acknowledgements of
the generations before (they name decisions of the other history).
"""

from __future__ import annotations

import logging
import queue
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice

from actuator._exceptions import RequestRejected, ServiceUnavailable
from actuator.client import ActuatorClient
from actuator.schemas import MAX_INT, DecisionAck, IngestResult, ObservationBatch, ObservationCreate

__all__ = ["BackgroundSender", "FOLLOW_UPS", "Resync", "SenderStats"]

log = logging.getLogger("actuator.agents")

# Most requests for the rest of the decisions after one delivered batch, when answers stop at the
# service's cap: a controller that always says "more" costs a bounded number of requests, and
# what is left comes with the next batch.
FOLLOW_UPS = 4
# "run ... has no decision 40 (it has 9)": how a service without epochs refuses an acknowledgement of
# a decision its history lost.
_NO_DECISION = re.compile(r"has no decision (\d+) \(it has (\d+)\)")


@dataclass(frozen=True)
class Resync:
    """The service's decision history is not the one the agent followed: decisions from here on
    follow ``after`` (the agent had seen up to ``seen``), numbered in ``epoch``; ``generation``
    counts these changes in this process."""

    generation: int
    after: int
    seen: int
    epoch: str | None
    why: str


@dataclass
class SenderStats:
    """``submitted`` = ``sent`` + ``dropped`` + the backlog."""

    submitted: int = 0
    sent: int = 0
    dropped: int = 0  # given up on: over the buffer's limit, refused by the service, or an agent error
    failures: int = 0
    outages: int = 0
    oversize: int = 0  # answers over the client's max_answer_bytes (each also a failure of an outage)
    resyncs: int = 0  # times the service's decision history changed under the agent
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
        if max_buffer < 1:
            raise ValueError(f"max_buffer: at least 1, got {max_buffer}")
        self.client = client
        self.run_id, self.token = run_id, token
        self._register = register
        self.batch_size = batch_size
        self.max_buffer = max_buffer
        self.initial_backoff, self.max_backoff = initial_backoff, max_backoff
        self.last_decision = 0  # highest decision number applied; written by the callback (note_applied)
        # Highest decision number the service has answered (in the inbox, so applied at the next
        # step boundary): asked from here on, so a capped answer's rest comes next, not its start.
        self._received = 0
        # The service's numbering (its epoch, sent back with each request) and this process's
        # count of changes to it (acknowledgements and applied numbers of an older one are stale).
        self.epoch: str | None = None
        self.generation = 0
        self.stats = SenderStats()
        # After a batch is refused (4xx), its observations go one per request, so that only the
        # ones the service refuses are dropped, not the good ones batched with them.
        self._isolate = 0
        # Observations not delivered yet, oldest first (shared with submit: under _lock). The
        # _in_flight oldest are being posted and are never dropped meanwhile: they may yet arrive.
        self._pending: deque[ObservationCreate] = deque()
        self._in_flight = 0
        # Drops over the limit: how many in all, how many warned about, and the count the current
        # episode of dropping began at (None: none under way).
        self._overflowed = self._overflow_told = 0
        self._overflow_from: int | None = None
        self._stuck_warned = False
        # Acknowledgements of decisions (applied or set aside), sent with the next request. With
        # no observation left to send they ride on the last one delivered (a duplicate the
        # service ignores), so the last decisions of a run are acknowledged before it ends.
        self._acks: deque[tuple[int, DecisionAck]] = deque()  # (generation, acknowledgement)
        self._last_sent: ObservationCreate | None = None
        self._inbox: queue.SimpleQueue[IngestResult | Resync] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="actuator-sender", daemon=True)
        self._thread.start()

    # -- training side (never blocks) ----------------------------------------------------------
    def submit(self, obs: ObservationCreate) -> None:
        with self._lock:  # so the thread never marks itself idle between the clear and the append
            self.stats.submitted += 1
            self._idle.clear()
            self._pending.append(obs)
            # The limit holds while a request hangs too: the thread may not look for a while.
            while len(self._pending) > max(self.max_buffer, self._in_flight):
                del self._pending[self._in_flight]
                self.stats.dropped += 1
                self._overflowed += 1
        self._wake.set()

    def acknowledge(self, ack: DecisionAck, generation: int | None = None) -> None:
        """Tell the service what became of a decision (never blocks). ``generation``: the
        numbering it was received in (default: the current one); one of an older numbering is
        not sent (the service no longer has that decision)."""
        with self._lock:
            self._acks.append((self.generation if generation is None else generation, ack))
            while len(self._acks) > self.max_buffer:
                self._acks.popleft()
            self._idle.clear()
        self._wake.set()

    def report_outage(self, exc: Exception) -> None:
        """The caller found the service unreachable (before the first submit): that is this
        outage's one warning, and the thread will not warn again until it has reconnected."""
        self._outage(exc)

    def note_applied(self, number: int, generation: int) -> None:
        """The callback has applied decisions up to ``number`` of numbering ``generation``."""
        with self._lock:  # not between a resync's new generation and its new numbering
            if generation == self.generation:
                self.last_decision = number

    def answers(self) -> list[IngestResult | Resync]:
        """What came in since the last call, in order: answers, and a :class:`Resync` before the
        first answer of a changed history."""
        out: list[IngestResult | Resync] = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def results(self) -> list[IngestResult]:
        return [a for a in self.answers() if isinstance(a, IngestResult)]

    @property
    def backlog(self) -> int:
        return len(self._pending)

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
        self._warn_overflow(closing=True)
        return delivered

    # -- the thread -------------------------------------------------------------------------
    def _loop(self) -> None:
        backoff = self.initial_backoff
        while not self._stop.is_set():
            with self._lock:
                if self.stats.disabled_reason is not None:
                    self.stats.dropped += len(self._pending)
                    self._pending.clear()
                    self._acks.clear()
                if not self._has_work():
                    self._idle.set()
            self._warn_overflow()
            if not self._has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                self._send_once()
                backoff = self.initial_backoff
            except ServiceUnavailable as exc:
                if isinstance(exc.detail, dict) and "max_answer_bytes" in exc.detail:
                    self.stats.oversize += 1
                self._outage(exc)
                # Jittered exponential backoff; a flush/close wakes us early but does not skip it.
                self._stop.wait(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self.max_backoff)
            except RequestRejected as exc:  # a follow-up refused: the run is gone or the token wrong
                self._disable(exc)
            except Exception as exc:  # noqa: BLE001 - the sender thread must never die
                self.stats.failures += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                with self._lock:
                    n = min(self.batch_size, len(self._pending))
                    for _ in range(n):
                        self._pending.popleft()
                    self.stats.dropped += n
                log.exception("actuator sender: unexpected error; %d observations dropped", n)

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
                return
            if self.stats.outages:  # control was said to be OFF: say as loudly that it is back
                log.warning("actuator: controller reachable: run %s registered, control is ON from here", self.run_id)
            self.stats.connected = True
        with self._lock:
            size = 1 if self._isolate else min(self.batch_size, len(self._pending))
            batch = list(islice(self._pending, size))
            while self._acks and self._acks[0][0] != self.generation:  # of a history the service lost
                self._acks.popleft()
            acks = [ack for _, ack in islice(self._acks, 1000)]
            self._in_flight = size
        if not batch:  # acknowledgements only: they ride on the last observation delivered
            assert self._last_sent is not None
            batch = [self._last_sent]
        start = time.perf_counter()
        done = 0  # how many of the batch leave the buffer (delivered, or refused and dropped)
        try:
            result = self._post(batch, acks)
            done = size
        except RequestRejected as exc:
            done = self._refused(exc, acks, size)
            return
        finally:
            with self._lock:
                for _ in range(done):
                    self._pending.popleft()
                self._in_flight = 0
        self.stats.latencies.append(time.perf_counter() - start)
        self._drop_acks(len(acks))
        self._last_sent = batch[-1]
        self._isolate = max(0, self._isolate - size)
        self.stats.sent += size
        if not self.stats.connected:
            if self.stats.outages:
                log.warning("actuator: controller reachable again; %d buffered observations delivered", size)
            self.stats.connected = True
        advanced = self._deliver(result)
        for _ in range(FOLLOW_UPS):
            if not (result.more_decisions and result.decisions) or self._stop.is_set():
                return
            if not advanced:
                self._warn_stuck()
                return
            # The answer stopped at the service's cap on decisions: ask for the rest now rather
            # than one page per observation. The batch's last observation again is a duplicate
            # (stored once, idempotent on seq); the answer carries the decisions after ours.
            try:
                result = self._post(batch[-1:])
            except RequestRejected as exc:
                if exc.status_code in (401, 403, 404):
                    raise  # the run is gone or the token wrong: _disable turns control off
                log.warning("actuator: asking for the rest of the decisions was refused (%s); they come with "
                            "the next observation", exc)
                return  # not the next observation's fault: nothing buffered is dropped
            advanced = self._deliver(result)

    def _refused(self, exc: RequestRejected, acks: list[DecisionAck], size: int) -> int:
        """The service refused a batch: how many of its oldest observations to drop (0 or 1)."""
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        if acks and exc.status_code == 422 and "applied" in str(exc):
            # The service refused an acknowledgement (it should not: the agent acknowledges only
            # decisions it received). Drop them, never the observations they came with.
            self._drop_acks(len(acks))
            lost = _NO_DECISION.search(str(exc))
            if lost is not None and int(lost.group(2)) < max(self.last_decision, self._received):
                # A service without epochs that lost decisions it had sent (restored from a backup)
                # numbers new ones again from its count: resume after it, or they would be ignored.
                self._resync(int(lost.group(2)), self.epoch, f"it refused an acknowledgement: {exc}")
            else:
                log.warning("actuator: the service refused decision acknowledgements (%s); they are dropped", exc)
            return 0
        if exc.status_code in (401, 403, 404):
            self._disable(exc)
            return 0
        if not self._isolate and size > 1:
            self._isolate = size
            log.warning("actuator: the service refused a batch (%s); sending its %d observations one by one",
                        exc, size)
            return 0
        log.error("actuator: the service rejected an observation (%s); it is dropped", exc)
        self._isolate = max(0, self._isolate - 1)
        if size:
            self.stats.dropped += 1
        return min(size, 1)

    def _disable(self, exc: RequestRejected) -> None:
        """The run is gone or the token is wrong: nothing we send will ever be accepted."""
        self.stats.disabled_reason = str(exc)
        log.error("actuator: the service refuses this run (%s); control is off for the rest of training", exc)

    def _drop_acks(self, n: int) -> None:
        """Forget the ``n`` oldest acknowledgements (sent, or refused)."""
        with self._lock:
            for _ in range(min(n, len(self._acks))):
                self._acks.popleft()

    def _post(self, batch: list[ObservationCreate], acks: list[DecisionAck] | None = None) -> IngestResult:
        # The wire carries decision numbers up to MAX_INT (what the store holds). A controller
        # numbering past it is told MAX_INT and answers again what follows: the callback applies
        # each decision once, by number, whatever its size.
        last = min(max(self.last_decision, self._received), MAX_INT)
        return self.client.post_observations(
            self.run_id, ObservationBatch(observations=batch, last_decision=last, applied=acks or [],
                                          epoch=self.epoch),
            token=self.token)

    def _deliver(self, result: IngestResult) -> bool:
        """Hand an answer to the callback; whether it brought a decision not received before."""
        epoch = getattr(result, "epoch", None)  # None: a service from before epochs
        resumed = getattr(result, "resumed_after", None)
        if resumed is None and epoch is not None and self.epoch is not None and epoch != self.epoch:
            # another numbering without a word of where it resumes: its decisions here are new
            resumed = min((d.number for d in result.decisions), default=1) - 1
        if resumed is not None:
            self._resync(resumed, epoch, "it answered from another history")
        elif epoch is not None:
            self.epoch = epoch
        newest = max((d.number for d in result.decisions), default=0)
        advanced = newest > self._received
        self._received = max(self._received, newest)
        self._inbox.put(result)
        return advanced

    def _resync(self, after: int, epoch: str | None, why: str) -> None:
        """The service's decision history is not the one followed so far: numbering resumes after
        ``after`` (its count when it noticed), in ``epoch``. The callback hears it (a Resync before
        the next answer) and says so loudly."""
        seen = max(self.last_decision, self._received)
        with self._lock:
            self.generation += 1
            self.stats.resyncs += 1
            self.epoch = epoch
            self.last_decision = self._received = max(0, after)
            self._inbox.put(Resync(self.generation, max(0, after), seen, epoch, why))

    def _warn_stuck(self) -> None:
        if not self._stuck_warned:
            self._stuck_warned = True
            log.warning("actuator: the controller says more decisions follow, but its answer brings no decision "
                        "after %d; not asking again until the next observation (said once)", self._received)

    def _warn_overflow(self, closing: bool = False) -> None:
        """One warning when observations start being dropped over the limit, one with the total
        when the backlog has room again (or at close)."""
        with self._lock:
            overflowed, full = self._overflowed, len(self._pending) >= self.max_buffer
        if self._overflow_from is None and overflowed > self._overflow_told:
            self._overflow_from = self._overflow_told
            log.warning("actuator: the backlog reached its limit of %d observations (the controller is unreachable "
                        "or slower than training): the oldest are dropped, %d so far", self.max_buffer,
                        overflowed - self._overflow_from)
        if self._overflow_from is not None and (closing or not full):
            log.warning("actuator: %d observations were dropped while the backlog was full",
                        overflowed - self._overflow_from)
            self._overflow_told, self._overflow_from = overflowed, None

    def _outage(self, exc: Exception) -> None:
        self.stats.failures += 1
        self.stats.last_error = str(exc)
        if self.stats.connected or self.stats.outages == 0:
            self.stats.outages += 1
            if self.run_id is None:
                log.warning("actuator: controller unreachable (%s): control is OFF until it answers; training "
                            "continues uncontrolled and the run is registered as soon as the controller answers",
                            exc)
            else:
                log.warning("actuator: controller unreachable (%s); training continues with the last knob "
                            "values, observations are buffered and retried", exc)
        self.stats.connected = False
