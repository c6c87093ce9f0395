"""Ingest load: what one controller service sustains.

    python -m benchmarks.load.ingest [--backends postgres,sqlite] [--agents 50] [--seconds 15]
                                     [--batch 100] [--rate 4] [--workers 1] [--redis] [--no-fsync]
                                     [--profile] [--phases unbatched,batched,paced] [--name NAME]

Per backend, against ``actuator serve`` on loopback, with ``--agents`` simulated agents, each its
own run and token and its own keep-alive connection (every observation carries a probe, so the
PID and the guardrail run on each and most produce a decision):

- unbatched: each agent posts one observation per request, the next as soon as the answer is in
  (saturation): observations/s, request latency p50/p99;
- batched: the same with ``--batch`` observations per request;
- decision latency: each agent posts one observation every 1/``--rate`` s (open loop, spread over
  the period, like training runs that probe on a schedule): latency of the answer that carries
  the decisions, p50/p99 — the figure an agent waits for (off its training thread);
- ``--profile``: py-spy samples the service during the batched phase (``pip install py-spy``);
  the share of time per layer is printed and saved.

Postgres is durable (fsync on) unless ``--no-fsync``. Results: a table, and
benchmarks/results/load_ingest.json.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from ._harness import (
    CpuMeter,
    machine,
    postgres_pids,
    register_agents,
    run_closed_loop,
    run_paced,
    start_postgres_durable,
    start_redis,
    start_service,
    table,
    write_results,
)

LAYERS = (  # leaf frame file path fragment → layer (first match wins)
    ("sqlalchemy", "SQLAlchemy (ORM, core)"), ("psycopg", "psycopg (driver)"), ("sqlite3", "sqlite3 (driver)"),
    ("pydantic", "pydantic (validation)"), ("fastapi", "FastAPI/Starlette"), ("starlette", "FastAPI/Starlette"),
    ("anyio", "threadpool hand-off (anyio)"), ("uvicorn", "uvicorn/HTTP"), ("httptools", "uvicorn/HTTP"),
    ("/actuator/", "Actuator (engine, store, controllers)"), ("/controllers/", "Actuator (engine, store, controllers)"),
    ("/api/", "Actuator (engine, store, controllers)"), ("prometheus_client", "prometheus_client"),
    ("json", "json"), ("redis", "redis-py"), ("asyncio", "asyncio/uvloop"), ("uvloop", "asyncio/uvloop"),
    ("threading", "thread waits"),
)


def profile(pids: list[int], seconds: float, out: str) -> dict[str, Any]:
    """py-spy record (raw collapsed stacks, idle frames dropped) → share of samples per layer of
    the leaf frame, and the top leaf functions."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(os.sys.executable), "py-spy")
    procs = [subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                               "--format", "raw", "--output", f"{out}.{pid}.txt", "--nonblocking"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in pids]
    return {"procs": procs, "files": [f"{out}.{pid}.txt" for pid in pids]}


def summarise_profile(files: list[str]) -> dict[str, Any]:
    layers: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for f in files:
        if not os.path.exists(f):
            continue
        for line in open(f):
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            leaf = frames[-1]
            total += n
            layer = next((name for frag, name in LAYERS if frag in leaf), "other (interpreter, stdlib)")
            layers[layer] += n
            leaves[leaf.split(" (")[0] + " (" + leaf.rsplit("/", 1)[-1]] += n
    if not total:
        return {"samples": 0}
    return {"samples": total,
            "layers": {k: round(100 * v / total, 1) for k, v in layers.most_common()},
            "top_functions": {k: round(100 * v / total, 1) for k, v in leaves.most_common(12)}}


def bench_backend(backend: str, args: argparse.Namespace, pg: Any, redis_url: str | None) -> dict[str, Any]:
    if backend == "postgres":
        db = pg.create_database(f"ingest_{int(time.time() * 1000)}")
    else:
        db = f"sqlite:///{tempfile.mkdtemp(prefix='actuator-bench-')}/actuator.db"
    svc = start_service(db, redis_url=redis_url if backend == "postgres" else None,
                        workers=args.workers if backend == "postgres" else 1)
    rows: dict[str, Any] = {}
    try:
        agents = register_agents(svc.url, args.agents)
        run_closed_loop(agents, svc.port, seconds=2, batch=1)  # warm-up: connections, caches
        groups = {"service": svc.pids}
        if backend == "postgres":
            groups["postgres"] = lambda: postgres_pids(pg)

        def measured(phase: str, run: Any) -> None:
            with CpuMeter(groups) as meter:
                rows[phase] = run()
            obs = int(rows[phase]["obs_per_s"] * rows[phase]["seconds"])
            rows[phase]["cpu_ms_per_obs"] = meter.per_observation_ms(obs)

        if "unbatched" in args.phases:
            measured("unbatched", lambda: run_closed_loop(agents, svc.port, seconds=args.seconds, batch=1))
        if "batched" in args.phases:
            spy = profile(svc.pids(), args.seconds, os.path.join(tempfile.mkdtemp(), "spy")) if args.profile else None
            measured("batched", lambda: run_closed_loop(agents, svc.port, seconds=args.seconds, batch=args.batch))
            if spy:
                for p in spy["procs"]:
                    p.wait(args.seconds + 30)
                rows["profile_batched"] = summarise_profile(spy["files"])
        if "paced" in args.phases:
            measured("paced", lambda: run_paced(agents, svc.port, seconds=args.seconds, rate=args.rate))
    finally:
        svc.stop()
    return {"database": backend, "workers": args.workers if backend == "postgres" else 1,
            "redis": bool(redis_url) and backend == "postgres", **rows}


def _bench_all(backends: list[str], args: argparse.Namespace) -> list[dict]:
    """Each backend in turn, over one Postgres (when asked for) and one Redis (``--redis``)."""
    pg = start_postgres_durable(fsync=not args.no_fsync) if "postgres" in backends else None
    redis = start_redis() if args.redis else None
    results = []
    try:
        for backend in backends:
            print(f"== {backend} ...", flush=True)
            results.append(bench_backend(backend, args, pg, redis.url if redis else None))
    finally:
        if pg:
            pg.stop()
        if redis:
            redis.stop()
    return results


def _row(r: dict, phase: str) -> dict:
    """One backend's phase as a table row."""
    p = r[phase]
    return {"database": r["database"] + (f" x{r['workers']}w" if r["workers"] > 1 else "")
            + (" +redis" if r["redis"] else ""), "phase": phase, "agents": p["agents"],
            "batch": p["batch"], "obs/s": p["obs_per_s"], "req/s": p["requests_per_s"],
            "p50 ms": p["latency_p50_ms"], "p99 ms": p["latency_p99_ms"],
            "max ms": p["latency_max_ms"], "errors": p["errors"], "decisions": p["decisions"],
            "cpu ms/obs (svc+db)": "%.2f+%.2f" % (p["cpu_ms_per_obs"].get("service", 0),
                                                 p["cpu_ms_per_obs"].get("postgres", 0))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="postgres,sqlite")
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--rate", type=float, default=4.0, help="observations/s per agent in the paced phase")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn workers (Postgres only)")
    ap.add_argument("--redis", action="store_true", help="live state in Redis (production mode)")
    ap.add_argument("--no-fsync", action="store_true", help="Postgres without fsync (as the tests run it)")
    ap.add_argument("--profile", action="store_true", help="sample the service with py-spy (batched phase)")
    ap.add_argument("--phases", default="unbatched,batched,paced")
    ap.add_argument("--name", default="load_ingest", help="results file name (benchmarks/results/NAME.json)")
    args = ap.parse_args()

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    info = machine()
    results = _bench_all(backends, args)

    rows = [_row(r, phase) for r in results for phase in ("unbatched", "batched", "paced") if phase in r]
    print()
    print(table(rows, ["database", "phase", "agents", "batch", "obs/s", "req/s", "p50 ms", "p99 ms", "max ms",
                       "errors", "decisions", "cpu ms/obs (svc+db)"]))
    for r in results:
        prof = r.get("profile_batched")
        if prof and prof.get("samples"):
            print(f"\nwhere the {r['database']} service spends its time (batched, py-spy, {prof['samples']} samples):")
            for k, v in prof["layers"].items():
                print(f"  {v:5.1f}%  {k}")
    cmd = "python -m benchmarks.load.ingest " + " ".join(os.sys.argv[1:])
    path = write_results(args.name, {"command": cmd.strip(), "machine": info, "postgres_fsync": not args.no_fsync,
                                     "results": results})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
