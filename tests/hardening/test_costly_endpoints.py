"""What costs more than a read (a simulation, a validation, a plot) is the admin's when a token is
set, runs in worker processes off the serving one, and is bounded: a concurrency cap per kind
(429 with Retry-After past it), a capped answer (the limit named in the 422 when a request asks
for more), and a request whose client goes away stops its work (its worker process is ended).

Against the real service under uvicorn on Postgres, with an admin token."""

from __future__ import annotations

import json
import socket
import struct
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from actuator.testing import make_service
from actuator.testing import HEAVY_KNOBS as KNOBS, HEAVY_POLICY as HEAVY, heavy_probes as probes
from harden import bearer, post_obs, register, wait_until

ADMIN = "admin-" + uuid.uuid4().hex
OBSERVATIONS = 5000
SETTINGS = {"ACTUATOR_SIMULATE_CONCURRENCY": "1", "ACTUATOR_WORKER_PROCESSES": "2",
            "ACTUATOR_SIMULATE_DECISIONS": "50", "ACTUATOR_SIMULATE_TRACE_POINTS": "40"}


@pytest.fixture(scope="module")
def env(postgres, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("costly")
    db = postgres.create_database(f"costly_{uuid.uuid4().hex[:8]}")
    svc = make_service(db, admin_token=ADMIN, log_dir=str(tmp), extra_env=SETTINGS).start()
    try:
        run = register(svc.url, admin=ADMIN, policy=HEAVY, knobs=KNOBS, name="heavy")
        for start in range(0, OBSERVATIONS, 1000):
            r = post_obs(svc.url, run, [{"seq": i, "step": i + 1, "probes": probes(i)}
                                        for i in range(start, start + 1000)], timeout=300)
            assert r.status_code == 200, r.text
        yield svc, run
    finally:
        svc.stop()


def _admin(**kw):  # type: ignore[no-untyped-def]
    return {"headers": bearer(ADMIN), "timeout": 300, **kw}


def descendants(pid: int) -> dict[int, str]:
    """Live descendants of ``pid`` (not zombies): pid → command line."""
    parents, cmds = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if state != "Z":
            parents[int(entry.name)], cmds[int(entry.name)] = int(ppid), cmd
    out = {}
    for p in parents:
        q = p
        while q in parents and q != pid:
            q = parents[q]
            if q == pid:
                out[p] = cmds[p]
    return out


def workers(svc) -> set[int]:  # type: ignore[no-untyped-def]
    """The service's worker processes (spawned by multiprocessing; not its resource tracker)."""
    return {p for p, cmd in descendants(svc.proc.pid).items() if "spawn_main" in cmd}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def raw_post(svc, path: str, body: dict) -> socket.socket:  # type: ignore[no-untyped-def]
    """A request sent over a socket the test controls (to abandon it: :func:`abandon`)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", svc.port), timeout=30)
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{svc.port}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\nAuthorization: Bearer {ADMIN}\r\n\r\n".encode() + data)
    return s


def abandon(s: socket.socket) -> None:
    """The client goes away: the connection is reset."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def heavy_simulation(svc, run) -> socket.socket:  # type: ignore[no-untyped-def]
    """A simulation of seconds of CPU, running in a worker process of the service when this returns."""
    s = raw_post(svc, "/v1/policies/simulate", {"policy": HEAVY, "run_id": run["id"]})
    wait_until(lambda: _busy(workers(svc)), 120, "the simulation running in a worker process")
    return s


def test_costly_endpoints_need_the_admin_token(env):
    svc, run = env
    sim = {"policy": HEAVY, "run_id": run["id"], "limit": 20}
    costly = [("POST", "/v1/policies/simulate", sim), ("POST", "/v1/policies/validate", HEAVY),
              ("GET", f"/v1/runs/{run['id']}/report?format=png", None),
              ("GET", f"/v1/runs/{run['id']}/report?format=html", None)]
    for method, path, body in costly:
        r = httpx.request(method, svc.url + path, json=body, timeout=300)
        assert r.status_code == 401, (path, r.status_code, r.text)
        r = httpx.request(method, svc.url + path, json=body, headers=bearer(run["token"]), timeout=300)
        assert r.status_code == 403, (path, r.status_code, r.text)
        r = httpx.request(method, svc.url + path, json=body, **_admin())
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
    # the work ran in worker processes of the service, not in the process serving requests, and at
    # a lower CPU priority than it (niceness +10, ACTUATOR_WORKER_NICE)
    assert workers(svc), descendants(svc.proc.pid)
    assert {_nice(p) - _nice(svc.proc.pid) for p in workers(svc)} == {10}


def _nice(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[16])


def test_a_simulation_answer_is_capped_and_a_request_for_more_is_refused_naming_the_limit(env):
    svc, run = env
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": HEAVY, "run_id": run["id"], "limit": 300},
                   **_admin())
    assert r.status_code == 200, r.text
    sim = r.json()
    assert sim["observations"] == 300
    assert sim["decisions_total"] > 50 and len(sim["decisions"]) == 50, (sim["decisions_total"], len(sim["decisions"]))
    assert [d["step"] for d in sim["decisions"]] == sorted(d["step"] for d in sim["decisions"])  # the first ones
    assert len(sim["events"]) <= 50 and sim["events_total"] >= len(sim["events"])
    assert len(sim["trace"]) <= 40 and sim["trace_every"] > 1
    assert sim["trace"][0]["step"] == 1 and sim["trace"][-1]["step"] == 300  # every k-th and the last
    steps = [t["step"] for t in sim["trace"][:-1]]
    assert steps == list(range(1, 301, sim["trace_every"]))[:len(steps)]
    # asking for more than the caps: 422 naming the field and the setting
    for field, value, setting in (("max_decisions", 51, "ACTUATOR_SIMULATE_DECISIONS"),
                                  ("trace_points", 41, "ACTUATOR_SIMULATE_TRACE_POINTS")):
        r = httpx.post(f"{svc.url}/v1/policies/simulate",
                       json={"policy": HEAVY, "run_id": run["id"], "limit": 300, field: value}, **_admin())
        assert r.status_code == 422, r.text
        assert r.json()["detail"]["errors"][0]["loc"] == f"body.{field}" and setting in r.text, r.text
    # fewer is allowed
    r = httpx.post(f"{svc.url}/v1/policies/simulate",
                   json={"policy": HEAVY, "run_id": run["id"], "limit": 300, "max_decisions": 5, "trace_points": 10},
                   **_admin())
    assert r.status_code == 200 and len(r.json()["decisions"]) == 5 and len(r.json()["trace"]) <= 10, r.text


def test_past_the_concurrency_cap_a_simulation_is_refused_with_429_and_retry_after(env):
    svc, run = env
    s = heavy_simulation(svc, run)
    try:
        r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": HEAVY, "run_id": run["id"], "limit": 5},
                       **_admin())
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) > 0
        assert "ACTUATOR_SIMULATE_CONCURRENCY" in r.json()["detail"]["message"], r.text
        # the cap is per kind: a validation still runs (in the other worker process)
        r = httpx.post(f"{svc.url}/v1/policies/validate", json=HEAVY, **_admin())
        assert r.status_code == 200 and r.json()["valid"], r.text
    finally:
        abandon(s)
    # the abandoned simulation gave its turn back
    wait_until(lambda: httpx.post(f"{svc.url}/v1/policies/simulate",
                                  json={"policy": HEAVY, "run_id": run["id"], "limit": 5}, **_admin()).status_code
               == 200, 120, "a simulation after the abandoned one", interval=0.5)


def test_an_abandoned_simulation_stops_its_work(env):
    svc, run = env
    s = heavy_simulation(svc, run)
    running = workers(svc)
    abandon(s)
    # the worker doing it is ended at once (a finished job leaves its worker alive for the next)
    wait_until(lambda: any(not alive(p) for p in running), 60, "the abandoned simulation's worker process to end")
    assert "Traceback" not in svc.logs(), svc.logs()[-3000:]
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": HEAVY, "run_id": run["id"], "limit": 5},
                   **_admin())
    assert r.status_code == 200, r.text


def _busy(pids: set[int]) -> bool:
    """Whether one of ``pids`` is using CPU now (its CPU time grows over 0.3 s)."""
    def cpu(p: int) -> int:
        try:
            f = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            return -1
        fields = f[f.rindex(")") + 2:].split()
        return int(fields[11]) + int(fields[12])

    before = {p: cpu(p) for p in pids}
    threading.Event().wait(0.3)
    return any(cpu(p) >= before[p] + 3 and before[p] >= 0 for p in pids)  # >= 30 ms of CPU in 0.3 s
