"""Auth on every mutating endpoint, tokens hashed at rest, no secret in any log.

The mutating routes are enumerated from the service's own OpenAPI document, so an endpoint added
later is covered without touching this file: it must refuse a request without a token (401) and a
request with another run's token (403), or be listed in PUBLIC with the reason it may be open
(and then it must store nothing).
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from actuator.store import hash_token
from harden import POLICY, StoreView, bearer, post_obs, register, verbose_service

ADMIN = "admin-" + uuid.uuid4().hex
MUTATING = {"post", "put", "patch", "delete"}
# Mutating methods that are open on purpose (none: validate and simulate store nothing, but they
# cost more than a read, so they take the admin token too).
PUBLIC: dict[tuple[str, str], str] = {}
# POSTs that only read (token mode: a viewer's or the run's token; tests/hardening/test_reads_behind_token.py).
READS = {("POST", "/v1/runs/{run_id}/stream/ticket"): "a ticket to open the run's live stream; stores nothing"}
# A value for each path parameter, so a request reaches auth on a real resource.
FILL = {"run_id": "{run}", "knob": "learning_rate", "controller": "drift", "name": POLICY["name"], "version": "1"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auth")
    db = f"sqlite:///{tmp / 'actuator.db'}"
    svc = verbose_service(db, admin_token=ADMIN, log_dir=str(tmp)).start()
    assert httpx.post(f"{svc.url}/v1/policies", json=POLICY, headers=bearer(ADMIN)).status_code == 201
    a = register(svc.url, admin=ADMIN, policy=POLICY["name"])
    b = register(svc.url, admin=ADMIN, policy=POLICY["name"])
    r = post_obs(svc.url, a, [{"seq": 0, "step": 1, "probes": {"kl_drift": 0.1}},
                              {"seq": 1, "step": 2, "probes": {"kl_drift": 0.5}}])
    assert r.status_code == 200, r.text
    view = StoreView(db)
    yield svc, view, a, b
    view.close()
    svc.stop()


def mutating_routes(url: str) -> list[tuple[str, str, bool]]:
    spec = httpx.get(f"{url}/openapi.json", headers=bearer(ADMIN)).json()  # token mode: the document is a read
    return sorted((m.upper(), path, "requestBody" in op) for path, item in spec["paths"].items()
                  for m, op in item.items() if m in MUTATING)


def concrete(path: str, run_id: str) -> str:
    for param in [p.strip("{}") for p in path.split("/") if p.startswith("{")]:
        assert param in FILL, f"{path}: no value for path parameter {param!r}; add one to FILL"
        path = path.replace("{" + param + "}", FILL[param].replace("{run}", run_id))
    return path


def test_every_mutating_route_needs_a_token_and_the_right_one(env):
    svc, view, a, b = env
    routes = mutating_routes(svc.url)
    assert len(routes) >= 12, routes  # the enumeration really found the API
    guarded = [(m, p, body) for m, p, body in routes if (m, p) not in PUBLIC and (m, p) not in READS]
    before = view.snapshot([a["id"], b["id"]])
    seen = []
    for method, path, has_body in guarded:
        url = svc.url + concrete(path, a["id"])
        kw = {"json": {}} if has_body else {}
        r = httpx.request(method, url, **kw)
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        assert r.headers.get("www-authenticate") == "Bearer", (method, path)
        r = httpx.request(method, url, headers=bearer(b["token"]), **kw)  # run B's token on run A
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        r = httpx.request(method, url, headers=bearer("act_" + uuid.uuid4().hex), **kw)  # a forged token
        assert r.status_code == 403, (method, path, r.status_code, r.text)
        r = httpx.request(method, url, headers={"Authorization": f"Basic {ADMIN}"}, **kw)  # not a bearer
        assert r.status_code == 401, (method, path, r.status_code, r.text)
        seen.append((method, path))
    # the agent's endpoint refuses the admin token too: an operator is not the run's agent
    r = post_obs(svc.url, {**a, "token": ADMIN}, [{"seq": 9, "step": 9}])
    assert r.status_code == 403, r.text
    assert view.snapshot([a["id"], b["id"]]) == before, "a refused request changed stored state"
    assert ("POST", "/v1/runs/{run_id}/observations") in seen and ("POST", "/v1/runs") in seen


def test_computing_routes_store_nothing(env):
    svc, view, a, b = env
    routes = {(m, p) for m, p, _ in mutating_routes(svc.url)}
    assert set(PUBLIC) <= routes, "a PUBLIC entry no longer exists: remove it"
    before = view.snapshot([a["id"], b["id"]])
    r = httpx.post(f"{svc.url}/v1/policies/validate", json=POLICY, headers=bearer(ADMIN))
    assert r.status_code == 200 and r.json()["valid"], r.text
    r = httpx.post(f"{svc.url}/v1/policies/simulate", json={"policy": POLICY, "run_id": a["id"]},
                   headers=bearer(ADMIN))
    assert r.status_code == 200, r.text
    assert view.snapshot([a["id"], b["id"]]) == before


def test_tokens_are_hashed_at_rest_and_never_served(env):
    svc, view, a, b = env
    dump = view.dump()
    for run in (a, b):
        assert run["token"] not in dump
        assert hash_token(run["token"]) in dump  # what is stored is the SHA-256
    assert ADMIN not in dump
    # no endpoint serves a token or its hash back after registration
    for path in ("/v1/runs", f"/v1/runs/{a['id']}", f"/v1/runs/{a['id']}/decisions", f"/v1/runs/{a['id']}/events",
                 f"/v1/runs/{a['id']}/report", "/metrics"):
        text = httpx.get(svc.url + path, headers=bearer(ADMIN)).text  # token mode: reads need a token
        for run in (a, b):
            assert run["token"] not in text and hash_token(run["token"]) not in text, path


def test_no_secret_in_the_service_logs(env):
    """Logs at DEBUG everywhere (ours, uvicorn with its access log, SQLAlchemy's statements with
    their parameters), after successes, refusals, bad tokens and validation errors."""
    svc, view, a, b = env
    # a few more things worth logging: a rejected batch, a wrong token, an admin action
    httpx.post(f"{svc.url}/v1/runs/{a['id']}/observations", headers=bearer(a["token"]),
               content=b'{"observations": [{"seq": 5, "step": 1, "probes": {"kl_drift": NaN}}]}')
    httpx.post(f"{svc.url}/v1/runs/{a['id']}/halt", headers=bearer(b["token"]))
    httpx.post(f"{svc.url}/v1/runs/{a['id']}/pause", headers=bearer(ADMIN))
    httpx.post(f"{svc.url}/v1/runs/{a['id']}/resume", headers=bearer(ADMIN))
    svc.stop()  # flush (the last test of the module: the fixture's stop is then a no-op)
    logs = svc.logs()
    assert "POST /v1/runs/" in logs and "SELECT" in logs, "the verbose logs were not captured"
    for secret in (ADMIN, a["token"], b["token"]):
        assert secret not in logs
    assert "act_" not in logs  # not even a run token's prefix
