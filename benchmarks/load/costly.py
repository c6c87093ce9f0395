"""Costly requests beside ingest: what simulations and plots cost another run's agents.

    python -m benchmarks.load.costly [--clients 8] [--agents 4] [--rate 4] [--seconds 20]
                                     [--observations 5000] [--workers 1] [--no-fsync] [--name NAME]

``actuator serve`` on Postgres (durable unless ``--no-fsync``), open mode (with an admin token the
same requests without it are refused at once: 401). One run holds ``--observations`` observations
of a policy that is costly to replay (8 controllers, 64 guardrails: seconds of CPU per simulation).
Phases, each ``--seconds`` long, while ``--agents`` other runs post one observation every
1/``--rate`` s each (paced, as training runs do):

- *none*: the agents alone (baseline);
- *simulate*: ``--clients`` clients each post ``POST /v1/policies/simulate`` of the whole costly
  run, the next as soon as the answer is in;
- *png*: the same clients each get the run's report as a PNG, in a loop;
- *abandon*: the same clients each send a simulation and close the connection at once;
- *none again*: the agents alone once more (the machine is shared: two baselines bracket it).

Per phase: the agents' latency p50/p99, the costly answers by status (200, 429 past the
concurrency cap, other), the largest answer, and the service's memory (RSS over its processes,
the worker processes included) at the end of the phase and 10 s after. Results: a table, and
benchmarks/results/load_costly.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import socket
import struct
import threading
import time
from typing import Any

import httpx

from actuator.testing import HEAVY_KNOBS, HEAVY_POLICY, heavy_probes

from ._harness import (
    Service,
    machine,
    register_agents,
    run_paced,
    start_postgres,
    start_postgres_durable,
    start_service,
    table,
    write_results,
)

# A policy costly to replay (8 controllers, 64 guardrails evaluated on every observation) and its knobs.
KNOBS, HEAVY, probes = HEAVY_KNOBS, HEAVY_POLICY, heavy_probes  # shared with tests/hardening


def _rss_mb(svc: Service) -> float:
    total = 0
    for pid in svc.pids():
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return round(total / 1024, 1)


def _heavy_run(url: str, n: int) -> str:
    run = httpx.post(f"{url}/v1/runs", json={"name": "heavy", "policy": HEAVY, "knobs": KNOBS}, timeout=60).json()
    for start in range(0, n, 1000):
        obs = [{"seq": i, "step": i + 1, "probes": probes(i)} for i in range(start, min(n, start + 1000))]
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", json={"observations": obs},
                       headers={"Authorization": f"Bearer {run['token']}"}, timeout=600)
        r.raise_for_status()
    return str(run["id"])


class CostlyClients:
    """``n`` threads sending one kind of costly request in a loop until stopped."""

    def __init__(self, svc: Service, run_id: str, kind: str, n: int) -> None:
        self.svc, self.run_id, self.kind = svc, run_id, kind
        self.statuses: collections.Counter[str] = collections.Counter()
        self.largest = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _abandon(self) -> None:
        body = json.dumps({"policy": HEAVY, "run_id": self.run_id}).encode()
        try:
            s = socket.create_connection(("127.0.0.1", self.svc.port), timeout=30)
        except OSError as exc:  # the service does not even accept a connection within 30 s
            with self._lock:
                self.statuses[f"connect: {type(exc).__name__}"] += 1
            return
        s.sendall(f"POST /v1/policies/simulate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        with self._lock:
            self.statuses["abandoned"] += 1

    def _loop(self) -> None:
        with httpx.Client(base_url=self.svc.url, timeout=600) as client:
            while not self._stop.is_set():
                if self.kind == "abandon":
                    self._abandon()
                    continue
                try:
                    if self.kind == "simulate":
                        r = client.post("/v1/policies/simulate", json={"policy": HEAVY, "run_id": self.run_id})
                    else:
                        r = client.get(f"/v1/runs/{self.run_id}/report", params={"format": "png"})
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.statuses[type(exc).__name__] += 1
                    continue
                with self._lock:
                    self.statuses[str(r.status_code)] += 1
                    self.largest = max(self.largest, len(r.content))
                if r.status_code == 429:  # as a client should: wait what Retry-After says
                    self._stop.wait(float(r.headers.get("retry-after", "1")))

    def __enter__(self) -> CostlyClients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(660)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--observations", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--name", default="load_costly")
    args = ap.parse_args()
    info = machine()
    pg = start_postgres() if args.no_fsync else start_postgres_durable()
    svc = start_service(pg.create_database(f"costly_{int(time.time() * 1000)}"), workers=args.workers)
    rows: list[dict[str, Any]] = []
    try:
        run_id = _heavy_run(svc.url, args.observations)
        agents = register_agents(svc.url, args.agents)
        run_paced(agents, svc.port, seconds=3, rate=args.rate)  # warm-up
        for phase in ("none", "simulate", "png", "abandon", "none again"):
            kind = phase.split()[0]
            if kind == "none":
                row = run_paced(agents, svc.port, seconds=args.seconds, rate=args.rate)
                costly: CostlyClients | None = None
            else:
                with CostlyClients(svc, run_id, kind, args.clients) as costly:
                    row = run_paced(agents, svc.port, seconds=args.seconds, rate=args.rate)
            rss = _rss_mb(svc)
            time.sleep(10)
            rows.append({"phase": phase, "p50_ms": row["latency_p50_ms"], "p99_ms": row["latency_p99_ms"],
                         "errors": row["errors"],
                         "costly": dict(costly.statuses) if costly else {},
                         "largest_answer_kb": round(costly.largest / 1024, 1) if costly else 0,
                         "rss_mb": rss, "rss_10s_later_mb": _rss_mb(svc)})
            print(table(rows[-1:], list(rows[-1])), flush=True)
    finally:
        svc.stop()
        pg.remove()
    columns = ["phase", "p50_ms", "p99_ms", "errors", "costly", "largest_answer_kb", "rss_mb", "rss_10s_later_mb"]
    print(table(rows, columns))
    path = write_results(args.name, {"machine": info, "args": vars(args), "phases": rows,
                                     "command": "python -m benchmarks.load.costly " + " ".join(
                                         f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                         if k not in ("no_fsync", "name"))})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
