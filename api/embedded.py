"""Run the controller service inside the current process (a uvicorn server in a daemon thread).

For demos, benchmarks and single-user scripts: ``url = serve_in_thread(Settings(...))``.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx

from actuator.config import Settings

from .app import create_app

__all__ = ["serve_in_thread"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_in_thread(settings: Settings | None = None, *, port: int | None = None, timeout: float = 30.0) -> str:
    """Start the service on loopback in a daemon thread; return its URL once /healthz answers."""
    import uvicorn

    port = port or _free_port()
    app = create_app(settings or Settings(), own_process=False)  # the training process's objects stay collectable
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True, name="actuator-service").start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the embedded controller service did not answer on {url} within {timeout}s")
