"""Transport bounds, against the real service under uvicorn (`actuator serve` where the bound is
the server's): a request body must arrive within ACTUATOR_BODY_TIMEOUT of its head (408, and the
connection is closed), even when thousands of slow bodies meet a low open-file limit; a worker
serves at most --max-connections at once (503 past it); live streams are capped per run and per
client address (429 with Retry-After) while the admitted ones get every event; and a stream whose
client stops reading is dropped with a `gap` without ingest ever waiting on it."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from actuator.testing import Service, make_service
from harden import post_obs, register, wait_until
from test_live_redis_incidents import QUIET, Listener, sse

pytestmark = pytest.mark.timeout(600)

BODY_TIMEOUT = 2.0


def _service(tmp_path: Path, **env: str) -> Service:
    return make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path), extra_env=env).start()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Service]:
    svc = _service(tmp_path, ACTUATOR_BODY_TIMEOUT=str(BODY_TIMEOUT))
    yield svc
    svc.stop()


def _head(path: str, length: int, token: str | None = None, method: str = "POST") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
            f"Content-Length: {length}\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response (head, then Content-Length bytes): status, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(4096)
    return int(lines[0].split()[1]), headers, body


def _closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closes the connection (EOF or reset) within ``timeout`` seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_body_sent_a_byte_a_second_is_cut_at_the_deadline(served: Service) -> None:
    run = register(served.url, policy=QUIET)
    body = json.dumps({"observations": [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}}]}).encode()
    for path, token, method in ((f"/v1/runs/{run['id']}/observations", run["token"], "POST"),
                                ("/healthz", None, "GET")):  # a route that reads no body: cut all the same
        with socket.create_connection(("127.0.0.1", served.port)) as s:
            s.sendall(_head(path, len(body), token, method))
            sent = 0
            s.settimeout(1.0)
            status = None
            while sent < len(body):
                s.sendall(body[sent:sent + 1])
                sent += 1
                try:
                    status, headers, answer = _response(s)
                    break
                except TimeoutError:
                    continue
            assert status == 408, (path, sent, status)
            assert sent < len(body), "the whole body went through"
            assert headers["connection"] == "close" and "ACTUATOR_BODY_TIMEOUT" in json.loads(answer)["detail"]["message"]
            assert _closed(s), "the connection stays open after the 408"
    # nothing of the cut-off body was stored
    assert httpx.get(f"{served.url}/v1/runs/{run['id']}").json()["last_seq"] is None
    # a body in pieces within the deadline is served, and the connection is kept
    with socket.create_connection(("127.0.0.1", served.port)) as s:
        s.sendall(_head(f"/v1/runs/{run['id']}/observations", len(body), run["token"]))
        half = len(body) // 2
        s.sendall(body[:half])
        time.sleep(BODY_TIMEOUT / 4)
        s.sendall(body[half:])
        assert _response(s)[0] == 200
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _response(s)[0] == 200


@dataclass
class LimitedService(Service):
    """`actuator serve` under an open-file limit of ``nofile`` (set in the child before it starts)."""

    nofile: int = 256

    def start(self, timeout: float = 60.0) -> LimitedService:
        actuator = shutil.which("actuator", path=os.path.dirname(sys.executable)) or "actuator"
        argv = [actuator, "serve", "--port", str(self.port), "--log-level", "warning", *(self.serve_args or [])]
        limit = (self.nofile, self.nofile)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        wait_until(lambda: _ok(f"{self.url}/healthz"), timeout, "the service under a low open-file limit", 0.2)
        return self


def _ok(url: str, **kw: Any) -> bool:
    try:
        return httpx.request(kw.pop("method", "GET"), url, timeout=5, **kw).status_code == 200
    except httpx.HTTPError:
        return False


def test_slow_bodies_under_a_low_open_file_limit_do_not_stop_a_bystander(tmp_path: Path) -> None:
    nofile, attackers = 256, 600  # more slow bodies than the service has file descriptors
    base = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path), serve_args=[],
                        extra_env={"ACTUATOR_BODY_TIMEOUT": str(BODY_TIMEOUT)})
    svc = LimitedService(base.url, base.port, base.env, log_path=base.log_path, serve_args=[], nofile=nofile).start()
    slow: list[socket.socket] = []
    try:
        run = register(svc.url, policy=QUIET)
        head = _head(f"/v1/runs/{run['id']}/observations", 100_000, run["token"])
        for _ in range(attackers):
            s = socket.create_connection(("127.0.0.1", svc.port))
            s.setblocking(False)
            with contextlib.suppress(OSError):
                s.send(head)
            slow.append(s)
        open_ = set(range(attackers))

        def trickle() -> None:  # one more byte on every slow body still open
            for i in list(open_):
                try:
                    slow[i].send(b" ")
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    open_.discard(i)
                    continue
                with contextlib.suppress(BlockingIOError):
                    if slow[i].recv(4096) == b"":
                        open_.discard(i)

        seq = 0
        served = {"ingest": False, "healthz": False}
        deadline = time.monotonic() + 120
        while not all(served.values()) and time.monotonic() < deadline:
            trickle()
            if not served["ingest"]:
                with contextlib.suppress(httpx.HTTPError):
                    r = post_obs(svc.url, run, [{"seq": seq, "step": seq + 1, "probes": {"kl_drift": 0.1}}], timeout=5)
                    served["ingest"] = r.status_code == 200
            served["healthz"] = served["healthz"] or _ok(f"{svc.url}/healthz")
            time.sleep(1.0)
        assert served == {"ingest": True, "healthz": True}, f"the bystander was not served; {len(open_)} slow bodies open"
        # and every slow body is cut, none left holding a file descriptor
        while open_ and time.monotonic() < deadline + 60:
            trickle()
            time.sleep(1.0)
        assert not open_, f"{len(open_)} of {attackers} slow bodies still open"
    finally:
        for s in slow:
            s.close()
        svc.stop()


def _open_stream(client: httpx.Client, stack: contextlib.ExitStack, url: str, run_id: str) -> httpx.Response:
    return stack.enter_context(client.stream("GET", f"{url}/v1/runs/{run_id}/stream", params={"max_seconds": 120}))


def test_a_worker_serves_at_most_max_connections(tmp_path: Path) -> None:
    cap = 6
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path),
                       serve_args=["--max-connections", str(cap)]).start()
    try:
        run = register(svc.url, policy=QUIET)
        statuses = []
        with contextlib.ExitStack() as stack:
            for _ in range(cap + 3):  # long-lived connections: live streams
                client = stack.enter_context(httpx.Client(timeout=30))
                statuses.append(_open_stream(client, stack, svc.url, run["id"]).status_code)
            assert set(statuses) == {200, 503} and statuses.count(200) <= cap, statuses
            assert statuses.index(503) == statuses.count(200)  # refused from the cap on, admitted before it
        wait_until(lambda: _ok(f"{svc.url}/healthz"), 30, "service again once the streams closed", 0.2)
    finally:
        svc.stop()


def _bound(address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127.x address is this machine)."""
    return httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address=address))


def _next_seq(resp: httpx.Response) -> int:
    return next(e["json"]["seq"] for e in sse(resp) if e["event"] == "observation")


def test_streams_are_capped_per_run_and_per_client(tmp_path: Path) -> None:
    svc = _service(tmp_path, ACTUATOR_STREAM_MAX_PER_RUN="3", ACTUATOR_STREAM_MAX_PER_CLIENT="2")
    try:
        run, other = register(svc.url, policy=QUIET), register(svc.url, policy=QUIET)
        with contextlib.ExitStack() as stack:
            a, b, c = (stack.enter_context(_bound(f"127.0.0.{i}")) for i in (1, 2, 3))
            admitted = [_open_stream(a, stack, svc.url, run["id"]), _open_stream(a, stack, svc.url, run["id"])]
            refused = _open_stream(a, stack, svc.url, run["id"])  # a third from one client
            assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
            assert "ACTUATOR_STREAM_MAX_PER_CLIENT" in json.loads(refused.read())["detail"]["message"]
            admitted.append(_open_stream(b, stack, svc.url, run["id"]))
            refused = _open_stream(c, stack, svc.url, run["id"])  # a fourth on one run
            assert refused.status_code == 429 and refused.headers["retry-after"].isdigit()
            assert "ACTUATOR_STREAM_MAX_PER_RUN" in json.loads(refused.read())["detail"]["message"]
            assert _open_stream(c, stack, svc.url, other["id"]).status_code == 200  # another run: admitted
            assert [r.status_code for r in admitted] == [200, 200, 200]
            # every admitted stream gets the run's events
            assert post_obs(svc.url, run, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}}]).status_code == 200
            assert [_next_seq(r) for r in admitted] == [0, 0, 0]
            # a stream that ends gives its place back
            admitted[0].close()
            wait_until(lambda: _stream_status(svc.url, run["id"], "127.0.0.1") == 200, 30, "the freed place", 0.2)
        text = httpx.get(f"{svc.url}/metrics").text
        assert 'actuator_streams_refused_total{cap="run"} 1.0' in text
        assert 'actuator_streams_refused_total{cap="client"} 1.0' in text
    finally:
        svc.stop()


def _stream_status(url: str, run_id: str, address: str) -> int:
    with _bound(address) as client, client.stream("GET", f"{url}/v1/runs/{run_id}/stream",
                                                  params={"max_seconds": 1}) as resp:
        return resp.status_code


class StalledReader:
    """A live stream whose client reads its head and first bytes, then stops reading the socket (a
    small receive buffer, so the server's writes back up soon)."""

    def __init__(self, port: int, run_id: str) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(f"GET /v1/runs/{run_id}/stream?max_seconds=600 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        self.data = b""
        while b"retry:" not in self.data:
            self.data += self.sock.recv(4096)
        assert self.data.startswith(b"HTTP/1.1 200"), self.data[:200]

    def read_to_end(self) -> bool:
        """Read on until the server ends the stream; True if it ended it cleanly (the chunked body's end)."""
        self.sock.settimeout(60)
        try:
            while chunk := self.sock.recv(65536):
                self.data += chunk
        except ConnectionResetError:
            return False
        return self.data.endswith(b"0\r\n\r\n")

    def events(self) -> list[dict[str, Any]]:
        """The SSE events of the (dechunked) body."""
        body, rest = b"", self.data.partition(b"\r\n\r\n")[2]
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            body, rest = body + rest[:n], rest[n + 2:]
        out = []
        for block in body.decode().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and not line.startswith(":"))
            if "data" in fields:
                out.append({**fields, "json": json.loads(fields["data"])})
        return out


def _dropped(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    line = next((ln for ln in text.splitlines() if ln.startswith("actuator_streams_dropped_total ")), None)
    return float(line.split()[1]) if line else 0.0


PROBES = {f"probe_{i:03d}": 0.5 for i in range(200)}  # ~4 KB per event: buffers fill in a few batches


def _ingest_until_dropped(url: str, run: dict[str, Any], dropped_before: float) -> int:
    """Batches of observations until the service says a stream was dropped; every ingest answered
    200 while the stalled client read nothing (it never waits on a stream). The seqs posted."""
    seq = 0
    for _ in range(40):
        batch = [{"seq": s, "step": s + 1, "probes": PROBES} for s in range(seq, seq + 50)]
        r = post_obs(url, run, batch)
        assert r.status_code == 200 and r.json()["accepted"] == 50, r.text[:300]
        seq += 50
        with contextlib.suppress(AssertionError):
            wait_until(lambda: _dropped(url) > dropped_before, 2, "drop", 0.2)
            return seq
    raise AssertionError(f"{seq} events and the stalled stream was never dropped")


class OpenListener(Listener):
    """A Listener left open until the service stops (its cut connection is the end, not an error)."""

    def _read(self, *args: Any) -> None:
        with contextlib.suppress(httpx.HTTPError):
            super()._read(*args)


def test_a_stalled_reader_is_dropped_with_a_gap_and_ingest_never_waits(tmp_path: Path) -> None:
    svc = _service(tmp_path, ACTUATOR_STREAM_QUEUE="8", ACTUATOR_STREAM_DROP_AFTER="5")
    try:
        run = register(svc.url, policy=QUIET)
        stalled = StalledReader(svc.port, run["id"])
        well_behaved = OpenListener(svc.url, run["id"], seconds=300, until_seq=None)
        assert well_behaved.opened.wait(10)
        posted = _ingest_until_dropped(svc.url, run, 0.0)

        # The stalled client, reading again: what was queued, then a gap naming the last event it
        # was sent, then the end of its stream.
        assert stalled.read_to_end(), "the stream did not end after its gap"
        got = stalled.events()
        gap = got[-1]
        assert gap["event"] == "gap" and gap["json"]["reason"] == "behind", got[-3:]
        assert [e["json"]["seq"] for e in got[:-1]] == list(range(len(got) - 1))  # nothing skipped before it
        assert gap["json"].get("last_event_id") == got[-2]["id"] and len(got) - 1 < posted
        # the well-behaved client on the same run got every event, in order, no gap
        wait_until(lambda: well_behaved.has_seq(posted - 1), 60, "every event at the well-behaved client", 0.2)
        assert well_behaved.seqs() == list(range(posted))
        assert all(e["event"] == "observation" for e in well_behaved.events)
    finally:
        svc.stop()


def test_a_reader_that_never_reads_again_loses_its_connection(tmp_path: Path) -> None:
    svc = _service(tmp_path, ACTUATOR_STREAM_QUEUE="8", ACTUATOR_STREAM_DROP_AFTER="1",
                   ACTUATOR_STREAM_MAX_PER_CLIENT="1")
    try:
        run = register(svc.url, policy=QUIET)
        stalled = StalledReader(svc.port, run["id"])
        assert _stream_status(svc.url, run["id"], "127.0.0.1") == 429  # its one place is taken
        _ingest_until_dropped(svc.url, run, 0.0)
        # It never reads its gap: its connection is cut, and its place is free again.
        wait_until(lambda: _stream_status(svc.url, run["id"], "127.0.0.1") == 200, 60, "the place of the cut stream",
                   0.5)
        assert not stalled.read_to_end(), "the stalled connection should have been cut, not ended"
    finally:
        svc.stop()
    assert "Traceback" not in svc.logs(), svc.logs()[-3000:]
