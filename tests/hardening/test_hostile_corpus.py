"""The hostile-request corpus (tests/hardening/corpus/*.yaml) against the real service, on SQLite
and on Postgres.

Each case is sent over HTTP exactly as written (raw bytes, content types, chunked bodies); it must
get the expected 4xx, as JSON, with a message naming the field, and must change nothing stored:
the row count of every table, and every field of the runs it could touch (state, knobs,
controllers, guardrails, latest values, counters, updated_at) are compared before and after.
The benign file holds look-alikes that are legitimate (SQL or unicode in free text): they are
stored verbatim and touch nothing else.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harden import KNOBS, POLICY, StoreView, bearer, post_obs, register
from actuator.testing import make_service

CORPUS = Path(__file__).parent / "corpus"
HOSTILE_FILES = ("observations.yaml", "registration.yaml", "policies.yaml", "control.yaml")
ADMIN = "corpus-admin-" + uuid.uuid4().hex
KNOB = KNOBS[0]
KL_POLICY = {"name": "kl-policy", "controllers": [{"name": "kl", "probe": "kl_drift", "knob": "kl_beta",
                                                   "setpoint": 0.1, "kp": 1.0, "direction": "reverse"}]}


def load(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = yaml.safe_load((CORPUS / name).read_text())
    return doc["target"], doc["cases"]


def cases(files: tuple[str, ...]) -> list[Any]:
    out = []
    for f in files:
        target, items = load(f)
        names = [c["name"] for c in items]
        assert len(set(names)) == len(names), f"{f}: case names must be unique"
        for c in items:
            out.append(pytest.param(target, c, id=f"{f.removesuffix('.yaml')}: {c['name']}"))
    return out


# -- bodies the YAML cannot hold literally ----------------------------------------------------------
def _big(n: int) -> bytes:
    head = b'{"observations": [{"seq": 7, "step": 80}], "pad": "'
    return head + b"x" * (n - len(head) - 2) + b'"}'


def _nested(depth: int) -> bytes:
    return b'{"observations": ' + b"[" * depth + b"]" * depth + b"}"


def _nested_value(depth: int) -> bytes:
    return (b'{"observations": [{"seq": 7, "step": 80, "probes": {"kl_drift": ' + b'{"v": ' * depth + b"0.1"
            + b"}" * depth + b"}}]}")


def _set_at(body: Any, path: list[Any], value: Any) -> Any:
    node = body
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return body


GENERATORS = {
    "big": lambda n, body: _big(n),
    "nested": lambda n, body: _nested(n),
    "nested_value": lambda n, body: _nested_value(n),
    "many_probes": lambda n, body: json.dumps(
        {"observations": [{"seq": 7, "step": 80, "probes": {f"p{i}": 0.1 for i in range(n)}}]}).encode(),
    "many_observations": lambda n, body: json.dumps(
        {"observations": [{"seq": 7 + i, "step": 80 + i} for i in range(n)]}).encode(),
    "many_knobs": lambda n, body: json.dumps(
        {"policy": "hardening", "knobs": [{**KNOB, "name": f"custom.k{i}"} for i in range(n)]}).encode(),
    "many_controllers": lambda n, body: json.dumps({"name": "hostile", "controllers": [
        {"name": f"c{i}", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1, "kp": 1} for i in range(n)]}
    ).encode(),
    "long_name": lambda n, body: json.dumps({"name": "r" * n, "policy": "hardening", "knobs": [KNOB]}).encode(),
    "long_note": lambda n, body: json.dumps({"value": 1e-3, "note": "n" * n}).encode(),
    "huge_int_at": lambda path, body: json.dumps(_set_at(body, path, 10**400)).encode(),
}


def _expand(value: Any) -> Any:
    """"{knob}" → the valid knob, {"{knob}": {overrides}} → the knob with them, "{policy}" → the
    stored policy's name."""
    if value == "{knob}":
        return dict(KNOB)
    if value == "{policy}":
        return POLICY["name"]
    if isinstance(value, dict):
        if set(value) == {"{knob}"}:
            return {**KNOB, **value["{knob}"]}
        return {k: _expand(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v) for v in value]
    return value


class World:
    """One service and the state the corpus runs against."""

    def __init__(self, url: str, db: str) -> None:
        self.url, self.db = url, db
        self.view = StoreView(db)
        assert httpx.post(f"{url}/v1/policies", json=POLICY, headers=bearer(ADMIN)).status_code == 201
        assert httpx.post(f"{url}/v1/policies", json=KL_POLICY, headers=bearer(ADMIN)).status_code == 201
        self.victim = register(url, admin=ADMIN, policy=POLICY["name"])
        self.other = register(url, admin=ADMIN, policy=POLICY["name"])
        # seqs 0,1,2,5,6 stored (3 and 4 still "in flight"), a decision taken
        steps = {0: 10, 1: 20, 2: 30, 5: 60, 6: 70}
        drift = {0: 0.1, 1: 0.3, 2: 0.35, 5: 0.4, 6: 0.4}
        r = post_obs(url, self.victim, [{"seq": s, "step": st, "probes": {"kl_drift": drift[s]},
                                         "knobs": {"learning_rate": 1e-3}} for s, st in steps.items()])
        assert r.status_code == 200 and r.json()["decisions"], r.text
        assert post_obs(url, self.other, [{"seq": 0, "step": 5, "probes": {"kl_drift": 0.1}}]).status_code == 200

    def snapshot(self) -> dict[str, Any]:
        return self.view.snapshot([self.victim["id"], self.other["id"]])

    def headers(self, auth: str) -> dict[str, str]:
        return {"admin": bearer(ADMIN), "run": bearer(self.victim["token"]), "none": {}}[auth]

    def request(self, target: dict[str, Any], case: dict[str, Any]) -> httpx.Response:
        method = case.get("method", target["method"])
        path = case.get("path", target["path"]).replace("{run}", self.victim["id"])
        headers = self.headers(case.get("auth", target["auth"]))
        content_type = case.get("content_type", "application/json")
        if content_type is not None:
            headers["Content-Type"] = content_type
        body: bytes | None = None
        if "json" in case:
            body = json.dumps(_expand(copy.deepcopy(case["json"])), ensure_ascii=False).encode()
            if "{run}" in body.decode():
                body = body.decode().replace("{run}", self.victim["id"]).encode()
        if "raw" in case:
            body = case["raw"].encode()
        if "raw_hex" in case:
            body = bytes.fromhex(case["raw_hex"])
        if "generate" in case:
            (kind, arg), = case["generate"].items()
            body = GENERATORS[kind](arg, _expand(copy.deepcopy(case.get("json"))))
        content: Any = body
        if case.get("chunked") and body is not None:
            content = (body[i:i + 65536] for i in range(0, len(body), 65536))  # no Content-Length
        # httpx would quote some characters; send the path as written (unicode percent-encoded)
        url = httpx.URL(self.url).copy_with(raw_path=_raw_path(path))
        return httpx.request(method, url, content=content, headers=headers, timeout=60)


def _raw_path(path: str) -> bytes:
    from urllib.parse import quote

    return quote(path, safe="/:@!$&()*+,;=-._~").encode()


def _message(resp: httpx.Response) -> str:
    body = resp.json()  # every refusal is JSON, never an HTML or text error page
    detail = body["detail"]
    if isinstance(detail, str):
        return detail
    return detail["message"] + " " + " ".join(f"{e['loc']}: {e['msg']}" for e in detail.get("errors", []))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"corpus-{request.param}")
    if request.param == "sqlite":
        db = f"sqlite:///{tmp / 'actuator.db'}"
    else:
        db = request.getfixturevalue("postgres").create_database(f"corpus_{uuid.uuid4().hex[:10]}")
    svc = make_service(db, admin_token=ADMIN, log_dir=str(tmp)).start()
    w = World(svc.url, db)
    yield w
    w.view.close()
    svc.stop()
    logs = svc.logs()
    assert "Traceback" not in logs, logs[-3000:]


@pytest.mark.parametrize("target,case", cases(HOSTILE_FILES))
def test_hostile_request_is_refused_and_changes_nothing(world, target, case):
    before = world.snapshot()
    resp = world.request(target, case)
    assert resp.status_code == case["status"], (case["name"], resp.status_code, resp.text[:500])
    message = _message(resp)
    assert case["field"] in message, (case["field"], message)
    assert "Traceback" not in resp.text
    after = world.snapshot()
    assert after == before, f"{case['name']}: stored state changed"


@pytest.mark.parametrize("target,case", cases(("benign.yaml",)))
def test_hostile_looking_text_is_stored_verbatim(world, target, case):
    before = world.snapshot()
    resp = world.request(target, case)
    assert resp.status_code == 201, resp.text
    run = world.view.run(resp.json()["id"])
    for key, value in case["stored"].items():
        assert run[key] == value
    after = world.snapshot()
    assert after["runs"] == before["runs"], "another run changed"
    grew = {t: after["counts"][t] - before["counts"][t] for t in after["counts"]}
    assert grew == {"policies": 0, "runs": 1, "observations": 0, "decisions": 0, "events": 1}, grew


def test_corpus_covers_the_issue_list():
    """The categories the issue names are all in the corpus (a guard against it shrinking)."""
    text = " ".join(c["name"].lower() for f in HOSTILE_FILES for c in load(f)[1])
    for needle in ("nan", "infinity", "digits", "negative step", "decreasing", "unknown probe", "unknown knob",
                   "above", "reversed", "10 mb", "chunked", "nested", "text/plain", "form-encoded", "unicode",
                   "sql", "nul"):
        assert needle in text, needle
