"""Property-based fuzzing of the whole API from its own OpenAPI schema (schemathesis).

A real service (uvicorn on loopback, Postgres and Redis: the production backends, whose types are
the strictest) with an admin token. Every operation in the schema gets generated requests — valid
ones and, on purpose, invalid ones (negative mode) — with the tokens that let them past auth: the
admin token, and the run's own token for the agent's endpoint, on real runs, so the handlers and
the store run instead of stopping at 401/404. The one check: no response is a 5xx.

Deterministic: Hypothesis derandomized (a fixed seed), a fixed number of examples per operation;
bounded in time by the example budget and ``FUZZ_TIME_LIMIT``. At least ``MIN_REQUESTS`` requests
must have been sent, or the test fails (a schema change that silently skips operations shows).
"""

from __future__ import annotations

import time
import uuid
import zlib
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from harden import POLICY, bearer, register
from servers import make_service

ADMIN = "fuzz-admin-" + uuid.uuid4().hex
OPEN_POLICY = {"name": "fuzz-open", "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper",
                                                    "threshold": 0.5, "action": "alert"}]}
MIN_REQUESTS = 1000
EXAMPLES_PER_OPERATION = 40
FUZZ_TIME_LIMIT = 150.0  # seconds for the whole module, a safety net beside the example budget

SENT: Counter[str] = Counter()
STATUSES: Counter[int] = Counter()
FAILURES: list[str] = []
BY_OPERATION: defaultdict[str, Counter[int]] = defaultdict(Counter)


class Env:
    url: str
    agent_run: dict[str, Any]  # observations are fuzzed against this run (its own token)
    control_run: dict[str, Any]  # operator actions (pause, override, setpoint, ...) against this one
    terminal_run: dict[str, Any]  # halt and finish against this one
    started: float


ENV = Env()


@pytest.fixture(scope="module")
def fuzz_service(postgres, redis_server, tmp_path_factory):
    db = postgres.create_database(f"fuzz_{uuid.uuid4().hex[:10]}")
    svc = make_service(db, redis_url=redis_server.url, admin_token=ADMIN,
                       log_dir=str(tmp_path_factory.mktemp("fuzz"))).start()
    ENV.url = svc.url
    ENV.agent_run = register(svc.url, admin=ADMIN)
    ENV.control_run = register(svc.url, admin=ADMIN)
    ENV.terminal_run = register(svc.url, admin=ADMIN)
    # a policy without controllers: a run registered under it needs no particular knob
    assert httpx.post(f"{svc.url}/v1/policies", json=OPEN_POLICY, headers=bearer(ADMIN)).status_code == 201
    ENV.started = time.monotonic()
    yield svc
    svc.stop()
    assert "Traceback" not in svc.logs(), svc.logs()[-4000:]


def _spec() -> dict[str, Any]:
    """The schema the service serves, built in-process at collection (no server needed; the test
    below checks the served /openapi.json is the same document)."""
    from actuator.api.app import create_app
    from actuator.config import Settings

    return create_app(Settings(database_url="sqlite://", admin_token=ADMIN)).openapi()


SPEC = _spec()
schema = schemathesis.openapi.from_dict(SPEC).exclude(path_regex=r".*/stream$")
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                max_examples=EXAMPLES_PER_OPERATION)


def _authorize(case: Any) -> None:
    """Real runs, names that exist and the tokens that open them, so generated data reaches the
    handlers and the store instead of stopping at 401/404. One case in five keeps what was
    generated (unknown or malformed ids and names)."""
    params = case.path_parameters or {}
    path = case.path
    keep = zlib.crc32(repr(sorted(params.items())).encode() + repr(case.body).encode()) % 5 == 0
    if not keep:
        if "run_id" in params:
            if path.endswith("/observations"):
                params["run_id"] = ENV.agent_run["id"]
            elif path.endswith(("/halt", "/finish")):
                params["run_id"] = ENV.terminal_run["id"]  # so the control run stays controllable
            else:
                params["run_id"] = ENV.control_run["id"]
        for key, real in (("knob", "learning_rate"), ("controller", "drift"), ("name", POLICY["name"])):
            if key in params:
                params[key] = real
        if path == "/v1/runs" and case.method == "POST" and isinstance(case.body, dict) \
                and isinstance(case.body.get("policy"), str):
            case.body["policy"] = OPEN_POLICY["name"]
    token = ADMIN
    if path.endswith("/observations"):
        token = ENV.agent_run["token"]
    case.headers = {**(case.headers or {}), **bearer(token)}


@schema.parametrize()
@settings(derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, fuzz_service):
    if time.monotonic() - ENV.started > FUZZ_TIME_LIMIT:
        pytest.skip("fuzzing time budget spent")
    _authorize(case)
    SENT[f"{case.method} {case.path}"] += 1
    response = case.call(base_url=ENV.url, timeout=30)
    STATUSES[response.status_code] += 1
    BY_OPERATION[f"{case.operation.method.upper()} {case.operation.path}"][response.status_code] += 1
    if response.status_code >= 500:
        FAILURES.append(f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}\n"
                        f"  {case.as_curl_command()}")
    case.validate_response(response, checks=[not_a_server_error])


def test_enough_requests_and_no_5xx(fuzz_service):
    total = sum(SENT.values())
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(SENT.items()))
    assert not FAILURES, "\n".join(FAILURES[:10])
    assert total >= MIN_REQUESTS, f"only {total} requests generated ({summary})"
    assert not any(s >= 500 for s in STATUSES), STATUSES
    # every operation of the schema was exercised
    spec = httpx.get(f"{ENV.url}/openapi.json").json()
    assert spec == SPEC, "the fuzzed schema is not the one the service serves"
    ops = {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item if not p.endswith("/stream")}
    assert ops <= set(SENT), sorted(ops - set(SENT))
    for op, statuses in sorted(BY_OPERATION.items()):
        print(f"  {op}: {dict(sorted(statuses.items()))}")
    print(f"\nfuzz: {total} requests over {len(SENT)} operations; statuses {dict(sorted(STATUSES.items()))}")
