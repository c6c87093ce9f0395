"""Live event streams (SSE) against the real service: stable ids past the trimmed window, exact
resume with Last-Event-ID, trimmed events and ids of a lost numbering reported as a gap, a
malformed Last-Event-ID refused, and idle streams that cost Redis nothing but one shared blocking
read (and one check of every followed run's last id per block). On the in-process backend and on
Redis."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from actuator.testing import Service, make_service

# No controllers, no guardrails: each observation is exactly one event.
QUIET = {"name": "quiet"}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]
N_EVENTS = 3000  # three times what the live state keeps per run


@pytest.fixture(params=["memory", "redis"])
def live_service(request: pytest.FixtureRequest, tmp_path) -> Iterator[Service]:
    redis_url = request.getfixturevalue("redis_server").url if request.param == "redis" else None
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", redis_url=redis_url, log_dir=str(tmp_path)).start()
    yield svc
    svc.stop()


def sse(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """Events as the SSE spec parses them: fields until a blank line; ``:`` lines are comments."""
    event: dict[str, Any] = {}
    for line in resp.iter_lines():
        if line == "":
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            yield {"comment": line[1:].strip()}
        else:
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def number(event_id: str) -> tuple[str, int]:
    """An SSE id ``<epoch>-<n>`` as (epoch, n)."""
    epoch, _, n = event_id.rpartition("-")
    return epoch, int(n)


def register(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/runs", json={"policy": QUIET, "knobs": KNOBS})
    assert r.status_code == 201, r.text
    return r.json()


def post_observations(url: str, run: dict[str, Any], seqs: range) -> None:
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {run['token']}"}) as c:
        for start in range(seqs.start, seqs.stop, 100):
            batch = [{"seq": s, "step": s + 1, "probes": {"kl_drift": 0.1}}
                     for s in range(start, min(start + 100, seqs.stop))]
            r = c.post(f"{url}/v1/runs/{run['id']}/observations", json={"observations": batch})
            assert r.status_code == 200, r.text


def read_stream(url: str, run_id: str, *, last_event_id: str | None = None, seconds: float = 3.0,
                until_seq: int | None = None, ready: threading.Event | None = None,
                got: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The events of one connection (comments dropped), until ``until_seq`` or the stream ends."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    got = [] if got is None else got
    with httpx.stream("GET", f"{url}/v1/runs/{run_id}/stream", params={"max_seconds": seconds},
                      headers=headers, timeout=seconds + 30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for ev in sse(resp):
            if ready is not None:
                ready.set()
            if "data" not in ev:
                continue
            ev["json"] = json.loads(ev["data"])
            got.append(ev)
            if until_seq is not None and ev["json"].get("seq") == until_seq:
                break
    return got


def test_all_events_arrive_in_order_and_reconnect_resumes_exactly(live_service):
    url = live_service.url
    run = register(url)
    ready = threading.Event()
    received: list[dict[str, Any]] = []
    listener = threading.Thread(target=read_stream, args=(url, run["id"]),
                                kwargs={"seconds": 120, "until_seq": N_EVENTS - 1, "ready": ready, "got": received})
    listener.start()
    assert ready.wait(10)  # the stream is open (its retry field arrived)
    for start in range(0, N_EVENTS, 100):
        post_observations(url, run, range(start, start + 100))
        # A client slower than ingest would see honest gaps (tested below); this one is kept
        # within 500 events of the publisher, so every event must arrive.
        deadline = time.monotonic() + 30
        while len(received) < start - 400 and time.monotonic() < deadline:
            time.sleep(0.01)
    listener.join(120)
    assert not listener.is_alive()
    # Every event, in order, each once, ids 1..N of one epoch: nothing skipped past the trimmed window.
    epoch = number(received[0]["id"])[0]
    assert [number(e["id"]) for e in received] == [(epoch, n) for n in range(1, N_EVENTS + 1)]
    assert [e["json"]["seq"] for e in received] == list(range(N_EVENTS))
    assert {e["event"] for e in received} == {"observation"}

    # Reconnect after event 2,500 (still kept): exactly 2,501..N, no gap.
    rest = read_stream(url, run["id"], last_event_id=f"{epoch}-2500", seconds=2)
    assert [number(e["id"]) for e in rest] == [(epoch, n) for n in range(2501, N_EVENTS + 1)]
    assert [e["json"]["seq"] for e in rest] == list(range(2500, N_EVENTS))

    # Reconnect after event 10 (long trimmed): one gap event names what is gone, then the rest.
    resumed = read_stream(url, run["id"], last_event_id=f"{epoch}-10", seconds=2)
    gap = resumed[0]
    assert gap["event"] == "gap" and gap["json"]["reason"] == "trimmed" and gap["json"]["first"] == 11
    first_kept = gap["json"]["last"] + 1
    assert 1000 < first_kept <= N_EVENTS - 1000 + 1  # about the last 1,000 are kept
    assert gap["id"] == f"{epoch}-{first_kept - 1}"  # a reconnect after the gap does not report it again
    assert [number(e["id"]) for e in resumed[1:]] == [(epoch, n) for n in range(first_kept, N_EVENTS + 1)]

    # Live events keep flowing to a reconnected client, numbered on.
    ready = threading.Event()
    more: list[dict[str, Any]] = []
    listener = threading.Thread(target=lambda: more.extend(
        read_stream(url, run["id"], last_event_id=f"{epoch}-{N_EVENTS}", seconds=60, until_seq=N_EVENTS + 4,
                    ready=ready)))
    listener.start()
    assert ready.wait(10)
    post_observations(url, run, range(N_EVENTS, N_EVENTS + 5))
    listener.join(60)
    assert [number(e["id"]) for e in more] == [(epoch, n) for n in range(N_EVENTS + 1, N_EVENTS + 6)]


def test_last_event_id_ahead_of_the_live_state_is_reported_not_ignored(live_service):
    """Live state that lost its events (Redis restarted, service restarted on the in-process
    backend) numbers again from 1 in a new epoch: a client ahead of it, or of another epoch, is
    told, then gets what there is. The gap's id resumes there without another gap."""
    url = live_service.url
    run = register(url)
    post_observations(url, run, range(3))
    epoch = number(read_stream(url, run["id"], seconds=1)[0]["id"])[0]
    for lost in (f"{epoch}-5000", "5000", f"{int(epoch) - 1}-2"):
        got = read_stream(url, run["id"], last_event_id=lost, seconds=1)
        assert got[0]["event"] == "gap" and got[0]["json"]["reason"] == "restarted", lost
        assert got[0]["id"] == f"{epoch}-0"
        assert [number(e["id"]) for e in got[1:]] == [(epoch, 1), (epoch, 2), (epoch, 3)]
    assert [number(e["id"]) for e in read_stream(url, run["id"], last_event_id=got[0]["id"], seconds=1)] == [
        (epoch, 1), (epoch, 2), (epoch, 3)]


def test_a_malformed_last_event_id_is_refused_naming_the_header(live_service):
    """Refused before the stream starts (not taken as "from the start", which hid what was missed)."""
    run = register(live_service.url)
    for bad in ("abc", "1-2-3", "-5", "1.5", "1" * 20, "1-" + "9" * 20):
        r = httpx.get(f"{live_service.url}/v1/runs/{run['id']}/stream", params={"max_seconds": 1},
                      headers={"Last-Event-ID": bad})
        assert r.status_code == 422, (bad, r.status_code)
        assert [e["loc"] for e in r.json()["detail"]["errors"]] == ["header.last-event-id"], r.text


def test_stream_of_unknown_run_is_404(live_service):
    r = httpx.get(f"{live_service.url}/v1/runs/nope/stream", params={"max_seconds": 1})
    assert r.status_code == 404


def _commands(r: redis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}


IDLE_S = 4.0  # the idle window: ACTUATOR_STREAM_KEEPALIVE=1 pings every stream several times in it


def test_idle_streams_cost_one_shared_blocking_read(redis_server, tmp_path):
    """Twenty open streams with nothing to say: over an idle window Redis sees no reads but the
    one shared blocking XREAD of this worker (re-armed at most every 10 s) and, once per block,
    one script call reading each followed run's last id (per run, not per stream), and every
    stream gets a keep-alive ping every ACTUATOR_STREAM_KEEPALIVE seconds (1 here, 15 by
    default). Counted by Redis itself (INFO commandstats), not by timing."""
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", redis_url=redis_server.url, log_dir=str(tmp_path),
                       extra_env={"ACTUATOR_STREAM_KEEPALIVE": "1"}).start()
    r = redis.Redis.from_url(redis_server.url)
    try:
        runs = [register(svc.url) for _ in range(4)]
        post_observations(svc.url, runs[0], range(5))  # one run has history: catch-up then idle
        pings = [0] * 20
        opened = [threading.Event() for _ in pings]
        fresh = [threading.Event() for _ in pings]  # an event posted after the idle window arrived

        def listen(i: int) -> None:
            url = f"{svc.url}/v1/runs/{runs[i % 4]['id']}/stream"
            with (contextlib.suppress(httpx.HTTPError),  # cut when the service stops
                  httpx.stream("GET", url, params={"max_seconds": 30}, timeout=60) as resp):
                for ev in sse(resp):
                    opened[i].set()
                    if "comment" in ev:
                        pings[i] += 1
                    elif "data" in ev and json.loads(ev["data"]).get("seq") == 100:
                        fresh[i].set()
                        return

        threads = [threading.Thread(target=listen, args=(i,), daemon=True) for i in range(len(pings))]
        for t in threads:
            t.start()
        assert all(o.wait(10) for o in opened)
        time.sleep(1.0)  # catch-up reads done
        r.config_resetstat()
        pinged = list(pings)
        time.sleep(IDLE_S)
        calls = _commands(r)
        calls.pop("info", None)
        calls.pop("config|resetstat", None)
        blocks = calls.pop("xread", 0)
        assert blocks <= 2, calls  # one blocking read, re-armed after its 10 s block
        # The check of each block: one script call (a first try fails while the script is not
        # loaded), whose XREVRANGE per followed run Redis counts too.
        loads = calls.pop("script|load", 0)
        assert calls.pop("evalsha", 0) - loads <= blocks, calls
        assert calls.pop("xrevrange", 0) <= blocks * len(runs), calls
        assert calls == {}, f"idle streams read Redis: {calls}"
        # keep-alive: every stream pinged while idle, at the configured interval (not FastAPI's 15 s)
        assert all(now - before >= IDLE_S - 2 for now, before in zip(pings, pinged)), (pings, pinged)
        # and they are live: a new event reaches every stream of its run at once
        post_observations(svc.url, runs[1], range(100, 101))
        assert all(fresh[i].wait(5) for i in range(1, 20, 4))
        assert not any(fresh[i].is_set() for i in range(20) if i % 4 != 1)
    finally:
        r.close()
        svc.stop()
