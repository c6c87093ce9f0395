"""Shared pieces of the load benchmarks: the servers (Postgres and Redis as actuator.testing
starts them, the service under ``actuator serve``), a lean HTTP/1.1 load generator, agents,
percentiles, the machine description and the results file.

The load generator is raw asyncio over keep-alive connections (requests pre-formatted, responses
parsed by Content-Length): on 2 shared cores every cycle it spends is a cycle the service does
not get, so it must cost as little as possible. It runs on uvloop when installed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx


from actuator.testing import Postgres, Redis, free_port, start_postgres, start_redis, wait_until

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"

__all__ = ["Postgres", "Redis", "start_postgres", "start_postgres_durable", "start_redis", "Service", "start_service",
           "Agent",
           "register_agents", "run_closed_loop", "run_paced", "percentiles", "machine", "write_results",
           "table", "POLICY", "KNOBS", "CpuMeter", "postgres_pids"]

POLICY = {
    "name": "load-drift",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
                     "kp": 2.0, "ki": 0.5, "filter": {"kind": "ema", "alpha": 0.6}}],
    "guardrails": [{"name": "drift-cap", "probe": "kl_drift", "bound": "upper", "threshold": 5.0,
                    "action": "alert", "consecutive": 2}],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.3}]


def start_postgres_durable(fsync: bool = True) -> Postgres:
    """Postgres as the tests start it (own data directory, free port), but durable by default:
    the tests run with fsync=off; a production figure needs every commit flushed to disk."""
    pg = start_postgres()
    if fsync:
        pg.stop()
        pg.pg_ctl("start", "-w", "-l", os.path.join(pg.datadir, "log"), "-o",
                  f"-p {pg.port} -k {pg.datadir} -c listen_addresses=127.0.0.1 -c max_connections=200")
    return pg


# -- the service ----------------------------------------------------------------------------------
@dataclass
class Service:
    url: str
    port: int
    proc: subprocess.Popen
    log_path: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def pids(self) -> list[int]:
        """The server process and its workers (uvicorn --workers N forks them)."""
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        return sorted({self.proc.pid, *map(int, out)})


def start_service(database_url: str, *, redis_url: str | None = None, workers: int = 1,
                  port: int | None = None, migrate: bool = True) -> Service:
    """``actuator serve`` (the production entry point) at log level warning."""
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTUATOR_")}
    env["ACTUATOR_DATABASE_URL"] = database_url
    if redis_url:
        env["ACTUATOR_REDIS_URL"] = redis_url
    if not migrate:
        env["ACTUATOR_MIGRATE_ON_START"] = "false"
    env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="actuator-bench-metrics-")
    log_path = os.path.join(tempfile.mkdtemp(prefix="actuator-bench-"), "service.log")
    actuator = shutil.which("actuator", path=os.path.dirname(sys.executable)) or "actuator"
    proc = subprocess.Popen([actuator, "serve", "--host", "127.0.0.1", "--port", str(port), "--workers",
                             str(workers), "--log-level", "warning"],
                            env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/healthz", timeout=1).status_code == 200, 90, "actuator service")
    return Service(url, port, proc, log_path)


# -- a lean HTTP/1.1 client --------------------------------------------------------------------------
class Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)

    async def post(self, path: str, body: bytes, token: str) -> tuple[int, bytes]:
        assert self.r is not None and self.w is not None
        self.w.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), token.encode(), len(body), body))
        status = int((await self.r.readline()).split()[1])
        length = 0
        while True:
            line = await self.r.readline()
            if line in (b"\r\n", b""):
                break
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.r.readexactly(length)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


@dataclass
class Agent:
    """One simulated training run: its own run id and token, its own connection."""

    run_id: str
    token: str
    seq: int = 0
    last_decision: int = 0
    latencies: list[float] = field(default_factory=list)
    decisions: int = 0
    errors: int = 0

    def batch(self, n: int) -> bytes:
        obs = []
        for _ in range(n):
            s = self.seq
            drift = 0.1 + 0.06 * math.sin(s / 4.0)  # around the setpoint: the PID keeps deciding
            obs.append('{"seq":%d,"step":%d,"probes":{"kl_drift":%.6f},"metrics":{"loss":%.4f},'
                       '"knobs":{"learning_rate":0.001}}' % (s, s + 1, drift, 2.0 - s * 1e-4))
            self.seq += 1
        return ('{"observations":[%s],"last_decision":%d}' % (",".join(obs), self.last_decision)).encode()

    @property
    def path(self) -> str:
        return f"/v1/runs/{self.run_id}/observations"


def register_agents(url: str, n: int) -> list[Agent]:
    agents = []
    with httpx.Client(timeout=60) as c:
        for i in range(n):
            r = c.post(f"{url}/v1/runs", json={"name": f"load-{i}", "policy": POLICY, "knobs": KNOBS})
            r.raise_for_status()
            agents.append(Agent(r.json()["id"], r.json()["token"]))
    return agents


def _loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()


async def _open(agents: list[Agent], port: int | list[int]) -> list[Conn]:
    ports = port if isinstance(port, list) else [port]
    conns = [Conn(ports[i % len(ports)]) for i in range(len(agents))]
    await asyncio.gather(*(c.open() for c in conns))
    return conns


def _account(agent: Agent, status: int, body: bytes, parse: bool) -> None:
    if status != 200:
        agent.errors += 1
        return
    if parse:
        decisions = json.loads(body)["decisions"]
        if decisions:
            agent.decisions += len(decisions)
            agent.last_decision = decisions[-1]["number"]


def run_closed_loop(agents: list[Agent], port: int | list[int], *, seconds: float, batch: int,
                    parse: bool = True) -> dict[str, Any]:
    """Every agent posts its next batch as soon as the previous one is answered (saturation)."""

    async def main() -> float:
        conns = await _open(agents, port)
        deadline = time.perf_counter() + seconds

        async def one(agent: Agent, conn: Conn) -> None:
            while time.perf_counter() < deadline:
                body = agent.batch(batch)
                t0 = time.perf_counter()
                status, resp = await conn.post(agent.path, body, agent.token)
                agent.latencies.append(time.perf_counter() - t0)
                _account(agent, status, resp, parse)

        t0 = time.perf_counter()
        await asyncio.gather(*(one(a, c) for a, c in zip(agents, conns)))
        elapsed = time.perf_counter() - t0
        for c in conns:
            c.close()
        return elapsed

    for a in agents:
        a.latencies.clear()
    elapsed = _loop().run_until_complete(main())
    return _summary(agents, elapsed, batch)


def run_paced(agents: list[Agent], port: int | list[int], *, seconds: float, rate: float) -> dict[str, Any]:
    """Every agent posts one observation every 1/rate seconds (open loop, start times spread), as
    training runs do; latency is the agent's wait for its decisions."""

    async def main() -> float:
        conns = await _open(agents, port)
        period = 1.0 / rate
        start = time.perf_counter() + 0.2

        async def one(i: int, agent: Agent, conn: Conn) -> None:
            k = 0
            while True:
                due = start + (i / len(agents) + k) * period
                if due - start > seconds:
                    return
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                body = agent.batch(1)
                t0 = time.perf_counter()
                status, resp = await conn.post(agent.path, body, agent.token)
                agent.latencies.append(time.perf_counter() - t0)
                _account(agent, status, resp, True)
                k += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i, a, c) for i, (a, c) in enumerate(zip(agents, conns))))
        elapsed = time.perf_counter() - t0
        for c in conns:
            c.close()
        return elapsed

    for a in agents:
        a.latencies.clear()
    elapsed = _loop().run_until_complete(main())
    out = _summary(agents, elapsed, 1)
    out["offered_obs_per_s"] = round(rate * len(agents), 1)
    return out


def percentiles(values: list[float], qs: tuple[float, ...] = (50, 90, 99)) -> dict[str, float]:
    if not values:
        return {f"p{q:g}": math.nan for q in qs}
    s = sorted(values)
    return {f"p{q:g}": s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))] for q in qs}


def _summary(agents: list[Agent], elapsed: float, batch: int) -> dict[str, Any]:
    lat = [x for a in agents for x in a.latencies]
    requests = len(lat)
    errors = sum(a.errors for a in agents)
    pct = percentiles(lat)
    return {
        "agents": len(agents), "batch": batch, "seconds": round(elapsed, 2), "requests": requests,
        "errors": errors, "obs_per_s": round((requests - errors) * batch / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
        **{f"latency_{k}_ms": round(v * 1000, 2) for k, v in pct.items()},
        "latency_max_ms": round(max(lat) * 1000, 2) if lat else math.nan,
        "decisions": sum(a.decisions for a in agents),
    }


# -- reporting -------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = next((line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")), "0")
    pg = subprocess.run(["bash", "-c", "ls /usr/lib/postgresql | sort -n | tail -1"], capture_output=True,
                        text=True).stdout.strip()
    redis_v = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(int(mem) / 1024**2, 1),
            "python": platform.python_version(), "kernel": platform.release(), "postgres": pg,
            "redis": next((w.removeprefix("v=") for w in redis_v if w.startswith("v=")), "?"),
            "load_avg_at_start": os.getloadavg()[0]}


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in cells)])


# -- CPU accounting ---------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    """CPU seconds of a process and of its children that have exited (Postgres backends that
    ended during a phase are in the postmaster's cutime + cstime)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / _TICK  # utime + stime + cutime + cstime
    except (OSError, IndexError, ValueError):
        return 0.0


def postgres_pids(pg: Postgres) -> list[int]:
    """The postmaster and its children (one backend per pooled connection)."""
    try:
        master = int(open(os.path.join(pg.datadir, "postmaster.pid")).readline())
    except (OSError, ValueError):
        return []
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return [master, *map(int, out)]


class CpuMeter:
    """CPU seconds used by groups of processes (and by this one: the load generator) over a phase.
    Unlike wall-clock figures, CPU per observation barely depends on what else the machine runs."""

    def __init__(self, groups: dict[str, Any]) -> None:
        self.groups = groups  # name -> callable returning pids (re-read at the end: new backends)
        self.start: dict[str, dict[int, float]] = {}
        self.used: dict[str, float] = {}

    def __enter__(self) -> CpuMeter:
        self.start = {name: {p: _cpu(p) for p in pids()} for name, pids in self.groups.items()}
        self._self = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        for name, pids in self.groups.items():
            before, now = self.start[name], {p: _cpu(p) for p in pids()}
            # a process gone since the start is counted whole in its parent's children time
            self.used[name] = (sum(t - before.get(p, 0.0) for p, t in now.items())
                               - sum(t for p, t in before.items() if p not in now))
        self.used["load generator"] = time.process_time() - self._self

    def per_observation_ms(self, observations: int) -> dict[str, float]:
        return {k: round(1000 * v / max(1, observations), 3) for k, v in self.used.items()}
