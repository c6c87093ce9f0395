"""The run console after a Redis restart, in a real headless Chromium against the real service
(Postgres and Redis): what was stored while Redis was down never reached the live stream, and the
page shows it anyway, because the stream's `gap` event makes it re-read the run from the REST API."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import httpx
from selenium.webdriver.common.by import By

from actuator.testing import make_service, start_redis

sys.path.insert(0, str(Path(__file__).parent.parent / "hardening"))
from harden import post_obs, register, restart_redis_same_port, wait_until  # noqa: E402

# Deadlines are for a loaded machine (the suite runs two workers beside the service, Postgres, Redis
# and Chromium on 2 cores): each wait ends as soon as the page shows what it waits for.
POLICY = {"name": "console-resync", "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper",
                                                    "threshold": 0.8, "action": "alert"}]}


def _page(browser, script: str):  # type: ignore[no-untyped-def]
    return browser.execute_script(script)


def test_the_console_shows_what_the_stream_missed_during_a_redis_restart(postgres, browser, tmp_path):
    server = start_redis()
    db = postgres.create_database(f"resync_{uuid.uuid4().hex[:12]}")
    svc = make_service(db, redis_url=server.url, log_dir=str(tmp_path)).start()
    try:
        run = register(svc.url, policy=POLICY)
        r = post_obs(svc.url, run, [{"seq": s, "step": s + 1, "probes": {"kl_drift": 0.1}} for s in range(5)])
        assert r.status_code == 200, r.text
        browser.get(f"{svc.url}/ui/runs/{run['id']}")
        wait_until(lambda: _page(browser, "return document.body.dataset.ready === '1' && "
                                          "document.body.dataset.stream === 'open'"), 60, "the page following")
        assert browser.find_element(By.ID, "run-step").text == "5"

        server.stop()
        wait_until(lambda: _page(browser, "return document.body.dataset.stream === 'closed'"), 60,
                   "the page to see its stream end")
        # Stored (the store is Postgres) and answered (control needs the store, not Redis), but never
        # published: no event is live.
        r = post_obs(svc.url, run, [{"seq": 5, "step": 6, "probes": {"kl_drift": 0.9}}])
        assert r.status_code == 200 and r.json()["breached"] == ["cap"], r.text
        stored = httpx.get(f"{svc.url}/v1/runs/{run['id']}/events", params={"limit": 100}).json()
        assert "guardrail_breach" in [e["kind"] for e in stored]
        server.proc = restart_redis_same_port(server).proc

        # The page reconnects by itself, is told its numbering was lost, and re-reads the run.
        breach = "#events tbody tr[data-kind='guardrail_breach']"
        wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, breach), 60, "the breach stored during the outage")
        wait_until(lambda: browser.find_element(By.ID, "run-step").text == "6", 30, "the step stored during the outage")
        assert _page(browser, "return document.body.dataset.stream") == "open"
        assert int(_page(browser, "return document.body.dataset.resyncs")) >= 1
        browser.get("about:blank")  # close the page's stream before the service stops
    finally:
        svc.stop()
        server.stop()
