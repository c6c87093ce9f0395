"""`actuator serve` stops promptly on SIGTERM while a live stream is open (a console tab left open,
a dashboard following a run). A stream whose client stays ends only at its `max_seconds` (an hour
by default): without a graceful-shutdown limit, uvicorn waited for it, so a deploy's restart or a
`docker stop` hung until the orchestrator killed the service."""

from __future__ import annotations

import signal
import threading
import time

import httpx

from actuator.testing import make_service


def test_serve_stops_within_seconds_of_sigterm_with_a_live_stream_open(tmp_path):
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path), serve_args=[]).start()
    try:
        r = httpx.post(f"{svc.url}/v1/runs", json={"policy": {"name": "quiet"}, "knobs": [
            {"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]})
        assert r.status_code == 201, r.text
        opened = threading.Event()

        def follow() -> None:  # a client that stays: reads until the server closes the stream
            try:
                with httpx.stream("GET", f"{svc.url}/v1/runs/{r.json()['id']}/stream",
                                  timeout=httpx.Timeout(5.0, read=None)) as resp:
                    assert resp.status_code == 200
                    opened.set()
                    for _ in resp.iter_raw():
                        pass
            except httpx.HTTPError:
                pass

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(30), "the stream did not open"
        time.sleep(0.5)
        assert svc.proc is not None
        started = time.monotonic()
        svc.proc.send_signal(signal.SIGTERM)
        svc.proc.wait(60)  # without the limit: the stream's max_seconds (3600 s), past this wait
        took = time.monotonic() - started
        assert took < 15, f"actuator serve took {took:.1f} s to stop with a stream open"
        assert "Traceback" not in svc.logs(), svc.logs()
    finally:
        svc.kill()
