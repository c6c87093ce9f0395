"""Issue 17, break 6: slowloris. `actuator serve` (what the Dockerfile runs) closes a connection
whose request head is not complete within ACTUATOR_HEADER_TIMEOUT seconds, whether it sends
nothing or trickles a header line at a time; requests that finish their head in time, and
kept-alive connections between requests, are not affected."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from actuator.testing import make_service

TIMEOUT = 1.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[int]:
    svc = make_service(f"sqlite:///{tmp_path / 'a.db'}", log_dir=str(tmp_path), serve_args=[],
                       extra_env={"ACTUATOR_HEADER_TIMEOUT": str(TIMEOUT)}).start()
    yield svc.port
    svc.stop()


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False  # still open, nothing to read
    except (ConnectionResetError, BrokenPipeError):
        return True


def _status(sock: socket.socket) -> bytes:
    """Read one whole response (head, then Content-Length bytes); its status line."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(4096)
    return head.split(b"\r\n")[0]


def test_slow_request_heads_are_cut_off(served: int) -> None:
    silent = [socket.create_connection(("127.0.0.1", served)) for _ in range(100)]
    trickling = [socket.create_connection(("127.0.0.1", served)) for _ in range(100)]
    for s in trickling:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    start = time.monotonic()
    while time.monotonic() - start < TIMEOUT + 1.5:  # a header line every 0.25 s, never the blank line
        for s in trickling:
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except OSError:
                pass
        time.sleep(0.25)
    time.sleep(0.5)
    still_open = [s for s in silent + trickling if not _closed_by_server(s)]
    for s in silent + trickling:
        s.close()
    assert still_open == [], f"{len(still_open)} of 200 slow connections still open after {TIMEOUT + 2:.1f}s"

    # a head that arrives in pieces but in time is served; kept-alive connections are reused
    with socket.create_connection(("127.0.0.1", served)) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(TIMEOUT / 3)
        s.sendall(b"Host: 127.0.0.1\r\n\r\n")
        assert _status(s) == b"HTTP/1.1 200 OK"
        time.sleep(TIMEOUT * 0.6)  # idle between requests: the keep-alive timeout's business
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _status(s) == b"HTTP/1.1 200 OK"
    with httpx.Client(base_url=f"http://127.0.0.1:{served}") as client:
        assert all(client.get("/healthz").status_code == 200 for _ in range(3))
