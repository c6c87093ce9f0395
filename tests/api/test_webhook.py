"""Issue 57, alerts reach people: with ACTUATOR_WEBHOOK_URL set, the real service under uvicorn
POSTs each guardrail breach, rollback and halt to a real HTTP receiver on loopback, as JSON with the
run, guardrail, reading, threshold, action and console link; a receiver that fails twice gets it on
the third try; a dead receiver never holds ingest up: the queue is bounded and the drops are
counted in /metrics."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from actuator.testing import free_port, make_service, wait_until

POLICY = {"name": "notify", "guardrails": [
    {"name": "a-alert", "probe": "custom.a", "bound": "upper", "threshold": 0.5, "action": "alert"},
    {"name": "b-rollback", "probe": "custom.b", "bound": "upper", "threshold": 0.5, "action": "rollback",
     "knob": "learning_rate", "factor": 0.5},
    {"name": "c-halt", "probe": "custom.c", "bound": "lower", "threshold": 0.25, "action": "halt"}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-2}]


class Receiver:
    """A real HTTP server on loopback keeping every JSON body it accepted; it answers 500 to its
    first ``fail_first`` requests."""

    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[dict] = []
        self.attempts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.attempts += 1
                failing = outer.attempts <= fail_first
                if not failing:
                    outer.bodies.append(body)
                self.send_response(500 if failing else 204)
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=2)
    yield r
    r.close()


def _service(tmp_path, **env: str):
    return make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path),
                        extra_env={f"ACTUATOR_{k.upper()}": v for k, v in env.items()}).start()


def _register(url: str) -> dict:
    r = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS})
    assert r.status_code == 201, r.text
    return r.json()


def _observe(url: str, run: dict, seq: int, probes: dict) -> dict:
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                   json={"observations": [{"seq": seq, "step": seq, "probes": probes}]}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _counted(url: str, outcome: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return float(re.search(rf'actuator_notifications_total\{{outcome="{outcome}"\}} (\S+)', text).group(1))


def test_breach_rollback_and_halt_reach_the_webhook_with_their_numbers_after_two_failures(tmp_path, receiver):
    svc = _service(tmp_path, webhook_url=receiver.url, webhook_backoff="0.05", webhook_retries="3",
                   public_url="https://actuator.example")
    try:
        run = _register(svc.url)
        healthy = {"custom.a": 0.0, "custom.b": 0.0, "custom.c": 1.0}
        _observe(svc.url, run, 0, healthy)
        _observe(svc.url, run, 1, {**healthy, "custom.a": 0.75})  # alert
        _observe(svc.url, run, 2, {**healthy, "custom.b": 2.0})  # rollback
        assert _observe(svc.url, run, 3, {**healthy, "custom.c": 0.125})["state"] == "halted"
        wait_until(lambda: len(receiver.bodies) == 3, 30, "three notifications")
        assert receiver.attempts == 5  # the first one failed twice, then each went through at once
        console = f"https://actuator.example/ui/runs/{run['id']}"
        alert, rollback, halt = receiver.bodies
        assert alert == {"event": "breach", "run": run["id"], "step": 1, "guardrail": "a-alert", "probe": "custom.a",
                         "reading": 0.75, "threshold": 0.5, "action": "alert", "console": console,
                         "reason": "guardrail a-alert: custom.a 0.75 above threshold 0.5 (alert)"}
        assert rollback["event"] == "rollback" and rollback["guardrail"] == "b-rollback"
        assert (rollback["reading"], rollback["threshold"], rollback["step"]) == (2.0, 0.5, 2)
        assert halt["event"] == "halt" and halt["guardrail"] == "c-halt" and halt["probe"] == "custom.c"
        assert (halt["reading"], halt["threshold"], halt["step"]) == (0.125, 0.25, 3)
        assert halt["reason"] == "guardrail c-halt: custom.c 0.125 below threshold 0.25 at step 3 (halt)"
        # what the service stored says the same
        events = httpx.get(f"{svc.url}/v1/runs/{run['id']}/events").json()
        stored = [e["payload"] for e in events if e["kind"] == "guardrail_breach"]
        assert [(p["guardrail"], p["value"], p["threshold"], p["reason"]) for p in stored] == [
            (b["guardrail"], b["reading"], b["threshold"], b["reason"]) for b in receiver.bodies]
        assert (_counted(svc.url, "sent"), _counted(svc.url, "failed"), _counted(svc.url, "dropped")) == (3, 0, 0)
    finally:
        svc.stop()


def test_a_dead_receiver_never_holds_ingest_the_queue_is_bounded_and_drops_are_counted(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    # the first notification waits 60 s before its retry: the queue of 2 behind it fills
    svc = _service(tmp_path, webhook_url=dead, webhook_queue="2", webhook_retries="3", webhook_backoff="60")
    try:
        run = _register(svc.url)
        breaches = 10
        for i in range(breaches):
            _observe(svc.url, run, 2 * i, {"custom.a": 1.0, "custom.c": 1.0})  # breach
            _observe(svc.url, run, 2 * i + 1, {"custom.a": 0.0, "custom.c": 1.0})  # cleared
        state = httpx.get(f"{svc.url}/v1/runs/{run['id']}").json()
        assert state["last_seq"] == 2 * breaches - 1  # every observation stored
        # one in delivery, at most two queued: every other was dropped, and counted
        dropped = _counted(svc.url, "dropped")
        assert breaches - 3 <= dropped <= breaches - 2, dropped
        assert _counted(svc.url, "sent") == 0
    finally:
        svc.stop()
    assert "webhook queue full (2)" in open(svc.log_path).read()
