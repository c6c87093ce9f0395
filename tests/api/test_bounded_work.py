"""Issue 17, break 5 (unbounded work per request) and the seq column: every answer is bounded
whatever the run's length, or refused with a 4xx naming the limit. The limits are set small
through the environment, so a short run exceeds them; real uvicorn, SQLite and Postgres."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actuator.client import ActuatorClient
from actuator.models import PolicyRow
from actuator.policy import PolicyDocument
from actuator.schemas import MAX_INT, ObservationCreate
from actuator.store import Store
from actuator.agents.sender import BackgroundSender

from actuator.testing import Service, make_service

# Every observation moves the learning rate: the drift alternates far above and below the setpoint.
POLICY = {"name": "bounded", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                              "setpoint": 0.1, "kp": 2.0}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]
LIMITS = {"ACTUATOR_MAX_PENDING_DECISIONS": "5", "ACTUATOR_REPORT_POINTS": "10", "ACTUATOR_REPORT_DECISIONS": "3",
          "ACTUATOR_REPORT_EVENTS": "2", "ACTUATOR_REPORT_PANELS": "4", "ACTUATOR_SIMULATE_OBSERVATIONS": "20",
          "ACTUATOR_POLICY_PAGE_BYTES": "1000000"}


@pytest.fixture
def svc(database_url: str, tmp_path: Path) -> Iterator[Service]:
    service = make_service(database_url, log_dir=str(tmp_path), extra_env=LIMITS).start()
    yield service
    service.stop()


def register(url: str, policy: dict = POLICY) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"name": "long", "policy": policy, "knobs": KNOBS})
    assert r.status_code == 201, r.text
    return r.json()


def post(url: str, run: dict, observations: list[dict], last_decision: int = 0) -> httpx.Response:
    return httpx.post(f"{url}/v1/runs/{run['id']}/observations", timeout=30,
                      headers={"Authorization": f"Bearer {run['token']}"},
                      json={"observations": observations, "last_decision": last_decision})


def drift(seq: int) -> dict:
    return {"seq": seq, "step": seq + 1, "probes": {"kl_drift": 0.5 if seq % 2 else 0.01}}


def long_run(url: str, n: int) -> tuple[dict, int]:
    """A run of ``n`` observations whose agent applied every decision as it came (no backlog)."""
    run = register(url)
    last = 0
    for start in range(0, n, 4):  # at most 4 decisions per answer: under the cap of 5
        r = post(url, run, [drift(s) for s in range(start, min(n, start + 4))], last_decision=last)
        assert r.status_code == 200 and not r.json()["more_decisions"], r.text
        last = max([last, *(d["number"] for d in r.json()["decisions"])])
    return run, last


def test_ingest_answer_carries_at_most_the_cap_and_says_there_are_more(svc):
    run, decided = long_run(svc.url, 12)
    assert decided > 5  # more than one answer holds
    numbers: list[int] = []
    last, seq = 0, 12
    while True:  # an agent that lost its place asks from 0, then from the last number it got
        r = post(svc.url, run, [drift(seq)], last_decision=last)
        seq += 1
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["decisions"]) <= 5
        numbers += [d["number"] for d in body["decisions"]]
        if not body["more_decisions"]:
            break
        assert len(body["decisions"]) == 5
        last = numbers[-1]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= decided


def test_the_agent_fetches_the_rest_at_once(svc):
    """The background sender follows a capped answer up straight away (the callback then applies
    every decision, in order, at its next step boundary)."""
    run, decided = long_run(svc.url, 12)
    with ActuatorClient(svc.url) as client:
        sender = BackgroundSender(client, run_id=run["id"], token=run["token"])
        sender.submit(ObservationCreate(**drift(12)))
        assert sender.flush(30)
        results = sender.results()
        sender.close()
    got = [d.number for r in results for d in r.decisions]
    assert got == list(range(1, len(got) + 1)) and len(got) > decided, got
    assert [r.more_decisions for r in results][-1] is False and len(results) >= 3
    assert sender.stats.sent == 1  # the follow-ups repeat the last observation: not counted twice
    state = httpx.get(f"{svc.url}/v1/runs/{run['id']}").json()
    assert state["last_seq"] == 12


def test_report_is_downsampled_and_capped(svc):
    run, decided = long_run(svc.url, 50)
    for action in ("pause", "resume"):
        assert httpx.post(f"{svc.url}/v1/runs/{run['id']}/{action}").status_code == 200
    r = httpx.get(f"{svc.url}/v1/runs/{run['id']}/report", timeout=30)
    assert r.status_code == 200, r.text
    report = r.json()
    points = report["probes"]["kl_drift"]
    assert 5 <= len(points) <= 11, len(points)
    assert points[0][0] == 1 and points[-1][0] == 50  # the first and the last observation are kept
    assert report["sampling"]["observations"] == 50 and report["sampling"]["every"] == 5
    assert [d["number"] for d in report["decisions"]] == list(range(decided - 2, decided + 1))  # the latest
    assert report["decisions_omitted"] == decided - 3
    assert [e["kind"] for e in report["events"]] == ["control_resumed", "state"]  # the latest
    assert report["events_omitted"] == 3
    html = httpx.get(f"{svc.url}/v1/runs/{run['id']}/report", params={"format": "html"}, timeout=60)
    assert html.status_code == 200 and f"{decided - 3} earlier decisions are not listed" in html.text


def test_png_draws_a_bounded_number_of_panels(svc):
    run = register(svc.url)
    many = {f"probe_{i:02d}": 0.1 * i for i in range(40)}
    r = post(svc.url, run, [{"seq": s, "step": s + 1, "probes": {**many, "kl_drift": 0.1}} for s in range(30)])
    assert r.status_code == 200, r.text
    # The drawing is bounded by its size (panels, points); its time is measured by the benchmark
    # (benchmarks/load/longrun.py), not asserted on these shared cores.
    png = httpx.get(f"{svc.url}/v1/runs/{run['id']}/report", params={"format": "png"}, timeout=120)
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    width, height = struct.unpack(">II", png.content[16:24])  # the IHDR chunk
    assert height <= 4 * 2.4 * 90 + 10, height  # 4 panels of 2.4 in at 90 dpi, not 41


def test_simulate_refuses_a_run_over_the_limit_and_replays_a_prefix(svc):
    run, _ = long_run(svc.url, 30)
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": POLICY, "run_id": run["id"]}, timeout=30)
    assert r.status_code == 422, r.text
    assert "20" in r.json()["detail"]["message"] and r.json()["detail"]["errors"][0]["loc"] == "body.run_id"
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": POLICY, "run_id": run["id"], "limit": 21})
    assert r.status_code == 422 and r.json()["detail"]["errors"][0]["loc"] == "body.limit", r.text
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": POLICY, "run_id": run["id"], "limit": 20})
    assert r.status_code == 200, r.text
    assert r.json()["observations"] == 20 and r.json()["observations_total"] == 30 and len(r.json()["trace"]) == 20


def test_policies_and_events_are_paged(svc):
    for v in range(5):
        assert httpx.post(f"{svc.url}/v1/policies", json={**POLICY, "description": f"v{v}"}).status_code == 201
    page = httpx.get(f"{svc.url}/v1/policies", params={"limit": 2}).json()
    assert [(p["name"], p["version"]) for p in page] == [("bounded", 1), ("bounded", 2)]
    rest = httpx.get(f"{svc.url}/v1/policies", params={"limit": 2, "offset": 4}).json()
    assert [p["version"] for p in rest] == [5]
    assert httpx.get(f"{svc.url}/v1/policies", params={"limit": 1001}).status_code == 422

    run = register(svc.url)
    for action in ("pause", "resume", "pause", "resume"):
        assert httpx.post(f"{svc.url}/v1/runs/{run['id']}/{action}").status_code == 200
    first = httpx.get(f"{svc.url}/v1/runs/{run['id']}/events", params={"limit": 2}).json()
    assert [e["kind"] for e in first] == ["run_registered", "control_paused"]
    after = httpx.get(f"{svc.url}/v1/runs/{run['id']}/events", params={"after": first[-1]["id"]}).json()
    assert [e["kind"] for e in after] == ["state", "control_resumed", "state", "control_paused", "state",
                                          "control_resumed", "state"]


def test_a_page_of_policies_stops_before_its_byte_budget(database_url):
    from actuator.migrate import upgrade

    upgrade(database_url)
    store = Store(database_url)
    try:
        doc = PolicyDocument.model_validate({**POLICY, "description": "x" * 2000})
        for _ in range(6):
            store.create_policy(doc)
        size = len(store.list_policies(limit=1)[0].document["description"])
        page = store.list_policies(limit=100, max_bytes=3 * size)
        assert 1 <= len(page) < 6 and [p.version for p in page] == list(range(1, len(page) + 1))
        assert [p.version for p in store.list_policies(limit=100, max_bytes=1)] == [1]  # one at least
        assert len(store.list_policies(limit=100)) == 6 == store.count(PolicyRow)
    finally:
        store.close()


def test_setpoint_schedule_is_capped(svc):
    schedule = [[i, 0.1] for i in range(1001)]
    bad = {"name": "sched", "controllers": [{**POLICY["controllers"][0], "setpoint": schedule}]}
    r = httpx.post(f"{svc.url}/v1/policies", json=bad)
    assert r.status_code == 422, r.text
    assert any(e["loc"].startswith("controllers.0.setpoint") and "1000" in e["msg"] for e in r.json()["detail"]["errors"])
    run = register(svc.url)
    r = httpx.put(f"{svc.url}/v1/runs/{run['id']}/controllers/drift/setpoint", json={"setpoint": schedule})
    assert r.status_code == 422 and "body.setpoint" in r.text and "1000" in r.text, r.text
    ok = httpx.put(f"{svc.url}/v1/runs/{run['id']}/controllers/drift/setpoint", json={"setpoint": schedule[:1000]})
    assert ok.status_code == 200, ok.text


def test_seq_past_32_bits_still_appends_and_a_leap_is_refused(svc):
    from actuator.schemas import MAX_SEQ_GAP

    run = register(svc.url)
    assert post(svc.url, run, [{"seq": MAX_INT, "step": 1}]).status_code == 200
    r = post(svc.url, run, [{"seq": MAX_INT + 1, "step": 2, "probes": {"kl_drift": 0.1}}])
    assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    assert httpx.get(f"{svc.url}/v1/runs/{run['id']}").json()["last_seq"] == MAX_INT + 1
    # no single observation can use up a run's sequence numbers
    r = post(svc.url, run, [{"seq": MAX_INT + 2 + MAX_SEQ_GAP, "step": 3}])
    assert r.status_code == 422, r.text
    assert r.json()["detail"]["errors"][0]["loc"] == "body.observations.0.seq"
    assert post(svc.url, run, [{"seq": MAX_INT + 1 + MAX_SEQ_GAP, "step": 3}]).status_code == 200
