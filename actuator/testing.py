"""Real servers on loopback for integration tests: the Actuator service under uvicorn, Postgres
and Redis, each as a process of its own on a free port, started and stopped in a ``with`` block.

Test your own integration (a training loop with ``ActuatorCallback``, a client script, a
dashboard) against the real service rather than a mock::

    import actuator.testing

    with actuator.testing.service() as url:  # SQLite in a temporary folder, in-process live state
        ...  # ActuatorCallback(url=url, ...), ActuatorClient(url), httpx.get(f"{url}/v1/runs")

    with actuator.testing.postgres() as pg, actuator.testing.redis() as rd:
        with actuator.testing.service(pg.create_database("it"), redis_url=rd.url) as url:
            ...

The service needs the server extra (``pip install 'actuator[server]'``); Postgres and Redis need
their binaries (Debian: ``apt-get install postgresql redis-server``): a missing one raises
``RuntimeError`` naming the package, never a silent skip. This module itself imports only the
standard library and httpx (psycopg when a Postgres database is created), so importing it costs
nothing. Within one process the service's start is fast: a launcher process imports the app once
and forks one uvicorn per start (gunicorn's ``--preload``).

The servers are for tests: Postgres runs with ``fsync=off``, Redis without persistence, and every
data directory is temporary.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

__all__ = ["HEAVY_KNOBS", "HEAVY_POLICY", "Postgres", "Redis", "Service", "SlowProxy", "free_port", "heavy_probes",
           "make_service", "need_binary", "postgres", "redis", "service", "start_postgres", "start_redis",
           "wait_until"]

# A policy that costs the service real work per observation (8 controllers, 64 guardrails all
# breached): what tests/hardening and benchmarks/load/costly.py replay through simulate, validate
# and reports to bound the cost an anonymous client can cause.
HEAVY_KNOBS = [{"name": f"custom.k{i}", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}
               for i in range(8)]
HEAVY_POLICY = {"name": "heavy",
                "controllers": [{"name": f"c{i}", "probe": f"custom.p{i % 4}", "knob": f"custom.k{i}",
                                 "setpoint": 0.1, "kp": 1.0, "ki": 0.2} for i in range(8)],
                "guardrails": [{"name": f"g{i}", "probe": f"custom.p{i % 4}", "bound": "upper", "threshold": 0.01,
                                "action": "alert", "consecutive": 1} for i in range(64)]}


def heavy_probes(i: int) -> dict[str, float]:
    """The heavy run's i-th observation's probes (every guardrail breached, the controllers busy)."""
    return {f"custom.p{j}": 0.5 + 0.3 * ((i * 7919 + j) % 13) / 13 for j in range(4)}

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
GRACEFUL_SHUTDOWN_S = 1  # uvicorn --timeout-graceful-shutdown of the services started here


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_binary(binary: str, package: str) -> str:
    """The path of ``binary`` (on PATH, or Debian's Postgres folders); RuntimeError naming the
    Debian ``package`` to install when it is missing."""
    path = shutil.which(binary) or next((str(d / binary) for d in PG_BIN_DIRS if (d / binary).exists()), None)
    if path is None:
        raise RuntimeError(f"{binary} not found: install it with `apt-get install -y {package}`")
    return path


def wait_until(check: Callable[[], object], timeout: float, what: str,
               gone: Callable[[], bool] | None = None) -> None:
    """Poll ``check`` every 0.1 s until it returns a true value (exceptions count as not yet);
    RuntimeError naming ``what`` and the last exception after ``timeout`` seconds, or as soon as
    ``gone()`` says the process that was to answer has exited."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if gone is not None and gone():
            raise RuntimeError(f"{what} exited before it answered ({last})")
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout}s ({last})")


# -- Postgres ---------------------------------------------------------------------------------------
@dataclass
class Postgres:
    """A Postgres server of its own (temporary data directory, trust authentication, user
    ``postgres``)."""

    url: str
    port: int
    datadir: str
    _as_user: list[str] = field(default_factory=list)

    def pg_ctl(self, *args: str) -> None:
        subprocess.run([*self._as_user, need_binary("pg_ctl", "postgresql"), "-D", self.datadir, *args],
                       check=True, capture_output=True, timeout=60)

    def stop(self) -> None:
        self.pg_ctl("stop", "-m", "fast", "-w")

    def remove(self) -> None:
        """Stop the server (if it runs) and delete its data directory: each one holds ~500 MB, and
        a developer's repeated test runs filled a 100 GB /tmp with them."""
        try:
            self.stop()
        except (subprocess.SubprocessError, OSError):  # already stopped
            pass
        shutil.rmtree(self.datadir, ignore_errors=True)

    def start(self) -> None:
        self.pg_ctl("start", "-w", "-l", os.path.join(self.datadir, "log"), "-o",
                    f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 -c fsync=off "
                    f"-c max_connections=200")

    def create_database(self, name: str) -> str:
        """A new empty database: its SQLAlchemy URL (for ``ACTUATOR_DATABASE_URL``)."""
        import psycopg  # the server extra's driver

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"


def start_postgres() -> Postgres:
    """initdb and start a Postgres on a free port (as user postgres when run as root)."""
    initdb = need_binary("initdb", "postgresql")
    datadir = tempfile.mkdtemp(prefix="actuator-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        pw = pwd.getpwnam("postgres")
        os.chown(datadir, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    subprocess.run([*as_user, initdb, "-D", datadir, "-A", "trust", "-U", "postgres", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    port = free_port()
    pg = Postgres(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", port, datadir, as_user)
    pg.start()
    return pg


@contextlib.contextmanager
def postgres() -> Iterator[Postgres]:
    """A Postgres for the ``with`` block; its data directory is removed after."""
    pg = start_postgres()
    try:
        yield pg
    finally:
        pg.remove()


# -- Redis ------------------------------------------------------------------------------------------
def _redis_ping(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(b"PING\r\n")
        return s.recv(64).startswith(b"+PONG")


@dataclass
class Redis:
    """A redis-server of its own (no persistence)."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start_redis() -> Redis:
    """A redis-server on a free port, without persistence."""
    binary = need_binary("redis-server", "redis-server")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: _redis_ping(port), 20, "redis-server")
    return Redis(f"redis://127.0.0.1:{port}/0", port, proc)


@contextlib.contextmanager
def redis() -> Iterator[Redis]:
    """A redis-server for the ``with`` block."""
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


# -- the service ------------------------------------------------------------------------------------
# Importing the service (FastAPI, SQLAlchemy, Alembic, the app) is most of a start: seconds on a
# loaded 2-core machine, and a test suite starts the service many times. So the plain uvicorn
# command runs in a child forked from a process that imported it once (gunicorn's --preload):
# still uvicorn's own command line in its own process and session, the app built by its factory in
# that process, logs to the service's log. One launcher per process that starts services.
_LAUNCHER = r"""
import json, os, signal, sys
import uvicorn.main
import actuator.api.app
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the services
print("ready", flush=True)
for line in iter(sys.stdin.readline, ""):
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(null, 0), os.dup2(log, 1), os.dup2(log, 2)
            os.environ.clear()
            os.environ.update(req["env"])
            uvicorn.main.main(args=req["args"], prog_name="uvicorn")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    print(pid, flush=True)
"""


class _Forked:
    """A service forked by the launcher: the part of subprocess.Popen that Service uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return 0  # gone (the launcher ignores SIGCHLD, so no zombie stays behind)
        return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"service pid {self.pid}", timeout or 0)
            time.sleep(0.02)
        return 0

    def send_signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Launcher:
    """A process that imported the service once and forks one per start (json lines on stdin)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER], env=self.env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.proc.wait(10)
            raise RuntimeError("the service launcher did not start")

    def fork(self, args: list[str], env: dict[str, str], log_path: str) -> _Forked:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"args": args, "env": env, "log": log_path}) + "\n")
        self.proc.stdin.flush()
        return _Forked(int(self.proc.stdout.readline()))

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # end of input: the launcher exits (its services run on)
        self.proc.wait(10)


_launcher: _Launcher | None = None


@atexit.register
def _close_launcher() -> None:
    if _launcher is not None:
        _launcher.close()


# Set anew for every test by pytest, and read by no import: a launcher compared on it would be
# started again (the app imported again, seconds) for every service a test suite starts.
_VOLATILE = {"PYTEST_CURRENT_TEST"}


def _base_env(env: Mapping[str, str]) -> dict[str, str]:
    """What a launcher's import may depend on: the environment but the service's own settings
    (and pytest's name of the running test; each service gets its whole environment at its fork)."""
    return {k: v for k, v in env.items() if not k.startswith("ACTUATOR_") and k not in _VOLATILE}


def _fork_service(args: list[str], env: dict[str, str], log_path: str) -> _Forked | None:
    """The service forked from a launcher started with its environment (less its ACTUATOR_*
    settings, read by the app at start); None (start it as a plain process) for several processes'
    metrics (PROMETHEUS_MULTIPROC_DIR is read at import)."""
    global _launcher
    if "PROMETHEUS_MULTIPROC_DIR" in env:
        return None
    base = _base_env(env)
    if _launcher is not None and (_launcher.proc.poll() is not None or _launcher.env != base):
        _launcher.close()  # gone, or the environment changed since (a test set a variable)
        _launcher = None
    if _launcher is None:
        try:
            _launcher = _Launcher(base)
        except RuntimeError:  # the app does not import: a plain start puts why in the service's log
            return None
    return _launcher.fork(args, env, log_path)


@dataclass
class Service:
    """The Actuator service under a real uvicorn, in its own process (``make_service(...).start()``)."""

    url: str
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | _Forked | None = None
    log_path: str = ""
    serve_args: list[str] | None = None  # run `actuator serve` with these (as the Dockerfile does)

    def start(self, timeout: float = 60.0) -> Service:
        """Start it and wait until ``/healthz`` answers 200; RuntimeError with the end of its log if
        it does not within ``timeout`` seconds (it is stopped)."""
        forked = None
        if self.serve_args is not None:
            actuator = shutil.which("actuator", path=os.path.dirname(sys.executable)) or "actuator"
            argv = [actuator, "serve", "--port", str(self.port), "--log-level", "warning", *self.serve_args]
        else:
            # A live stream (/stream, the console) whose client has gone ends only at its next write
            # (the keep-alive, ACTUATOR_STREAM_KEEPALIVE): without a graceful-shutdown limit, stop()
            # waited 10 s and killed. After 1 s uvicorn cancels what is still open and runs the app's
            # shutdown as usual.
            args = ["--factory", "actuator.api.app:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                    "--log-level", "warning", "--timeout-graceful-shutdown", str(GRACEFUL_SHUTDOWN_S)]
            argv = [sys.executable, "-m", "uvicorn", *args]
            forked = _fork_service(args, self.env, self.log_path)
        if forked is not None:
            self.proc = forked
        else:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        try:
            # Token mode closes /healthz unless ACTUATOR_HEALTH_PUBLIC: ask with the admin token.
            admin = self.env.get("ACTUATOR_ADMIN_TOKEN")
            auth = {"Authorization": f"Bearer {admin}"} if admin else {}
            wait_until(lambda: httpx.get(f"{self.url}/healthz", headers=auth, timeout=1).status_code == 200, timeout,
                       "actuator service", gone=lambda: self.proc is None or self.proc.poll() is not None)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"{exc}; its log ({self.log_path}) ends:\n{self.logs()[-4000:]}") from None
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """SIGTERM (uvicorn's graceful shutdown), SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def logs(self) -> str:
        """What the service wrote to its log so far."""
        return Path(self.log_path).read_text(errors="replace") if self.log_path else ""


def make_service(database_url: str, *, redis_url: str | None = None, admin_token: str | None = None,
                 port: int | None = None, log_dir: str | None = None, serve_args: list[str] | None = None,
                 extra_env: dict[str, str] | None = None) -> Service:
    """A service, not started yet: its settings come from this process's environment without its
    ``ACTUATOR_*`` variables, then these arguments. ``serve_args``: start it with ``actuator serve``
    and these options instead of plain uvicorn; ``extra_env``: more environment (``ACTUATOR_*``
    settings); ``log_dir``: where its log goes (default: a new temporary folder)."""
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")}
    env["ACTUATOR_DATABASE_URL"] = database_url
    if redis_url:
        env["ACTUATOR_REDIS_URL"] = redis_url
    if admin_token:
        env["ACTUATOR_ADMIN_TOKEN"] = admin_token
    env.update(extra_env or {})
    log_path = os.path.join(log_dir or tempfile.mkdtemp(prefix="actuator-svc-"), f"service-{port}.log")
    return Service(f"http://127.0.0.1:{port}", port, env, log_path=log_path, serve_args=serve_args)


@contextlib.contextmanager
def service(database_url: str | None = None, *, redis_url: str | None = None, admin_token: str | None = None,
            extra_env: dict[str, str] | None = None, timeout: float = 60.0) -> Iterator[str]:
    """The service for the ``with`` block, on a free loopback port: its base URL. Without
    ``database_url`` it stores in a SQLite file of a temporary folder (removed after, with its log);
    ``redis_url`` for live state in Redis, ``admin_token`` to require one, ``extra_env`` for other
    ``ACTUATOR_*`` settings. A service that does not answer within ``timeout`` seconds raises
    RuntimeError with the end of its log."""
    with tempfile.TemporaryDirectory(prefix="actuator-service-") as tmp:
        svc = make_service(database_url or f"sqlite:///{Path(tmp) / 'actuator.db'}", redis_url=redis_url,
                           admin_token=admin_token, log_dir=tmp, extra_env=extra_env)
        svc.start(timeout)
        try:
            yield svc.url
        finally:
            svc.stop()


# A slow network in front of a real service (tests/hardening, benchmarks/overhead/slow_network.py).
class SlowProxy:
    def __init__(self, upstream_port: int, delay: float) -> None:
        self.upstream_port, self.delay = upstream_port, delay
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slow-proxy", daemon=True)

    def __enter__(self) -> SlowProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("slow proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        async def shutdown() -> None:  # close the connections still open (keep-alive)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float) -> None:
            try:
                while data := await src.read(65536):
                    if delay:
                        await asyncio.sleep(delay)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(client_r, up_w, 0.0), pipe(up_r, client_w, self.delay))
