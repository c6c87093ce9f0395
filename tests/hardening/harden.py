"""Shared helpers of the hardening tests: registering runs, snapshots of everything stored,
servers restarted on the same port, and a service started with verbose logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from actuator.models import DecisionRow, EventRow, ObservationRow, PolicyRow, RunRow
from actuator.store import Store
from actuator.testing import Redis, Service, make_service, need_binary
from actuator.testing import wait_until as _wait  # tolerates errors while a server starts

POLICY = {
    "name": "hardening",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
                     "kp": 1.0, "ki": 0.2}],
    "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.8, "action": "alert",
                    "consecutive": 2}],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]
TABLES = (PolicyRow, RunRow, ObservationRow, DecisionRow, EventRow)
# What a run's row holds that a request could change.
RUN_FIELDS = ("state", "knobs", "controllers", "guardrails", "latest_probes", "latest_metrics", "knobs_in_effect",
              "run_metadata", "last_step", "last_seq", "decision_count", "policy_id", "policy_version", "name",
              "token_hash", "updated_at")


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def register(url: str, *, admin: str | None = None, policy: Any = POLICY, knobs: list | None = None,
             name: str = "hardening-run") -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/runs", json={"name": name, "policy": policy, "knobs": knobs or KNOBS},
                   headers=bearer(admin), timeout=30)
    assert r.status_code == 201, r.text
    return r.json()


def post_obs(url: str, run: dict[str, Any], observations: list[dict[str, Any]], *, last_decision: int = 0,
             timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=bearer(run["token"]), timeout=timeout,
                      json={"observations": observations, "last_decision": last_decision})


class StoreView:
    """Read the store directly (not through the API under test)."""

    def __init__(self, url: str) -> None:
        self.store = Store(url)

    def close(self) -> None:
        self.store.close()

    def counts(self) -> dict[str, int]:
        return {t.__tablename__: self.store.count(t) for t in TABLES}

    def run(self, run_id: str) -> dict[str, Any]:
        row = self.store.get_run(run_id)
        assert row is not None
        return {f: getattr(row, f) for f in RUN_FIELDS}

    def snapshot(self, run_ids: list[str]) -> dict[str, Any]:
        return {"counts": self.counts(), "runs": {r: self.run(r) for r in run_ids},
                "policies": [(p.name, p.version, p.archived) for p in self.store.list_policies(True)]}

    def seqs(self, run_id: str) -> list[int]:
        return [o.seq for o in self.store.list_observations(run_id, limit=1_000_000)]

    def dump(self) -> str:
        """Every row of every table as text (for secrets-at-rest checks)."""
        from sqlalchemy import select

        out = []
        with self.store.sessions() as s:
            for t in TABLES:
                for row in s.scalars(select(t)):
                    out.append(json.dumps({c.key: getattr(row, c.key) for c in t.__table__.columns}, default=str))
        return "\n".join(out)


def restart_redis_same_port(old: Redis) -> Redis:
    """A fresh redis-server on the port the stopped one used (clients reconnect to it)."""
    binary = need_binary("redis-server", "redis-server")
    proc = subprocess.Popen([binary, "--port", str(old.port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    _wait(lambda: redis.Redis(port=old.port).ping(), 20, "redis-server")
    return Redis(old.url, old.port, proc)


@dataclass
class VerboseService(Service):
    """The service with uvicorn at debug level and its access log on: everything a deployment could
    log is in ``logs()``, so a secret that leaks anywhere shows up there."""

    def start(self, timeout: float = 60.0) -> VerboseService:
        log = open(self.log_path, "ab")
        # Every logger at DEBUG to stderr: ours, uvicorn's (access log included) and SQLAlchemy's
        # engine (every statement with its parameters).
        config = os.path.join(os.path.dirname(self.log_path), f"logging-{self.port}.json")
        with open(config, "w") as fh:
            json.dump({"version": 1, "disable_existing_loggers": False,
                       "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
                       "handlers": {"err": {"class": "logging.StreamHandler", "formatter": "plain"}},
                       "root": {"level": "DEBUG", "handlers": ["err"]},
                       "loggers": {"uvicorn": {"level": "DEBUG"}, "uvicorn.access": {"level": "DEBUG"},
                                   "sqlalchemy.engine": {"level": "DEBUG"}}}, fh)
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "actuator.api.app:create_app",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-config", config, "--access-log"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        admin = self.env.get("ACTUATOR_ADMIN_TOKEN")  # token mode: /healthz needs a token
        auth = {"Authorization": f"Bearer {admin}"} if admin else {}
        _wait(lambda: httpx.get(f"{self.url}/healthz", headers=auth, timeout=1).status_code == 200, timeout,
              "actuator service")
        return self


def verbose_service(database_url: str, **kw: Any) -> VerboseService:
    svc = make_service(database_url, **kw)
    return VerboseService(svc.url, svc.port, svc.env, log_path=svc.log_path)


def wait_until(check, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout}s")


def no_traceback(text: str) -> bool:
    return "Traceback" not in text and 'File "' not in text


class SimAgent:
    """A training loop's side of the protocol without the training: observations handed to the
    real BackgroundSender (never blocking), results drained and decisions "applied" at each step
    boundary exactly as ActuatorCallback does (by decision number, each once)."""

    def __init__(self, url: str, run: dict[str, Any], *, timeout: float = 1.0, batch_size: int = 64) -> None:
        from actuator.agents.sender import BackgroundSender
        from actuator.client import ActuatorClient

        self.client = ActuatorClient(url, timeout=timeout)
        self.sender = BackgroundSender(self.client, run_id=run["id"], token=run["token"], batch_size=batch_size,
                                       initial_backoff=0.05, max_backoff=0.5)
        self.seq = 0
        self.applied: list[int] = []
        # The thread of every request of its client: handing observations over (the caller's
        # thread) must never make one, whatever the network does (asserted by thread, not by time).
        self.caller = threading.get_ident()
        self.request_threads: list[int] = []
        request = self.client._request

        def recorded(*a: Any, **kw: Any) -> bytes:
            self.request_threads.append(threading.get_ident())
            return request(*a, **kw)

        self.client._request = recorded  # type: ignore[method-assign]

    def step(self, step: int, drift: float) -> None:
        from actuator.schemas import ObservationCreate

        for result in self.sender.results():
            for d in result.decisions:
                if not self.applied or d.number > self.applied[-1]:
                    self.applied.append(d.number)
        self.sender.last_decision = self.applied[-1] if self.applied else 0
        obs = ObservationCreate(seq=self.seq, step=step, probes={"kl_drift": drift}, time=time.time())
        self.sender.submit(obs)
        self.seq += 1

    def requests_on_caller(self) -> int:
        """Requests made on the thread that drives the agent (none may be)."""
        return sum(t == self.caller for t in self.request_threads)

    def finish(self, timeout: float = 30.0) -> bool:
        delivered = self.sender.flush(timeout)
        # one more round trip so the last decisions come back and are "applied"
        for result in self.sender.results():
            for d in result.decisions:
                if not self.applied or d.number > self.applied[-1]:
                    self.applied.append(d.number)
        self.sender.close(1.0)
        self.client.close()
        return delivered


def _step_clock_class():  # type: ignore[no-untyped-def]
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Wall time between consecutive step boundaries, as the training loop sees it."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            if not self.times:
                self.times.append(time.monotonic())

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self.times.append(time.monotonic())

        @property
        def intervals(self) -> list[float]:
            return [b - a for a, b in zip(self.times, self.times[1:])]

    return StepClock


def __getattr__(name: str) -> Any:  # StepClock without importing transformers for every test
    if name == "StepClock":
        return _step_clock_class()
    raise AttributeError(name)


class ServedApp:
    """An ASGI app (a misbehaving controller, a proxy) under a real uvicorn in a thread of the test
    process, on a free loopback port: ``with ServedApp(app) as served: served.url``."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from actuator.testing import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # A streaming answer still open at exit (a drip) is cut after one second.
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off", timeout_graceful_shutdown=1))
        self._thread = threading.Thread(target=self.server.run, name=f"served-app-{self.port}", daemon=True)

    def __enter__(self) -> ServedApp:
        self._thread.start()
        wait_until(lambda: self.server.started, 20, "uvicorn serving the test app")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(10)
