"""Issue 34, control is never lost silently: the service's own correctness under production load.

- Break 7: publishing one policy from many requests at once (registrations carrying it inline,
  PUT and POST of new versions) never answers 5xx, and its versions stay 1, 2, 3, ... without a gap.
- Break 11: an acknowledgement that cannot be true (an applied value outside the knob's bounds,
  applied before the step the decision was ordered for) is refused with 422 naming the field, and
  nothing of its request is stored, observations included.
- Metrics: with several workers, a retired run's series leave the multiprocess files every scrape
  reads (not only the exposition), so a scrape's cost does not grow with every run ever seen.

Against the real service under uvicorn with Redis (``actuator serve --workers 2`` on Postgres, one
process on SQLite), reading the store directly to check what was stored.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from harden import KNOBS, POLICY, StoreView, bearer, post_obs, register, wait_until
from actuator.testing import Postgres, Redis, Service, make_service

RETIRE_AFTER = 1.0


def _serve(database_url: str, redis: Redis, tmp_path: Path, workers: int) -> tuple[Service, Path]:
    """The service as production runs it (Redis, multiprocess metrics in a directory of their own
    when there are several workers); it and that directory."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {"ACTUATOR_METRICS_RETIRE_AFTER": str(RETIRE_AFTER)}
    if workers > 1:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    svc = make_service(database_url, redis_url=redis.url, log_dir=str(tmp_path),
                       serve_args=["--workers", str(workers)], extra_env=env)
    return svc.start(timeout=90), metrics_dir


@pytest.fixture
def production(database_url: str, redis_server: Redis, tmp_path: Path) -> Iterator[Service]:
    """Two workers on Postgres; one on SQLite (``actuator serve`` refuses several there)."""
    svc, _ = _serve(database_url, redis_server, tmp_path, 1 if database_url.startswith("sqlite") else 2)
    yield svc
    svc.stop()


@pytest.fixture
def two_workers(postgres: Postgres, redis_server: Redis, tmp_path: Path) -> Iterator[tuple[Service, Path]]:
    svc, metrics_dir = _serve(postgres.create_database(f"metrics_{uuid.uuid4().hex[:12]}"), redis_server, tmp_path, 2)
    yield svc, metrics_dir
    svc.stop()


# -- break 7: concurrent publishing ---------------------------------------------------------------
def _versions(url: str, name: str) -> list[int]:
    rows = httpx.get(f"{url}/v1/policies", params={"include_archived": True, "limit": 1000}, timeout=30).json()
    return sorted(p["version"] for p in rows if p["name"] == name)


def test_concurrent_publishing_of_one_policy_never_fails_and_keeps_versions_contiguous(
        production: Service, database_url: str) -> None:
    svc = production
    name = "published"
    base = {**POLICY, "name": name}
    assert httpx.post(f"{svc.url}/v1/policies", json=base, timeout=30).status_code == 201
    answers: list[tuple[str, int, Any]] = []
    registered: list[tuple[dict[str, Any], dict[str, Any]]] = []
    lock = threading.Lock()

    for round_ in range(5):
        # every request of a round carries the same new document: the registrations must store it
        # (or reuse one stored by a request of the round) while PUT and POST store new versions
        doc = {**base, "controllers": [{**POLICY["controllers"][0], "setpoint": 0.1 + 0.01 * (round_ + 1)}]}
        barrier = threading.Barrier(24)

        def send(kind: str, doc: dict[str, Any] = doc, barrier: threading.Barrier = barrier) -> None:
            with httpx.Client(base_url=svc.url, timeout=60) as client:
                barrier.wait()
                if kind == "register":
                    r = client.post("/v1/runs", json={"name": "race", "policy": doc, "knobs": KNOBS})
                elif kind == "put":
                    r = client.put(f"/v1/policies/{name}", json=doc)
                else:
                    r = client.post("/v1/policies", json=doc)
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
            with lock:
                answers.append((kind, r.status_code, body))
                if kind == "register" and r.status_code == 201:
                    registered.append((doc, body))

        threads = [threading.Thread(target=send, args=(kind,)) for kind in ("register", "put", "post") * 8]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    failed = [(kind, status, body) for kind, status, body in answers if status != 201]
    assert len(answers) == 120 and not failed, failed[:3]
    versions = _versions(svc.url, name)
    assert versions == list(range(1, len(versions) + 1)), versions
    published = sorted(body["version"] for kind, _, body in answers if kind != "register")
    assert len(set(published)) == len(published) == 80, "every PUT and POST stores a version of its own"
    # every registration runs under a stored version holding exactly the document it carried
    view = StoreView(database_url)
    try:
        for doc, run in registered:
            row = view.store.get_policy(name, run["policy_version"])
            assert row is not None and row.document == run["policy"]
            assert row.document["controllers"][0]["setpoint"] == doc["controllers"][0]["setpoint"]
    finally:
        view.close()


# -- break 11: acknowledgements that cannot be true --------------------------------------------------
def _decided(url: str, run: dict[str, Any]) -> dict[str, Any]:
    """Observations far above the setpoint until the controller orders a decision; the first one."""
    r = post_obs(url, run, [{"seq": s, "step": 30 + s, "probes": {"kl_drift": 0.6}} for s in range(3)])
    assert r.status_code == 200 and r.json()["decisions"], r.text
    return r.json()["decisions"][0]


def _decision_rows(view: StoreView, run_id: str) -> list[tuple[Any, ...]]:
    rows, _ = view.store.list_decisions(run_id)
    return [(d.number, d.step, d.applied_step, d.applied_value, d.skipped) for d in rows]


# (what is wrong with an acknowledgement, the field a refusal names)
IMPOSSIBLE = [
    ({"value": 1e300}, "value"),
    ({"value": -5.0}, "value"),
    ({"value": KNOBS[0]["min"] / 2}, "value"),
    ({"step": 0}, "step"),  # the decision was ordered for a later step
    ({"step": 0, "status": "skipped", "value": None}, "step"),
]


def test_impossible_acknowledgements_are_refused_and_nothing_of_the_request_is_stored(
        service: Service, database_url: str) -> None:
    run = register(service.url, knobs=[{**KNOBS[0], "max": 1e-3, "value": 1e-3}])
    decision = _decided(service.url, run)
    # a true one: applied at the step it was ordered for, a value one rounding above the upper
    # bound (a setter that rescales a schedule reads back a product of floats)
    good = {"number": decision["number"], "status": "applied", "step": decision["step"], "value": 1e-3 * (1 + 1e-12)}
    batch = {"observations": [{"seq": 3, "step": 40, "probes": {"kl_drift": 0.6}}],
             "last_decision": decision["number"]}
    view = StoreView(database_url)
    try:
        before = view.snapshot([run["id"]]), _decision_rows(view, run["id"])
        for wrong, field in IMPOSSIBLE:
            r = httpx.post(f"{service.url}/v1/runs/{run['id']}/observations", headers=bearer(run["token"]),
                           timeout=30, json={**batch, "applied": [good, {**good, **wrong}]})
            assert r.status_code == 422, (wrong, r.text)
            assert [e["loc"] for e in r.json()["detail"]["errors"]] == [f"body.applied.1.{field}"], wrong
            assert "applied" in r.json()["detail"]["message"]  # what the agent's sender looks for
            after = view.snapshot([run["id"]]), _decision_rows(view, run["id"])
            assert after == before, wrong  # neither the observation nor the true acknowledgement beside it

        # the agent's sender drops refused acknowledgements and sends the observation again
        r = httpx.post(f"{service.url}/v1/runs/{run['id']}/observations", headers=bearer(run["token"]), timeout=30,
                       json={**batch, "applied": [good]})
        assert r.status_code == 200, r.text
        stored = {row[0]: row for row in _decision_rows(view, run["id"])}[decision["number"]]
        assert stored[2:4] == (good["step"], good["value"])
        assert view.seqs(run["id"]) == [0, 1, 2, 3]
    finally:
        view.close()


# -- metrics: retired runs leave the multiprocess files ------------------------------------------
def _files_exposition(metrics_dir: Path) -> str:
    """What every scrape of a multiprocess service reads: the merge of all workers' files."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return generate_latest(registry).decode()


def _series(text: str, run: dict[str, Any]) -> list[str]:
    return [line for line in text.splitlines() if f'run="{run["id"]}"' in line]


def test_retired_runs_leave_the_multiprocess_files(two_workers: tuple[Service, Path]) -> None:
    svc, metrics_dir = two_workers
    runs = [register(svc.url, name=f"series-{i}") for i in range(4)]
    live = runs[-1]
    with httpx.Client(timeout=30) as client:  # one connection per request: both workers write series
        for run in runs:
            for seq in range(4):
                r = client.post(f"{svc.url}/v1/runs/{run['id']}/observations", headers={
                    **bearer(run["token"]), "Connection": "close"},
                    json={"observations": [{"seq": seq, "step": seq + 1, "probes": {"kl_drift": 0.4}}]})
                assert r.status_code == 200, r.text
    decided = httpx.get(f"{svc.url}/v1/runs/{live['id']}").json()["decisions"]
    for run in runs[:-1]:
        assert httpx.post(f"{svc.url}/v1/runs/{run['id']}/finish", timeout=30).status_code == 200
    assert all(_series(_files_exposition(metrics_dir), run) for run in runs)

    def retired_everywhere() -> bool:
        scraped = httpx.get(f"{svc.url}/metrics", timeout=30).text  # scrapes reach either worker
        files = _files_exposition(metrics_dir)
        return not any(_series(scraped, run) or _series(files, run) for run in runs[:-1])

    wait_until(retired_everywhere, 30, "the finished runs' series leave /metrics and the files")
    # a late observation of a retired run is stored and brings nothing back
    r = post_obs(svc.url, runs[0], [{"seq": 4, "step": 5, "probes": {"kl_drift": 0.4}}])
    assert r.status_code == 200
    files, scraped = _files_exposition(metrics_dir), httpx.get(f"{svc.url}/metrics").text
    assert not _series(files, runs[0]) and not _series(scraped, runs[0])
    # the running run keeps its series, with their meaning: decisions summed over the workers
    for text in (files, scraped):
        counted = [line for line in _series(text, live) if line.startswith("actuator_decisions_total")
                   and 'reason="controller"' in line]
        assert counted and float(counted[0].rsplit(" ", 1)[1]) == decided > 0
        assert any(line.startswith("actuator_run_state") and 'state="running"} 1.0' in line
                   for line in _series(text, live))
    assert "actuator_observations_ingested_total" in scraped
    assert not [p for p in os.listdir(metrics_dir) if not p.endswith(".db") and p != "retired-runs"]
