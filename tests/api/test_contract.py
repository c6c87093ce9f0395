"""The API contract the OpenAPI document states: one error envelope, bearer security, a typed
response for every operation, FastAPI's own body limit. Real answers of a real service (uvicorn on
SQLite, with an admin token) are validated against the schemas the document declares for them."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import jsonschema_rs
import pytest

from actuator.testing import make_service

ADMIN = "contract-admin-" + uuid.uuid4().hex
POLICY = {"name": "contract", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                               "setpoint": 0.1, "kp": 1.0, "ki": 0.2}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]
ENVELOPE = "#/components/schemas/ErrorPublic"
# Answers that are documents of their own: a JSON Schema, and preset policy documents by name.
FREE_FORM = {("GET", "/v1/policies/schema"), ("GET", "/v1/policies/presets")}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("contract")
    service = make_service(f"sqlite:///{tmp / 'actuator.db'}", admin_token=ADMIN, log_dir=str(tmp)).start()
    yield service
    service.stop()


@pytest.fixture(scope="module")
def spec(svc) -> dict[str, Any]:
    return httpx.get(f"{svc.url}/openapi.json", headers=_auth(ADMIN)).json()  # token mode: a read


@pytest.fixture(scope="module")
def run(svc) -> dict[str, Any]:
    r = httpx.post(f"{svc.url}/v1/runs", json={"policy": POLICY, "knobs": KNOBS}, headers=_auth(ADMIN))
    assert r.status_code == 201, r.text
    return r.json()


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in spec["paths"].items() for method, op in item.items()]


def _assert_conforms(spec: dict[str, Any], method: str, path: str, resp: httpx.Response) -> None:
    """The answer's status is declared for the operation and its JSON body validates against the
    schema declared for that status."""
    declared = spec["paths"][path][method.lower()]["responses"]
    assert str(resp.status_code) in declared, (method, path, resp.status_code, sorted(declared))
    assert resp.headers["content-type"].startswith("application/json"), resp.headers["content-type"]
    schema = declared[str(resp.status_code)]["content"]["application/json"]["schema"]
    validator = jsonschema_rs.validator_for({**schema, "components": spec["components"]})
    errors = [e.message for e in validator.iter_errors(resp.json())]
    assert not errors, (method, path, resp.status_code, resp.text[:300], errors)


def test_every_error_answer_is_declared_as_the_envelope(spec):
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for method, path, op in _operations(spec):
        for status, response in op["responses"].items():
            if status.startswith("2") or path == "/healthz":
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": ENVELOPE}, (method, path, status, schema)
        if op.get("parameters") or op.get("requestBody"):  # FastAPI validates them: a 422 can happen
            assert "422" in op["responses"], (method, path)
        if op.get("requestBody"):
            assert {"400", "413"} <= set(op["responses"]), (method, path)


def test_bearer_security_is_declared(spec):
    schemes = spec["components"]["securitySchemes"]
    assert {name: (s["type"], s["scheme"]) for name, s in schemes.items()} == {
        "AdminToken": ("http", "bearer"), "AgentToken": ("http", "bearer"), "ReadToken": ("http", "bearer")}
    for method, path, op in _operations(spec):
        security = op.get("security")
        if path.endswith("/observations"):
            assert security == [{"AgentToken": []}], (method, path, security)
        elif path.endswith(("/halt", "/finish")):
            assert security == [{"AdminToken": []}, {"AgentToken": []}], (method, path, security)
        elif method == "GET" or path.endswith("/stream/ticket"):  # reads: a token in token mode
            assert security == [{"ReadToken": []}], (method, path, security)
        elif method != "GET":
            assert security == [{"AdminToken": []}], (method, path, security)
        else:
            assert security is None, (method, path, security)
        if security:
            assert {"401", "403"} <= set(op["responses"]), (method, path)


def test_every_operation_declares_a_response_schema(spec):
    for method, path, op in _operations(spec):
        ok = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert len(ok) == 1, (method, path, ok)
        (response,) = ok.values()
        if path.endswith("/stream"):  # Server-Sent Events (EventSourceResponse): no JSON body, each event's fields
            assert set(response["content"]) == {"text/event-stream"}, (method, path, response)
            assert {"id", "event", "data"} <= set(response["content"]["text/event-stream"]["itemSchema"]["properties"])
            continue
        schema = response["content"]["application/json"]["schema"]
        if (method, path) in FREE_FORM:
            assert schema.get("type") == "object", (method, path, schema)
        elif schema.get("type") == "array":
            assert "$ref" in schema["items"], (method, path, schema)
        else:
            assert "$ref" in schema, (method, path, schema)


def test_real_error_answers_validate_against_the_document(svc, spec, run):
    url, rid = svc.url, run["id"]
    other = httpx.post(f"{url}/v1/runs", json={"policy": "contract", "knobs": KNOBS}, headers=_auth(ADMIN)).json()
    obs = {"observations": [{"seq": 0, "step": 0, "probes": {"kl_drift": 0.2}}]}
    big = b'{"observations": [' + b" " * 2_000_000 + b"]}"
    cases: list[tuple[str, str, dict[str, Any]]] = [
        # 401 / 403 / 404 from auth and lookups
        ("POST", "/v1/runs/{run_id}/observations", {"json": obs}),
        ("POST", "/v1/runs/{run_id}/observations", {"json": obs, "headers": _auth(other["token"])}),
        ("POST", "/v1/policies", {"json": POLICY}),
        ("POST", "/v1/policies", {"json": POLICY, "headers": _auth("not-the-admin")}),
        ("GET", "/v1/runs", {}),  # token mode: reads need a token too
        ("GET", "/v1/runs/{run_id}", {"path": {"run_id": "no-such-run"}, "headers": _auth(ADMIN)}),
        ("GET", "/v1/policies/{name}", {"path": {"name": "no_such_policy"}, "headers": _auth(ADMIN)}),
        # JSON, not an event stream
        ("GET", "/v1/runs/{run_id}/stream", {"path": {"run_id": "no-such-run"}, "headers": _auth(ADMIN)}),
        # 422: FastAPI's validation and the service's own rules
        ("GET", "/v1/runs/{run_id}/stream", {"params": {"max_seconds": "0"}, "headers": _auth(ADMIN)}),
        ("GET", "/v1/runs/{run_id}/events", {"params": {"after": "1_000"}, "headers": _auth(ADMIN)}),
        ("POST", "/v1/runs/{run_id}/observations", {"json": {"observations": []}, "headers": _auth(run["token"])}),
        ("GET", "/v1/runs", {"params": {"limit": "0"}, "headers": _auth(ADMIN)}),
        ("POST", "/v1/runs", {"json": {"policy": "no-such-policy"}, "headers": _auth(ADMIN)}),
        ("POST", "/v1/policies", {"json": {"name": "bad", "controllers": [{"kp": "x"}]}, "headers": _auth(ADMIN)}),
        ("POST", "/v1/runs/{run_id}/resume", {"headers": _auth(ADMIN)}),
        # 400 (not UTF-8) and 413 (with and without Content-Length)
        ("POST", "/v1/runs/{run_id}/observations", {"content": b'{"observations": [\xff]}',
                                                    "headers": _auth(run["token"])}),
        ("POST", "/v1/runs/{run_id}/observations", {"content": big, "headers": _auth(run["token"])}),
        ("POST", "/v1/runs/{run_id}/observations", {"content": iter([big[:600_000], big[600_000:]]),
                                                    "headers": _auth(run["token"])}),
    ]
    seen = set()
    for method, path, kw in cases:
        params = kw.pop("path", {"run_id": rid})
        headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
        resp = httpx.request(method, url + path.format(**params), headers=headers, timeout=30, **kw)
        assert resp.status_code >= 400, (method, path, resp.status_code)
        assert resp.json()["detail"]["message"], resp.text
        _assert_conforms(spec, method, path, resp)
        seen.add(resp.status_code)
    # halted twice: a 409 from the run's state
    assert httpx.post(f"{url}/v1/runs/{other['id']}/halt", headers=_auth(ADMIN)).status_code == 200
    conflict = httpx.post(f"{url}/v1/runs/{other['id']}/halt", headers=_auth(ADMIN))
    _assert_conforms(spec, "POST", "/v1/runs/{run_id}/halt", conflict)
    assert seen | {conflict.status_code} == {400, 401, 403, 404, 409, 413, 422}


def test_real_answers_of_every_read_validate(svc, spec, run):
    rid = run["id"]
    ok = httpx.post(f"{svc.url}/v1/runs/{rid}/observations", headers=_auth(run["token"]),
                    json={"observations": [{"seq": i, "step": i, "probes": {"kl_drift": 0.5}} for i in range(3)]})
    _assert_conforms(spec, "POST", "/v1/runs/{run_id}/observations", ok)
    for path in ("/healthz", "/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/decisions",
                 "/v1/runs/{run_id}/events", "/v1/runs/{run_id}/report", "/v1/policies", "/v1/policies/{name}",
                 "/v1/policies/schema", "/v1/policies/presets"):
        resp = httpx.get(svc.url + path.format(run_id=rid, name="contract"), headers=_auth(ADMIN), timeout=30)
        assert resp.status_code == 200, (path, resp.text[:300])
        _assert_conforms(spec, "GET", path, resp)
    sim = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": "contract", "run_id": rid, "limit": 2},
                     headers=_auth(ADMIN))
    _assert_conforms(spec, "POST", "/v1/policies/simulate", sim)
    assert (sim.json()["observations"], sim.json()["observations_total"]) == (2, 3)
    report = httpx.get(f"{svc.url}/v1/runs/{rid}/report", headers=_auth(ADMIN), timeout=30).json()
    assert report["sampling"]["observations"] == 3 and report["decisions_omitted"] == 0, report
    stream = httpx.get(f"{svc.url}/v1/runs/{rid}/stream", params={"max_seconds": 0.5}, headers=_auth(ADMIN), timeout=30)
    assert stream.status_code == 200, stream.text[:300]
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert "text/event-stream" in spec["paths"]["/v1/runs/{run_id}/stream"]["get"]["responses"]["200"]["content"]
    assert "event: observation" in stream.text, stream.text[:300]
    for action in ("pause", "resume"):
        resp = httpx.post(f"{svc.url}/v1/runs/{rid}/{action}", headers=_auth(ADMIN))
        _assert_conforms(spec, "POST", "/v1/runs/{run_id}/" + action, resp)


def test_an_undeclared_method_is_405_allowing_every_declared_one(svc, spec):
    for path in ("/v1/policies", "/v1/policies/{name}", "/v1/runs/{run_id}/knobs/{knob}/override"):
        resp = httpx.request("PATCH", svc.url + path.format(name="contract", run_id="r", knob="k"))
        assert resp.status_code == 405
        assert set(resp.headers["allow"].split(", ")) == {m.upper() for m in spec["paths"][path]}
        assert resp.json()["detail"]["message"] == "Method Not Allowed"


def test_a_body_over_the_limit_is_counted_as_rejected_either_way(svc, run):
    """As the hand-written limit did: a declared Content-Length (FastAPI's text/plain 413, given
    the envelope outside the app) and a chunked body (the handlers' 413) both count."""
    def rejected() -> float:
        metrics = httpx.get(f"{svc.url}/metrics", headers=_auth(ADMIN)).text
        line = next((m for m in metrics.splitlines() if m.startswith('actuator_requests_rejected_total{reason="413"}')), None)
        return float(line.split()[-1]) if line else 0.0

    big = b'{"observations": [' + b" " * 2_000_000 + b"]}"
    url, headers = f"{svc.url}/v1/runs/{run['id']}/observations", _auth(run["token"])
    before = rejected()
    assert httpx.post(url, content=big, headers=headers, timeout=30).status_code == 413
    assert rejected() == before + 1
    assert httpx.post(url, content=iter([big[:600_000], big[600_000:]]), headers=headers, timeout=30).status_code == 413
    assert rejected() == before + 2


def test_the_body_limit_is_fastapis():
    from actuator.api.app import create_app
    from actuator.config import Settings

    app = create_app(Settings(database_url="sqlite://", max_body_bytes=4096))
    assert app.max_body_size == 4096
    assert not [m for m in app.user_middleware if "Body" in m.cls.__name__]
