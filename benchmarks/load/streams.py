"""Idle live streams beside ingest: what open SSE streams cost another run's agents.

    python -m benchmarks.load.streams [--streams 500] [--stream-runs 500] [--history 100]
                                      [--agents 10] [--rate 4] [--seconds 20] [--workers 2]
                                      [--idle-seconds 10] [--no-fsync] [--name NAME]

Production mode: ``actuator serve`` with ``--workers`` on durable Postgres and Redis. ``--streams``
SSE connections (no token needed) follow ``--stream-runs`` runs that each got ``--history``
observations first, then stay open and idle: nothing more is posted to those runs. Phases:

- *none*: ``--agents`` other runs post one observation every 1/``--rate`` s each (paced, as
  training runs do); latency p50/p99 of their answers;
- *catch-up*: the streams open; each is sent the kept events of its run (what a reconnecting
  dashboard gets): time, service CPU and Redis commands until no event has arrived for 3 s;
- *idle*: the streams open, nobody posts, for ``--idle-seconds``: the service's CPU and every
  command Redis receives (INFO commandstats), the cost of idle streams alone;
- *streams*: the paced ingest again with the streams open;
- *none again*: the streams closed, the paced ingest once more (the machine is shared: two
  baselines bracket the measurement).

Target: p99 of *streams* at most 2x that of *none*. Results: a table, and
benchmarks/results/load_streams.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from typing import Any

import httpx
import redis

from ._harness import (
    CpuMeter,
    Service,
    _loop,
    machine,
    postgres_pids,
    register_agents,
    run_paced,
    start_postgres_durable,
    start_redis,
    start_service,
    table,
    write_results,
)


class IdleStreams:
    """``n`` SSE connections on their own event loop in a thread, each read (and counted) until
    closed, so the service never blocks on a full socket."""

    def __init__(self, port: int, run_ids: list[str], n: int) -> None:
        self.port, self.paths = port, [f"/v1/runs/{run_ids[i % len(run_ids)]}/stream" for i in range(n)]
        self.opened = 0
        self.failed = 0
        self.pings = 0
        self.events = 0
        self.bytes = 0
        self._ready = threading.Event()
        self._loop = _loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _one(self, path: str, all_open: asyncio.Event) -> None:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            self.failed += 1
            return
        w.write(b"GET %s?max_seconds=3600 HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
                % path.encode())
        status = await r.readline()
        if b" 200 " not in status:
            self.failed += 1
            w.close()
            return
        while (await r.readline()) not in (b"\r\n", b""):
            pass
        self.opened += 1
        if self.opened + self.failed == len(self.paths):
            all_open.set()
        assert self._stop is not None
        reader = asyncio.ensure_future(self._drain(r))
        await self._stop.wait()
        reader.cancel()
        w.close()

    async def _drain(self, r: asyncio.StreamReader) -> None:
        while chunk := await r.read(65536):
            self.bytes += len(chunk)
            self.pings += chunk.count(b": ping")
            self.events += chunk.count(b"\nid: ") + chunk.startswith(b"id: ")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        all_open = asyncio.Event()
        tasks = []
        for i, path in enumerate(self.paths):  # not all at once: 500 simultaneous connects overflow the backlog
            tasks.append(asyncio.ensure_future(self._one(path, all_open)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        await all_open.wait()
        self._ready.set()
        await asyncio.gather(*tasks)

    def open(self, timeout: float = 120.0) -> float:
        """Seconds until every stream answered, or ``timeout`` (then fewer are open: see counts)."""
        t0 = time.perf_counter()
        self._thread.start()
        if not self._ready.wait(timeout):
            print(f"  only {self.opened} of {len(self.paths)} streams open after {timeout:g} s; going on", flush=True)
        return time.perf_counter() - t0

    def quiet(self, for_seconds: float, timeout: float = 600.0) -> float:
        """Wait until no event has arrived for ``for_seconds`` (the catch-up is over); returns
        when the last one arrived."""
        deadline = time.perf_counter() + timeout
        last, since = self.events, time.perf_counter()
        while time.perf_counter() - since < for_seconds:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"streams still receiving after {timeout}s")
            time.sleep(0.1)
            if self.events != last:
                last, since = self.events, time.perf_counter()
        return since

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def counts(self) -> dict[str, int]:
        return {"streams": len(self.paths), "opened": self.opened, "failed": self.failed,
                "events_received": self.events, "pings_received": self.pings, "bytes_received": self.bytes}


def redis_calls(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in after.items() if k not in ("info",)}
    return {k: v for k, v in sorted(out.items()) if v}


def post_history(svc: Service, agents: list[Any], n: int) -> None:
    if n <= 0:
        return
    with httpx.Client(timeout=60) as c:
        for a in agents:
            r = c.post(svc.url + a.path, content=a.batch(n),
                       headers={"Authorization": f"Bearer {a.token}", "Content-Type": "application/json"})
            r.raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--stream-runs", type=int, default=500, help="runs the streams follow (round robin)")
    ap.add_argument("--history", type=int, default=100, help="observations posted to each followed run first")
    ap.add_argument("--agents", type=int, default=10, help="other runs posting during the measured phases")
    ap.add_argument("--rate", type=float, default=4.0, help="observations/s per agent")
    ap.add_argument("--seconds", type=float, default=20.0, help="each paced phase")
    ap.add_argument("--idle-seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-fsync", action="store_true", help="Postgres without fsync (as the tests run it)")
    ap.add_argument("--name", default="load_streams", help="results file name (benchmarks/results/NAME.json)")
    args = ap.parse_args()

    info = machine()
    pg = start_postgres_durable(fsync=not args.no_fsync)
    rds = start_redis()
    r = redis.Redis.from_url(rds.url)
    svc: Service | None = None
    phases: dict[str, Any] = {}
    streams: IdleStreams | None = None

    def paced(name: str, agents: list[Any]) -> None:
        print(f"== {name} ...", flush=True)
        assert svc is not None
        calls = redis_calls(r)
        with CpuMeter(groups) as meter:
            row = run_paced(agents, svc.port, seconds=args.seconds, rate=args.rate)
        row["cpu_s"] = {k: round(v, 2) for k, v in meter.used.items()}
        row["redis_calls"] = delta(calls, redis_calls(r))
        if streams is not None:
            row["streams"] = streams.counts()
        phases[name] = row

    try:
        svc = start_service(pg.create_database(f"streams_{int(time.time() * 1000)}"), redis_url=rds.url,
                            workers=args.workers)
        groups = {"service": svc.pids, "postgres": lambda: postgres_pids(pg)}
        followed = register_agents(svc.url, args.stream_runs)
        print(f"posting {args.history} observations to each of {len(followed)} followed runs ...", flush=True)
        post_history(svc, followed, args.history)
        agents = register_agents(svc.url, args.agents)
        run_paced(agents, svc.port, seconds=3, rate=args.rate)  # warm-up: connections, caches

        paced("none", agents)

        print(f"== catch-up: opening {args.streams} streams, each sent its run's kept events ...", flush=True)
        streams = IdleStreams(svc.port, [a.run_id for a in followed], args.streams)
        calls = redis_calls(r)
        with CpuMeter(groups) as meter:
            t0 = time.perf_counter()
            opened_in = streams.open()
            caught_up_in = streams.quiet(3.0) - t0
        phases["catch-up"] = {"opened_in_s": round(opened_in, 2), "caught_up_in_s": round(caught_up_in, 2),
                              "cpu_s": {k: round(v, 2) for k, v in meter.used.items()},
                              "redis_calls": delta(calls, redis_calls(r)), "streams": streams.counts()}
        print(f"== idle ({args.idle_seconds:g} s, {streams.opened} streams open) ...", flush=True)
        calls = redis_calls(r)
        with CpuMeter(groups) as meter:
            time.sleep(args.idle_seconds)
        phases["idle"] = {"seconds": args.idle_seconds, "cpu_s": {k: round(v, 2) for k, v in meter.used.items()},
                          "redis_calls": delta(calls, redis_calls(r)), "streams": streams.counts()}

        paced("streams", agents)
        streams.close()
        streams = None
        time.sleep(1.0)
        paced("none again", agents)
    finally:
        if streams is not None:
            streams.close()
        if svc is not None:
            svc.stop()
        r.close()
        rds.stop()
        pg.remove()

    base = [phases["none"]["latency_p99_ms"], phases["none again"]["latency_p99_ms"]]
    with_streams = phases["streams"]["latency_p99_ms"]
    ratio = with_streams / max(base)
    ratio_first = with_streams / base[0]
    rows = [{"phase": name, "obs/s": p["obs_per_s"], "p50 ms": p["latency_p50_ms"], "p99 ms": p["latency_p99_ms"],
             "max ms": p["latency_max_ms"], "errors": p["errors"], "service cpu s": p["cpu_s"].get("service"),
             "redis calls": sum(p["redis_calls"].values())}
            for name, p in phases.items() if "latency_p99_ms" in p]
    print()
    print(table(rows, ["phase", "obs/s", "p50 ms", "p99 ms", "max ms", "errors", "service cpu s", "redis calls"]))
    cu = phases["catch-up"]
    print(f"\ncatch-up: {cu['streams']['opened']} streams opened in {cu['opened_in_s']} s, "
          f"{cu['streams']['events_received']} events delivered by {cu['caught_up_in_s']} s, "
          f"service CPU {cu['cpu_s'].get('service')} s, Redis commands {cu['redis_calls']}")
    idle = phases["idle"]
    print(f"\nidle, {idle['streams']['opened']} streams open for {idle['seconds']:g} s: service CPU "
          f"{idle['cpu_s'].get('service')} s, Redis commands {idle['redis_calls'] or 'none'}, "
          f"pings received {idle['streams']['pings_received']}")
    verdict = "met" if max(ratio, ratio_first) <= 2.0 else "missed"
    print(f"p99 with streams / without: {ratio_first:.2f}x (first baseline), {ratio:.2f}x (larger baseline): "
          f"target <= 2x {verdict}")
    cmd = "python -m benchmarks.load.streams " + " ".join(os.sys.argv[1:])
    path = write_results(args.name, {
        "command": cmd.strip(), "machine": info, "postgres_fsync": not args.no_fsync, "workers": args.workers,
        "streams": args.streams, "stream_runs": args.stream_runs, "history": args.history, "phases": phases,
        "p99_ratio_first_baseline": round(ratio_first, 2), "p99_ratio_larger_baseline": round(ratio, 2),
        "target": "p99 with streams <= 2x without", "verdict": verdict})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
