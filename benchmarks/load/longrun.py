"""Reads of a long run: every read endpoint on a run with 100k observations and 100k decisions.

    python -m benchmarks.load.longrun [--observations 100000] [--decisions 100000] [--events 10000]
                                      [--policy-versions 120] [--repeat 3] [--name load_longrun]

Target (issue 17): every read endpoint answers within 2 s using at most 100 MB of extra RSS, or
answers a 4xx naming the limit. Against ``actuator serve`` (one worker) on Postgres, on loopback.
The run is registered through the API, then its rows are written straight into Postgres with
``generate_series`` (seconds, not the hours 100k agent requests would take): observations with two
probes, two metrics and the knob in effect, decisions with the P/I/D components and inputs the
engine stores, breach events, and the run row's counters. Beside it, ``--policy-versions``
versions of a ~190 KB policy (twelve controllers with 1,000-point setpoint schedules).

Each request is sent ``--repeat`` times, one at a time; the figures are the worst: wall time
and the peak resident memory of the service process above its level just before the request
(sampled from /proc every 5 ms). The first plot a process draws imports matplotlib: it is
measured once on its own, before the rest. Results: a table, and benchmarks/results/NAME.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import httpx

from ._harness import KNOBS, POLICY, machine, start_postgres, start_service, table, write_results

TIME_LIMIT_S, RSS_LIMIT_MB = 2.0, 100.0


def big_policy(name: str) -> dict[str, Any]:
    """About 190 KB: twelve controllers, each with a 1,000-point setpoint schedule (the cap)."""
    schedule = [[i * 100, round(0.05 + 0.05 * i / 1000, 9)] for i in range(1000)]
    return {"name": name, "description": "x" * 2000,
            "controllers": [{"name": f"drift{i}", "probe": "kl_drift", "knob": "learning_rate",
                             "setpoint": schedule, "kp": 1.0, "ki": 0.1, "priority": i} for i in range(12)]}


def seed(dsn: str, run_id: str, observations: int, decisions: int, events: int) -> float:
    import psycopg

    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=False) as conn:
        conn.execute(
            """INSERT INTO observations (run_id, seq, step, probes, metrics, knobs, agent_time, received_at)
               SELECT %(run)s, g, g + 1,
                      json_build_object('kl_drift', 0.1 + 0.05 * sin(g / 500.0), 'perplexity', 12 + random()),
                      json_build_object('loss', 2.0 - g / 100000.0, 'grad_norm', 1 + random()),
                      json_build_object('learning_rate', 1e-3 * exp(-g / 200000.0)),
                      extract(epoch from now()), now()
               FROM generate_series(0, %(n)s - 1) AS g""", {"run": run_id, "n": observations})
        conn.execute(
            """INSERT INTO decisions (run_id, number, step, knob, old_value, new_value, reason, controller,
                                      policy_version, components, inputs, created_at)
               SELECT %(run)s, g, g * %(ratio)s + 1, 'learning_rate', 1e-3, 9.9e-4,
                      'controller drift: kl_drift 0.1134 (filtered 0.1121) above setpoint 0.1; learning_rate '
                      || '0.001 -> 0.00099', 'drift', 1,
                      json_build_object('p', -0.0242, 'i', -0.0031, 'd', NULL, 'error', 0.0121),
                      json_build_object('probe', 'kl_drift', 'raw', 0.1134, 'filtered', 0.1121, 'setpoint', 0.1,
                                        'dt', 1.0, 'bounds', json_build_array(1e-6, 1e-2), 'max_step', 0.3,
                                        'scale', 'log', 'limited_by', json_build_array()),
                      now()
               FROM generate_series(1, %(n)s) AS g""",
            {"run": run_id, "n": decisions, "ratio": max(1, observations // max(1, decisions))})
        conn.execute(
            """INSERT INTO events (run_id, kind, step, payload, created_at)
               SELECT %(run)s, 'guardrail_breach', g * 10,
                      json_build_object('kind', 'guardrail_breach', 'guardrail', 'drift-cap', 'probe', 'kl_drift',
                                        'value', 5.5, 'threshold', 5.0, 'action', 'alert', 'step', g * 10),
                      now()
               FROM generate_series(1, %(n)s) AS g""", {"run": run_id, "n": events})
        conn.execute(
            """UPDATE runs SET last_seq = %(n)s - 1, last_step = %(n)s, decision_count = %(d)s,
                              latest_probes = '{"kl_drift": 0.1, "perplexity": 12.5}',
                              latest_metrics = '{"loss": 1.0, "grad_norm": 1.2}',
                              knobs_in_effect = '{"learning_rate": 0.0009}'
               WHERE id = %(run)s""", {"run": run_id, "n": observations, "d": decisions})
        conn.commit()
        conn.execute("ANALYZE")
    return time.perf_counter() - start


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024


def measure(client: httpx.Client, pid: int, method: str, path: str, **kw: Any) -> dict[str, Any]:
    """One request: status, seconds, bytes, peak RSS above the level before it, the error message."""
    before = rss_mb(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    r = client.request(method, path, **kw)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    peak[0] = max(peak[0], rss_mb(pid))
    message = ""
    if r.status_code >= 400:
        detail = r.json().get("detail") if r.headers.get("content-type", "").startswith("application/json") else r.text
        message = detail.get("message", "") if isinstance(detail, dict) else str(detail)
    return {"status": r.status_code, "seconds": seconds, "bytes": len(r.content), "extra_rss_mb": peak[0] - before,
            "rss_after_mb": rss_mb(pid), "message": message[:160]}


def _requests(rid: str, run_token: str, args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The reads measured on the long run (and one ingest), each: label, method, path, request kwargs."""
    token = {"Authorization": f"Bearer {run_token}"}
    ingest = {"observations": [{"seq": args.observations, "step": args.observations + 1,
                                "probes": {"kl_drift": 0.1}}], "last_decision": 0}
    return [
        ("run state", "GET", f"/v1/runs/{rid}", {}),
        ("runs list", "GET", "/v1/runs", {"params": {"limit": 1000}}),
        ("decisions, first page of 1000", "GET", f"/v1/runs/{rid}/decisions", {"params": {"limit": 1000}}),
        ("decisions, page at offset 99000", "GET", f"/v1/runs/{rid}/decisions",
         {"params": {"limit": 1000, "offset": max(0, args.decisions - 1000)}}),
        ("events, page of 1000", "GET", f"/v1/runs/{rid}/events", {"params": {"limit": 1000}}),
        ("report json", "GET", f"/v1/runs/{rid}/report", {}),
        ("report png", "GET", f"/v1/runs/{rid}/report", {"params": {"format": "png"}}),
        ("report html", "GET", f"/v1/runs/{rid}/report", {"params": {"format": "html"}}),
        ("policies list (default page)", "GET", "/v1/policies", {}),
        ("policies list, limit 1000", "GET", "/v1/policies", {"params": {"limit": 1000}}),
        ("policy latest", "GET", "/v1/policies/big", {}),
        ("simulate (whole run)", "POST", "/v1/policies/simulate", {"json": {"policy": POLICY, "run_id": rid}}),
        ("simulate, limit 5000", "POST", "/v1/policies/simulate",
         {"json": {"policy": POLICY, "run_id": rid, "limit": 5000}}),
        ("ingest answer, last_decision 0", "POST", f"/v1/runs/{rid}/observations",
         {"json": ingest, "headers": token}),
        ("metrics", "GET", "/metrics", {}),
    ]


def _worst(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A request's worst of its repeats, and whether it met the target (within the limits, or
    refused with a 4xx that says why)."""
    worst: dict[str, Any] = {"request": label, "status": sorted({r["status"] for r in runs}),
                             "seconds": round(max(r["seconds"] for r in runs), 3),
                             "extra_rss_mb": round(max(r["extra_rss_mb"] for r in runs), 1),
                             "bytes": max(r["bytes"] for r in runs), "message": runs[-1]["message"],
                             "rss_after_mb": round(runs[-1]["rss_after_mb"], 1)}
    refused = all(400 <= r["status"] < 500 and r["message"] for r in runs)
    within = worst["seconds"] <= TIME_LIMIT_S and worst["extra_rss_mb"] <= RSS_LIMIT_MB
    worst["met"] = "yes" if within and (refused or all(r["status"] < 400 for r in runs)) else "NO"
    worst["how"] = "refused (4xx)" if refused else "answered"
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--observations", type=int, default=100_000)
    ap.add_argument("--decisions", type=int, default=100_000)
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--policy-versions", type=int, default=120)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--name", default="load_longrun")
    args = ap.parse_args()

    info = machine()
    pg = start_postgres()
    db = pg.create_database("longrun")
    svc = start_service(db)
    try:
        with httpx.Client(base_url=svc.url, timeout=600) as client:
            run = client.post("/v1/runs", json={"name": "long", "policy": POLICY, "knobs": KNOBS}).json()
            seeded = seed(f"host=127.0.0.1 port={pg.port} user=postgres dbname=longrun", run["id"],
                          args.observations, args.decisions, args.events)
            doc = big_policy("big")
            policy_bytes = len(json.dumps(doc))
            for _ in range(args.policy_versions):
                assert client.post("/v1/policies", json=doc).status_code == 201
            rid = run["id"]
            requests = _requests(rid, run["token"], args)
            cold = ("report png, the process's first plot (imports matplotlib)", "GET", f"/v1/runs/{rid}/report",
                    {"params": {"format": "png"}})
            rows = []
            for label, method, path, kw in [cold, *requests]:
                runs = [measure(client, svc.proc.pid, method, path, **kw)
                        for _ in range(1 if label == cold[0] else args.repeat)]
                rows.append(_worst(label, runs))
                print(f"{label}: {rows[-1]}", flush=True)
    finally:
        svc.stop()
        pg.stop()
    met = all(r["met"] == "yes" for r in rows)
    print(table(rows, ["request", "status", "seconds", "extra_rss_mb", "bytes", "how", "met"]))
    print(f"target (every read <= {TIME_LIMIT_S} s and <= {RSS_LIMIT_MB} MB extra RSS, or a 4xx naming the limit):",
          "MET" if met else "MISSED")
    path = write_results(args.name, {
        "machine": info, "args": vars(args), "seed_seconds": round(seeded, 1), "policy_document_bytes": policy_bytes,
        "target": {"seconds": TIME_LIMIT_S, "extra_rss_mb": RSS_LIMIT_MB}, "met": met, "requests": rows})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
