"""The worker processes that do what costs more than a read: a policy simulation, a validation, a
tune's plant fit, a report's plot. In a serving process that work would hold the GIL, and every
other request (the ingest of every run) would wait for it between switches; here it runs in
processes of its own, off the serving workers, and every use of them is bounded:

* **processes**: at most ``ACTUATOR_WORKER_PROCESSES`` per serving process, started on first use
  by spawn (the service's threads, locks and connections are not forked), one job at a time each,
  at a lower CPU priority (``ACTUATOR_WORKER_NICE``): on busy cores the serving processes go first;
* **concurrency per kind of work**: at most ``caps[kind]`` requests of one kind in flight (running
  or waiting for a process) per serving process; one more is answered ``429`` with
  ``Retry-After`` at once;
* **waiting**: a job that finds no free process within ``wait`` seconds is answered ``503`` with
  ``Retry-After``;
* **time**: a job that runs longer than ``timeout`` seconds has its process ended (``503``);
* **abandoned requests**: when the client disconnects, its job's process is ended at once (the
  work stops and its memory is freed), a new one is started for the next job;
* **no orphans**: the processes end with the service (``close()`` at shutdown) and, if the
  service is killed (SIGKILL, out of memory), on their own within a second: each watches its
  parent and exits when it is gone.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from .errors import ApiError
from .jobs import serve
from actuator._exceptions import ActuatorError

__all__ = ["WorkerPool", "Abandoned"]

log = logging.getLogger("actuator.api")

T = TypeVar("T")

# How often a waiting job checks its client and its process (s).
_POLL = 0.1


class Abandoned(ActuatorError):
    """The client went away: the job was stopped and its process ended."""


class _Worker:
    def __init__(self, nice: int = 0, plugins: tuple[str, ...] = ()) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, os.getpid(), nice, plugins), name="actuator-worker", daemon=True)
        self.proc.start()
        child.close()  # the parent keeps only its end: the worker sees EOF when the parent goes

    def alive(self) -> bool:
        return self.proc.is_alive()

    def end(self, grace: float = 0.0) -> None:
        """Stop the process: a polite ``None`` first when ``grace`` > 0, then SIGTERM, SIGKILL."""
        if grace > 0 and self.proc.is_alive():
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.proc.join(grace)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(1.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(1.0)
        self.conn.close()


class WorkerPool:
    """Worker processes shared by the kinds of costly work (see the module's doc). ``caps``:
    kind → most requests of that kind in flight; ``setting`` names each cap's setting in answers."""

    def __init__(self, processes: int = 1, caps: dict[str, int] | None = None, *, wait: float = 30.0,
                 timeout: float = 300.0, settings: dict[str, str] | None = None, nice: int = 0,
                 plugins: tuple[str, ...] = ()) -> None:
        self.processes, self.wait, self.timeout, self.nice = processes, wait, timeout, nice
        self.plugins = plugins  # imported by each worker process, as by the service (ACTUATOR_PLUGINS)
        self.caps = dict(caps or {})
        self.settings = dict(settings or {})
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = {}
        self._free = threading.BoundedSemaphore(processes)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Any) -> WorkerPool:
        caps = {"simulate": settings.simulate_concurrency, "validate": settings.validate_concurrency,
                "render": settings.render_concurrency, "tune": settings.tune_concurrency}
        names = {k: f"ACTUATOR_{k.upper()}_CONCURRENCY" for k in caps}
        return cls(settings.worker_processes, caps, wait=settings.worker_wait, timeout=settings.worker_timeout,
                   settings=names, nice=settings.worker_nice, plugins=tuple(settings.plugins))

    # -- admission -----------------------------------------------------------------------------
    def _admit(self, kind: str) -> None:
        cap = self.caps.get(kind)
        with self._lock:
            n = self._inflight.get(kind, 0)
            if cap is not None and n >= cap:
                setting = self.settings.get(kind, "")
                raise ApiError(429, f"{cap} {kind} requests are already in progress in this process, the most "
                               f"allowed ({setting}); retry after a few seconds",
                               [{"loc": "request", "msg": f"at most {cap} concurrent {kind} requests ({setting})",
                                 "type": "too_many_concurrent"}], headers={"Retry-After": "5"})
            self._inflight[kind] = n + 1

    def _leave(self, kind: str) -> None:
        with self._lock:
            self._inflight[kind] -= 1

    def in_flight(self, kind: str) -> int:
        with self._lock:
            return self._inflight.get(kind, 0)

    # -- processes -----------------------------------------------------------------------------
    def _take(self, cancelled: threading.Event | None) -> _Worker:
        deadline = time.monotonic() + self.wait
        while not self._free.acquire(timeout=_POLL):
            if cancelled is not None and cancelled.is_set():
                raise Abandoned()
            if time.monotonic() > deadline:
                raise ApiError(503, f"every worker process ({self.processes}, ACTUATOR_WORKER_PROCESSES) stayed "
                               f"busy for {self.wait:g} s (ACTUATOR_WORKER_WAIT); retry in a few seconds",
                               headers={"Retry-After": "5"})
        with self._lock:
            if self._closed:
                self._free.release()
                raise ApiError(503, "the service is stopping", headers={"Retry-After": "5"})
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    break
                worker.end()
            else:
                worker = None
        try:
            worker = worker or _Worker(self.nice, self.plugins)
        except BaseException:
            self._free.release()
            raise
        with self._lock:
            self._busy.add(worker)
        return worker

    def _give_back(self, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            keep = healthy and not self._closed and worker.alive()
            if keep:
                self._idle.append(worker)
        if not keep:
            worker.end()
        self._free.release()

    def _run(self, kind: str, fn: Callable[..., T], args: Any, kwargs: Any, cancelled: threading.Event | None) -> T:
        worker = self._take(cancelled)
        healthy = False
        try:
            worker.conn.send((fn, args, kwargs))
            deadline = time.monotonic() + self.timeout
            while not worker.conn.poll(_POLL):
                if cancelled is not None and cancelled.is_set():
                    log.info("a %s request's client went away: its worker process is ended", kind)
                    raise Abandoned()
                if time.monotonic() > deadline:
                    raise ApiError(503, f"the {kind} work ran past {self.timeout:g} s (ACTUATOR_WORKER_TIMEOUT) "
                                   "and was stopped", headers={"Retry-After": "5"})
                if not worker.alive():
                    break
            try:
                ok, value = worker.conn.recv()
            except (EOFError, OSError) as exc:  # the worker died (killed, out of memory)
                raise ApiError(503, f"the worker process doing the {kind} work ended; retry",
                               headers={"Retry-After": "1"}) from exc
            healthy = True
        finally:
            self._give_back(worker, healthy)
        if not ok:
            raise value
        return value

    @contextlib.contextmanager
    def turn(self, kind: str) -> Iterator[None]:
        """Hold one of ``kind``'s turns (429 when they are all taken): around a request's reads
        before its job, so that a refused request costs nothing (then ``call(..., admitted=True)``)."""
        self._admit(kind)
        try:
            yield
        finally:
            self._leave(kind)

    async def call(self, request: Request, kind: str, fn: Callable[..., T], *args: Any, admitted: bool = False,
                   **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker process (arguments, result and exceptions pickled;
        ``fn`` importable by name), waited for in a thread while ``request``'s client is watched: a
        client that disconnects stops the job (its process is ended). ``admitted``: the caller
        holds ``kind``'s :meth:`turn` already."""
        if not admitted:
            with self.turn(kind):
                return await self.call(request, kind, fn, *args, admitted=True, **kwargs)
        cancelled = threading.Event()

        async def watch() -> None:
            while not cancelled.is_set():
                if await request.is_disconnected():
                    cancelled.set()
                    return
                await anyio.sleep(_POLL * 2)

        outcome: list[tuple[bool, Any]] = []

        def job() -> None:  # its exception is raised below, not in the task group (a group of one)
            try:
                outcome.append((True, self._run(kind, fn, args, kwargs, cancelled)))
            except BaseException as exc:  # noqa: BLE001
                outcome.append((False, exc))
            finally:
                cancelled.set()  # ends the watcher

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.to_thread.run_sync(job)
        ok, value = outcome[0]
        if ok:
            return value
        if isinstance(value, Abandoned):
            raise ApiError(503, "the client went away; the work was stopped") from None
        raise value

    # -- shutdown ------------------------------------------------------------------------------
    def close(self) -> None:
        """End every worker process (at the service's shutdown)."""
        with self._lock:
            self._closed = True
            workers, self._idle = [*self._idle, *self._busy], []
        for w in workers:
            w.end(grace=1.0)

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in (*self._idle, *self._busy) if w.proc.pid is not None]
