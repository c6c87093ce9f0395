"""Every dashboard panel shows real data.

A real Prometheus (Debian's package, 1 s scrapes, the repository's scrape config) scrapes the real
controller (uvicorn, Postgres, Redis) while a small controlled run posts observations over HTTP:
a PID decision, a guardrail that adjusts, one that halts, rejected requests, and a Redis outage.
Then every PromQL expression in dashboards/grafana/dashboards/*.json — panel targets, annotations
and template variable queries — is run through Prometheus' HTTP API with Grafana's variables
filled in, and must parse and return data. A panel whose query returns nothing fails here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from dash import (
    DASHBOARD_FILES,
    Expr,
    all_expressions,
    all_variables,
    expressions,
    parse_variable_query,
    regex_value,
    substitute,
)
from prom import Prometheus, poll, scrape_config_for, start_prometheus
from actuator.testing import Postgres, Service, make_service, start_redis

ADMIN = "dashboards-admin-token"
# Token mode: /metrics needs a token; Prometheus sends this viewer token (the `authorization:` block
# commented in dashboards/prometheus/prometheus.yml).
VIEWER = "dashboards-viewer-token"
POLICY = {
    "name": "dashboards-drift",
    "controllers": [{
        "name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
        "kp": 1.0, "ki": 0.2, "filter": {"kind": "ema", "alpha": 0.5},
    }],
    "guardrails": [
        {"name": "drift_ceiling", "probe": "kl_drift", "bound": "upper", "threshold": 0.5,
         "action": "adjust", "knob": "learning_rate", "factor": 0.5},
        {"name": "drift_limit", "probe": "kl_drift", "bound": "upper", "threshold": 1.0, "action": "halt"},
    ],
}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}]
QUERY_DEADLINE = 20.0  # seconds a query may take to show data (scrapes are 1 s apart)


@dataclass
class Live:
    prom: Prometheus
    service: Service
    run: str  # the controlled run, the dashboard's $run
    other: str  # a second run that keeps running (stale-agent table, active runs)
    t0: float
    accepted: int
    values: dict[str, list[str]] = field(default_factory=dict)  # template variable -> values

    def substitutions(self) -> dict[str, str]:
        """All values of each variable, as Grafana's "All" writes them (single values as is)."""
        return {k: (v[0] if k == "run" else regex_value(v)) for k, v in self.values.items()}

    def run_query(self, e: Expr | str, expr: str, instant: bool) -> dict:
        if instant:
            return self.prom.query(expr)
        return self.prom.query_range(expr, self.t0 - 2, time.time(), 1.0)


def _post(svc: Service, run: dict, obs: list[dict], token: str | None = "run") -> httpx.Response:
    tok = run["token"] if token == "run" else token
    headers = {"Authorization": f"Bearer {tok}"} if tok else {}
    return httpx.post(f"{svc.url}/v1/runs/{run['id']}/observations", json={"observations": obs},
                      headers=headers, timeout=30)


def _viewer() -> dict[str, str]:
    return {"Authorization": f"Bearer {VIEWER}"}


def _obs(seq: int, step: int, kl: float, f1: float, lr: float) -> dict:
    return {"seq": seq, "step": step, "probes": {"kl_drift": kl, "hotpotqa.f1": f1},
            "metrics": {"loss": 2.0 - step / 100}, "knobs": {"learning_rate": lr}}


def _has(prom: Prometheus, expr: str) -> bool:
    body = prom.query(expr)
    return body.get("status") == "success" and bool(body["data"]["result"])


def _drive(prom: Prometheus, svc: Service, kill_redis) -> Live:  # type: ignore[no-untyped-def]
    t0 = time.time()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    runs = []
    for name in ("controlled", "bystander"):
        r = httpx.post(f"{svc.url}/v1/runs", json={"name": name, "policy": POLICY, "knobs": KNOBS},
                       headers=admin, timeout=30)
        assert r.status_code == 201, r.text
        runs.append(r.json())
    a, b = runs
    for run in runs:
        assert _post(svc, run, [_obs(0, 5, 0.1, 0.60, 1e-3)]).status_code == 200
    # Prometheus must see the run's counters at zero before they move, as it would in production.
    assert poll(lambda: _has(prom, f'actuator_decisions_total{{run="{a["id"]}"}}')
                and _has(prom, f'actuator_guardrail_breaches_total{{run="{a["id"]}"}}'), 20), \
        f"prometheus never scraped the run's counters\n{prom.logs()[-2000:]}"

    # drift above the setpoint: the PID lowers the learning rate
    r = _post(svc, a, [_obs(1, 10, 0.2, 0.58, 1e-3)])
    assert r.status_code == 200 and [d["knob"] for d in r.json()["decisions"]] == ["learning_rate"], r.text
    lr = r.json()["knobs"]["learning_rate"]
    time.sleep(1.5)
    # over the ceiling: the guardrail halves the learning rate
    r = _post(svc, a, [_obs(2, 15, 0.7, 0.55, lr)], )
    assert r.status_code == 200, r.text
    assert any("drift_ceiling" in d["reason"] for d in r.json()["decisions"]), r.text
    lr = r.json()["knobs"]["learning_rate"]
    # the bystander's probe report says the budget skipped hotpotqa 4 times in a row (actuator_probe_starved)
    starved = _obs(1, 10, 0.12, 0.61, 1e-3)
    starved["metrics"].update({"probe_share": 0.1, "probe_starved.hotpotqa": 4.0})
    assert _post(svc, b, [starved]).status_code == 200
    # rejected requests: no token, another run's token, an invalid body
    assert _post(svc, a, [_obs(3, 20, 0.1, 0.5, lr)], token=None).status_code == 401
    assert _post(svc, a, [_obs(3, 20, 0.1, 0.5, lr)], token=b["token"]).status_code == 403
    assert _post(svc, a, [{"seq": 3, "step": -1}]).status_code == 422
    time.sleep(1.5)
    # over the limit: the run is halted
    r = _post(svc, a, [_obs(3, 20, 1.5, 0.40, lr)])
    assert r.status_code == 200 and r.json()["state"] == "halted", r.text
    # Redis goes away: the next ingest is stored and answered (control needs the store, not Redis),
    # its live events are counted as unpublished; the health check says Redis is down.
    kill_redis()
    r = _post(svc, b, [_obs(2, 15, 0.11, 0.62, 1e-3)])
    assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
    health = httpx.get(f"{svc.url}/healthz", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert health.status_code == 503, health.text

    accepted = 4 + 3
    assert poll(lambda: _has(prom, 'actuator_backend_errors_total{backend="redis"} > 0')
                and _has(prom, "actuator_live_unpublished_events_total > 0")
                and _has(prom, f'actuator_run_state{{run="{a["id"]}", state="halted"}} == 1')
                and _has(prom, f"actuator_observations_ingested_total == {accepted}"), 20), \
        "prometheus never scraped the final state"
    return Live(prom, svc, a["id"], b["id"], t0, accepted)


def _resolve_variables(live: Live) -> None:
    """Template variables in dashboard order, each resolved through Prometheus' label API."""
    for path in DASHBOARD_FILES:
        for v in [v for v in all_variables() if v.dashboard == path.stem]:
            kind, arg, label = parse_variable_query(v.query)
            if kind == "label_values":
                match = substitute(arg, live.substitutions()) if arg else None
                values = live.prom.label_values(label, match, start=live.t0 - 2)  # type: ignore[arg-type]
            else:
                body = live.prom.query(substitute(arg, live.substitutions()))  # type: ignore[arg-type]
                values = [str(s["metric"]) for s in body["data"]["result"]]
            assert values, f"{v.dashboard}: variable ${v.name} ({v.query}) has no values"
            if v.name == "run":
                assert live.run in values and live.other in values, values
                values = [live.run]  # the operator picks the controlled run
            live.values.setdefault(v.name, values)


@pytest.fixture(scope="module")
def live(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("dashboards")
    redis = start_redis()
    db = postgres.create_database(f"dashboards_{os.getpid()}")
    svc = make_service(db, redis_url=redis.url, admin_token=ADMIN, log_dir=str(tmp),
                       extra_env={"ACTUATOR_VIEWER_TOKEN": VIEWER}).start()
    config = scrape_config_for(f"127.0.0.1:{svc.port}", interval="1s")
    for job in config["scrape_configs"]:
        job["authorization"] = {"type": "Bearer", "credentials": VIEWER}
    prom = start_prometheus(config)

    def kill_redis() -> None:
        redis.proc.kill()
        redis.proc.wait(10)

    try:
        live = _drive(prom, svc, kill_redis)
        _resolve_variables(live)
        yield live
    except Exception:
        print(f"--- service log ---\n{svc.logs()[-3000:]}\n--- prometheus log ---\n{prom.logs()[-3000:]}")
        raise
    finally:
        prom.stop()
        svc.stop()
        redis.stop()


def test_template_variables_have_values(live: Live) -> None:
    assert live.values["run"] == [live.run]
    assert set(live.values["probe"]) == {"kl_drift", "hotpotqa.f1"}
    assert live.values["knob"] == ["learning_rate"]


EXPRESSIONS = all_expressions()


@pytest.mark.parametrize("e", EXPRESSIONS, ids=[e.id for e in EXPRESSIONS])
def test_every_dashboard_query_returns_data(live: Live, e: Expr) -> None:
    expr = substitute(e.expr, live.substitutions())
    assert "$" not in expr, expr
    last: dict = {}

    def check() -> bool:
        nonlocal last
        last = live.run_query(e, expr, e.instant)
        # A query Prometheus cannot parse or evaluate fails at once, without waiting.
        assert last.get("status") == "success", f"{e.id}: Prometheus refused {expr!r}: {last}"
        return any(s.get("value") or s.get("values") for s in last["data"]["result"])

    assert poll(check, QUERY_DEADLINE), (
        f"{e.id}: no data within {QUERY_DEADLINE}s for\n  {expr}\n"
        f"({'instant' if e.instant else 'range'} query; last answer {last})")


def test_repeated_panels_show_data_for_each_value(live: Live) -> None:
    """A repeated panel is drawn once per value of its variable: every copy must show something."""
    checked = 0
    for path in DASHBOARD_FILES:
        by_panel: dict[int, list[Expr]] = {}
        for e in expressions(path):
            if e.repeat:
                by_panel.setdefault(e.panel_id, []).append(e)  # type: ignore[arg-type]
        for exprs in by_panel.values():
            var = exprs[0].repeat
            for value in live.values[var]:  # type: ignore[index]
                subs = {**live.substitutions(), var: regex_value([value])}  # type: ignore[dict-item]
                results = [live.run_query(e, substitute(e.expr, subs), e.instant) for e in exprs]
                assert any(r["data"]["result"] for r in results), f"{exprs[0].id} shows nothing for {var}={value}"
                checked += 1
    assert checked >= 3  # 2 probes + 1 knob


def _value(live: Live, expr: str) -> float:
    body = live.prom.query(expr)
    assert body["status"] == "success" and len(body["data"]["result"]) == 1, (expr, body)
    return float(body["data"]["result"][0]["value"][1])


def test_what_prometheus_shows_is_what_happened(live: Live) -> None:
    """The numbers behind the panels match what the run did, checked against the REST API."""
    run = f'run="{live.run}"'
    assert _value(live, "actuator_observations_ingested_total") == live.accepted
    page = httpx.get(f"{live.service.url}/v1/runs/{live.run}/decisions", headers=_viewer()).json()
    by_reason = {"controller": 0, "guardrail": 0}
    for d in page["items"]:
        by_reason["controller" if d["controller"] else "guardrail"] += 1
    assert by_reason == {"controller": 1, "guardrail": 1}, page
    for reason, n in by_reason.items():
        assert _value(live, f'actuator_decisions_total{{{run}, reason="{reason}"}}') == n
    for action, n in {"adjust": 1, "halt": 1, "alert": 0, "rollback": 0}.items():
        assert _value(live, f'actuator_guardrail_breaches_total{{{run}, action="{action}"}}') == n
    assert _value(live, f'actuator_run_state{{{run}, state="halted"}}') == 1
    assert _value(live, f'actuator_guardrail_threshold{{{run}, guardrail="drift_ceiling"}}') == 0.5
    assert _value(live, f'actuator_guardrail_threshold{{{run}, guardrail="drift_limit"}}') == 1.0
    assert _value(live, f'actuator_setpoint{{{run}, controller="drift"}}') == 0.1
    assert _value(live, f'actuator_probe_value{{{run}, probe="kl_drift"}}') == 1.5
    state = httpx.get(f"{live.service.url}/v1/runs/{live.run}", headers=_viewer()).json()
    assert _value(live, f'actuator_knob_target{{{run}, knob="learning_rate"}}') == pytest.approx(
        state["knobs"]["learning_rate"]["value"])
    for reason in ("401", "403", "422"):
        assert _value(live, f'actuator_requests_rejected_total{{reason="{reason}"}}') >= 1
    assert _value(live, 'actuator_backend_errors_total{backend="redis"}') >= 1
    assert _value(live, 'sum(actuator_request_duration_seconds_count{status="503"})') >= 1
    assert _value(live, 'sum(up{job="actuator"})') == 1
