"""What a /metrics scrape costs once many runs have finished (issue 34).

    python -m benchmarks.load.metrics_retired [--retired 1500] [--live 20] [--scrapes 20] [--name metrics_retired]
                                              [--label TEXT]

``actuator serve --workers 2`` on Postgres and Redis (prometheus_client's multiprocess mode, a fresh
metrics directory, ACTUATOR_METRICS_RETIRE_AFTER=1). First ``--live`` runs are registered and
observed; then ``--retired`` runs are registered, observed (three requests each, one connection
per request, so both workers write their series) and finished, and the script waits until their
series are due to go. ``--scrapes`` scrapes are timed one at a time at the start, with the live
runs, and after the retirements; beside them, the size of the exposition and of the metrics
directory's files (what every scrape reads). Results: a table, and benchmarks/results/NAME.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from actuator.testing import make_service

from ._harness import KNOBS, POLICY, machine, start_postgres, start_redis, table, write_results

RETIRE_AFTER = 1.0


def scrapes(url: str, n: int, metrics_dir: Path) -> dict[str, Any]:
    seconds, size = [], 0
    with httpx.Client(timeout=120) as client:
        for _ in range(n):
            start = time.perf_counter()
            r = client.get(f"{url}/metrics", headers={"Connection": "close"})  # either worker answers
            seconds.append(time.perf_counter() - start)
            r.raise_for_status()
            size = len(r.content)
    files = [p for p in metrics_dir.iterdir() if p.suffix == ".db"]
    return {"scrape_median_s": round(statistics.median(seconds), 4), "scrape_max_s": round(max(seconds), 4),
            "exposition_kb": round(size / 1024, 1), "db_files": len(files),
            "db_used_kb": round(sum(_used(p) for p in files) / 1024, 1)}


def _used(path: Path) -> int:
    """Bytes of a prometheus_client file in use (its header; the rest is preallocated)."""
    with open(path, "rb") as fh:
        return int.from_bytes(fh.read(4), "little")


def run_life(url: str, finish: bool, i: int) -> None:
    with httpx.Client(base_url=url, timeout=60, headers={"Connection": "close"}) as client:
        run = client.post("/v1/runs", json={"name": f"retired-{i}", "policy": POLICY, "knobs": KNOBS}).json()
        auth = {"Authorization": f"Bearer {run['token']}", "Connection": "close"}
        for seq in range(3):
            r = client.post(f"/v1/runs/{run['id']}/observations", headers=auth,
                            json={"observations": [{"seq": seq, "step": seq + 1, "probes": {"kl_drift": 0.3},
                                                    "metrics": {"loss": 2.0}, "knobs": {"learning_rate": 1e-3}}]})
            r.raise_for_status()
        if finish:
            client.post(f"/v1/runs/{run['id']}/finish").raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--retired", type=int, default=1500)
    ap.add_argument("--live", type=int, default=20)
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--name", default="metrics_retired")
    ap.add_argument("--label", default="", help="What code was measured (kept in the results).")
    args = ap.parse_args()

    info = machine()
    pg, redis = start_postgres(), start_redis()
    metrics_dir = Path(tempfile.mkdtemp(prefix="actuator-bench-metrics-"))
    log_dir = tempfile.mkdtemp(prefix="actuator-bench-")
    svc = make_service(
        pg.create_database("metrics_retired"), redis_url=redis.url, log_dir=log_dir, serve_args=["--workers", "2"],
        extra_env={"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                   "ACTUATOR_METRICS_RETIRE_AFTER": str(RETIRE_AFTER)}).start(timeout=90)
    rows: list[dict[str, Any]] = []
    try:
        rows.append({"phase": "start", **scrapes(svc.url, args.scrapes, metrics_dir)})
        # stored once up front: the registrations reuse it (before issue 34, concurrent ones raced to store it)
        httpx.post(f"{svc.url}/v1/policies", json=POLICY, timeout=60).raise_for_status()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: run_life(svc.url, False, i), range(args.live)))
            rows.append({"phase": f"{args.live} live runs", **scrapes(svc.url, args.scrapes, metrics_dir)})
            start = time.perf_counter()
            list(pool.map(lambda i: run_life(svc.url, True, i), range(args.retired)))
            made = time.perf_counter() - start
        time.sleep(RETIRE_AFTER + 3)  # due, and every worker has had a sweep since
        rows.append({"phase": f"+ {args.retired} retired runs", **scrapes(svc.url, args.scrapes, metrics_dir)})
    finally:
        svc.stop()
        redis.stop()
        pg.remove()
    print(table(rows, ["phase", "scrape_median_s", "scrape_max_s", "exposition_kb", "db_files", "db_used_kb"]))
    print(f"({args.retired} runs registered, observed and finished in {made:.0f} s)")
    path = write_results(args.name, {"machine": info, "args": vars(args), "workers": 2,
                                     "retire_after_s": RETIRE_AFTER, "backends": "postgres + redis",
                                     "label": args.label, "rows": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
