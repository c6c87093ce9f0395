"""Property-based fuzzing of the whole API from its own OpenAPI schema (schemathesis).

A real service (uvicorn on loopback, Postgres and Redis: the production backends, whose types are
the strictest) with an admin token. Every operation in the schema gets generated requests — valid
ones and, on purpose, invalid ones (negative mode), in schemathesis's examples, coverage and
fuzzing phases — with the tokens that let them past auth (a schemathesis auth provider: the
admin token, and the run's own token for the agent's endpoint), on real runs, so the handlers and
the store run instead of stopping at 401/404. The live event stream (Server-Sent Events) is
fuzzed too: a valid request's ``max_seconds`` is cut to ``STREAM_SECONDS`` and the stream read to
its end, so its events are checked against the declared ``text/event-stream`` item schema.

Every response goes through **all** of schemathesis's checks: no 5xx, status codes and content
types the schema declares, bodies and headers that conform to the declared schemas, invalid data
refused, valid data accepted, auth enforced where declared (it re-sends without and with a wrong
token), a missing Authorization header refused, undeclared methods answered 405 with an ``Allow``
that lists exactly the declared methods, and a response-time ceiling (a hang detector).

One configured expectation, named per operation in ``BEYOND_SCHEMA``: a request valid against the
JSON Schema may still be refused with 422 where the service applies a rule JSON Schema cannot
express (a policy document's semantics, a reference to a stored policy or knob, the run's state).

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
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation

from harden import POLICY, bearer, register
from actuator.testing import make_service

ADMIN = "fuzz-admin-" + uuid.uuid4().hex
AGENT = "the-agent-token-of-the-fuzzed-run"
OPEN_POLICY = {"name": "fuzz-open", "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper",
                                                    "threshold": 0.5, "action": "alert"}]}
MIN_REQUESTS = 1000
EXAMPLES_PER_OPERATION = 40
FUZZ_TIME_LIMIT = 600.0  # a safety net beside the example budget: ~45 s on 2 idle cores, several x that under load
MAX_RESPONSE_SECONDS = 30.0  # a hang detector, not a latency target (2 shared cores)
STREAM_SECONDS = 0.2  # how long a valid request to the Server-Sent Events stream is kept open
STREAM_EVENTS = 10_000

# Operations where a schema-valid request may be refused with 422, and the rule that refuses it.
BEYOND_SCHEMA = {
    "POST /v1/policies": "the policy document's rules (its schema: GET /v1/policies/schema)",
    "PUT /v1/policies/{name}": "the policy document's rules; its name must be the path's",
    "POST /v1/policies/simulate": "the policy named must exist",
    "POST /v1/policies/tune": "the policy named must exist and hold the named setpoint controller",
    "POST /v1/runs": "the policy named must exist; knob values within their bounds; policy knobs declared",
    "POST /v1/runs/{run_id}/observations": "seq unique within a batch; only the run's knobs; acknowledged "
                                           "decisions must exist",
    "POST /v1/runs/{run_id}/pause": "only a running run can be paused",
    "POST /v1/runs/{run_id}/resume": "only a paused run can be resumed",
    "POST /v1/runs/{run_id}/knobs/{knob}/override": "the run's knob, a value within its bounds",
    "DELETE /v1/runs/{run_id}/knobs/{knob}/override": "the knob must be overridden",
    "PUT /v1/runs/{run_id}/controllers/{controller}/setpoint": "the policy's controller; setpoint rules",
    "POST /v1/runs/{run_id}/policy": "the policy named must exist and drive only the run's knobs",
}
_ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]  # schemathesis's default

SENT: Counter[str] = Counter()
STATUSES: Counter[int] = Counter()
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


def _config() -> SchemathesisConfig:
    """Every check on (schemathesis's defaults), the response-time ceiling, and 422 accepted on
    valid data only where ``BEYOND_SCHEMA`` says why."""
    return SchemathesisConfig.from_dict({
        "checks": {"max_response_time": MAX_RESPONSE_SECONDS},
        # Read a stream to its end (the server ends it after STREAM_SECONDS) rather than hang up
        # after schemathesis's default number of events: a run keeps about 1,000.
        "max-stream-events": STREAM_EVENTS,
        "generation": {"mode": "all", "max-examples": EXAMPLES_PER_OPERATION},
        "operations": [{"include-name": name,
                        "checks": {"positive_data_acceptance": {"expected-statuses": [*_ACCEPTED, "422"]}}}
                       for name in BEYOND_SCHEMA],
    })


SPEC = _spec()
schema = schemathesis.openapi.from_dict(SPEC, config=_config())


@schema.auth(refresh_interval=None)
class Tokens:
    """The agent's endpoint takes the run's token; everything else the admin token. Set by
    schemathesis, so its auth checks know the token is real and its probes can remove it. (Cases
    of the examples phase are built at collection, before the run exists: ``AGENT`` stands in.)"""

    def get(self, case: Any, ctx: Any) -> str:
        return AGENT if case.operation.path.endswith("/observations") else ADMIN

    def set(self, case: Any, token: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), **bearer(token)}


def _valid_seconds(value: Any) -> bool:
    try:
        return 0 < float(value) <= 86400
    except (TypeError, ValueError):
        return False


def _use_real_resources(case: Any) -> None:
    """Real runs and names, so generated data reaches the handlers and the store instead of
    stopping at 404. Never where the generated value is the invalid part (negative mode), and one
    case in five keeps what was generated (unknown ids and names)."""
    if (case.headers or {}).get("Authorization") == f"Bearer {AGENT}":
        case.headers["Authorization"] = f"Bearer {ENV.agent_run['token']}"
    if case.operation.path.endswith("/stream") and _valid_seconds((case.query or {}).get("max_seconds", 1)):
        # A valid stream lasts max_seconds (an hour by default): cut short, so the server ends it
        # (a client timing out would cut it instead). An invalid max_seconds stays: it is the case.
        case.query = {**(case.query or {}), "max_seconds": STREAM_SECONDS}
    params = case.path_parameters or {}
    keep = zlib.crc32(repr(sorted(params.items())).encode() + repr(case.body).encode()) % 5 == 0
    if keep or case.meta is None:
        return
    path = case.operation.path
    if not case.meta.is_negative_at(ParameterLocation.PATH):
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
    body = case.body if isinstance(case.body, dict) and not case.meta.is_negative_at(ParameterLocation.BODY) else {}
    if isinstance(body.get("policy"), str):  # a stored policy by name
        body["policy"] = OPEN_POLICY["name"] if path == "/v1/runs" else POLICY["name"]
    if "run_id" in body:  # simulate, tune: a run with observations
        body["run_id"] = ENV.agent_run["id"]
    if isinstance(body.get("controller"), str):  # tune: the policy's controller, so the fit itself is fuzzed
        body["controller"] = "drift"


@schema.parametrize()
@settings(derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case, fuzz_service):
    if time.monotonic() - ENV.started > FUZZ_TIME_LIMIT:
        pytest.skip("fuzzing time budget spent")
    _use_real_resources(case)
    SENT[f"{case.method} {case.path}"] += 1
    response = case.call(base_url=ENV.url, timeout=MAX_RESPONSE_SECONDS)
    STATUSES[response.status_code] += 1
    BY_OPERATION[f"{case.operation.method.upper()} {case.operation.path}"][response.status_code] += 1
    case.validate_response(response)  # every check schemathesis has


def test_enough_requests_every_operation(fuzz_service):
    total = sum(SENT.values())
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(SENT.items()))
    assert total >= MIN_REQUESTS, f"only {total} requests generated ({summary})"
    assert not any(s >= 500 for s in STATUSES), STATUSES
    spec = httpx.get(f"{ENV.url}/openapi.json", headers=bearer(ADMIN)).json()  # token mode: a read
    assert spec == SPEC, "the fuzzed schema is not the one the service serves"
    ops = {f"{m.upper()} {p}" for p, item in spec["paths"].items() for m in item}
    assert ops <= set(BY_OPERATION), sorted(ops - set(BY_OPERATION))
    assert set(BEYOND_SCHEMA) <= ops, sorted(set(BEYOND_SCHEMA) - ops)
    for op, statuses in sorted(BY_OPERATION.items()):
        print(f"  {op}: {dict(sorted(statuses.items()))}")
    print(f"\nfuzz: {total} requests over {len(BY_OPERATION)} operations; statuses {dict(sorted(STATUSES.items()))}")
