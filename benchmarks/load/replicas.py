"""Past one machine: API replicas behind a load balancer, one Postgres, one Redis.

    python -m benchmarks.load.replicas [--agents 50] [--seconds 15] [--batch 100] [--rate 4] [--no-fsync]

The same workloads as ``benchmarks.load.ingest`` (unbatched and batched saturation, paced decision
latency), through the round-robin balancer (``benchmarks.load.balancer``, its own process) in
front of one replica, then two. Every replica is ``actuator serve`` (1 worker) on the same
Postgres and Redis; the first applies the migrations, the second starts with them off.

Results: a table, and benchmarks/results/load_replicas.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

import httpx

from actuator.testing import free_port, wait_until

from ._harness import (
    machine,
    register_agents,
    run_closed_loop,
    run_paced,
    start_postgres_durable,
    start_redis,
    start_service,
    table,
    write_results,
)


def balancer(backends: list[int]) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.load.balancer", "--port", str(port), "--backends",
                             ",".join(map(str, backends))])
    wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200, 30, "balancer")
    return proc, port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--name", default="load_replicas")
    args = ap.parse_args()

    info = machine()
    pg = start_postgres_durable(fsync=not args.no_fsync)
    redis = start_redis()
    results: list[dict[str, Any]] = []
    try:
        for n in (1, 2):
            db = pg.create_database(f"replicas_{n}_{int(time.time())}")
            replicas = [start_service(db, redis_url=redis.url, migrate=(i == 0)) for i in range(n)]
            lb, port = balancer([r.port for r in replicas])
            try:
                agents = register_agents(f"http://127.0.0.1:{port}", args.agents)
                run_closed_loop(agents, port, seconds=2, batch=1)  # warm-up
                for phase, load, options in (
                    ("unbatched", run_closed_loop, {"batch": 1}),
                    ("batched", run_closed_loop, {"batch": args.batch}),
                    ("paced", run_paced, {"rate": args.rate}),
                ):
                    print(f"== {n} replica(s): {phase} ...", flush=True)
                    results.append({"replicas": n, "phase": phase,
                                    **load(agents, port, seconds=args.seconds, **options)})
            finally:
                lb.terminate()
                lb.wait(10)
                for r in replicas:
                    r.stop()
    finally:
        pg.stop()
        redis.stop()

    rows = [{"replicas": r["replicas"], "phase": r["phase"], "batch": r["batch"], "obs/s": r["obs_per_s"],
             "req/s": r["requests_per_s"], "p50 ms": r["latency_p50_ms"], "p99 ms": r["latency_p99_ms"],
             "errors": r["errors"]} for r in results]
    print()
    print(table(rows, ["replicas", "phase", "batch", "obs/s", "req/s", "p50 ms", "p99 ms", "errors"]))
    cmd = "python -m benchmarks.load.replicas " + " ".join(sys.argv[1:])
    path = write_results(args.name, {"command": cmd.strip(), "machine": info, "postgres_fsync": not args.no_fsync,
                                     "agents": args.agents, "results": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
