"""The alerting rules shipped beside the dashboards (dashboards/prometheus/alerts.yml): loaded by the
Prometheus config docker-compose mounts, they fire for breaches, halts, rollbacks, starved probes
and silent runs, and only then: ``promtool test rules`` (Debian's prometheus package) on
tests/dashboards/alerts_test.yml, series as actuator/metrics.py exports them."""

from __future__ import annotations

import re
import shutil
import subprocess

import yaml

from actuator.metrics import Metrics
from actuator.testing import need_binary
from dash import REPO
from prom import REPO_SCRAPE_CONFIG

RULES = REPO / "dashboards" / "prometheus" / "alerts.yml"
TESTS = REPO / "tests" / "dashboards" / "alerts_test.yml"


def test_promtool_unit_tests_of_the_alerting_rules_pass(tmp_path):
    promtool = need_binary("promtool", "prometheus")
    shutil.copy(RULES, tmp_path / "alerts.yml")
    spec = yaml.safe_load(TESTS.read_text())
    spec["rule_files"] = [str(tmp_path / "alerts.yml")]
    (tmp_path / "test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = subprocess.run([promtool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    # every rule has a test
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested = {t["alertname"] for case in spec["tests"] for t in case["alert_rule_test"]}
    assert rules == tested == {"ActuatorGuardrailBreach", "ActuatorRunHalted", "ActuatorRollback",
                               "ActuatorProbeStarved", "ActuatorRunSilent"}


def test_the_rules_are_wired_and_name_only_metrics_the_service_exports():
    config = yaml.safe_load(REPO_SCRAPE_CONFIG.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert "./dashboards/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in compose["services"]["prometheus"][
        "volumes"]
    exported = {m.name for m in Metrics().registry.collect()}
    exported |= {f"{n}_total" for n in exported}
    used = set()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            used |= set(re.findall(r"\bactuator_[a-z_]+", rule["expr"]))
    assert used and used <= exported, used - exported


def test_the_service_exports_a_probes_consecutive_budget_skips(sqlite_service):
    """``actuator_probe_starved`` (what ActuatorProbeStarved reads) from the agent's probe reports:
    the skips of the latest report, back to 0 once the probe ran."""
    import httpx

    url = sqlite_service.url
    policy = {"name": "starve-metric", "controllers": [{"name": "c", "probe": "kl_drift", "knob": "learning_rate",
                                                        "setpoint": 0.1, "kp": 1.0}]}
    run = httpx.post(f"{url}/v1/runs", json={"policy": policy, "knobs": [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-2}]})
    assert run.status_code == 201, run.text
    run = run.json()

    def report(seq: int, metrics: dict) -> float | None:
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                       json={"observations": [{"seq": seq, "step": seq, "probes": {}, "metrics": metrics}]})
        assert r.status_code == 200, r.text
        line = re.search(rf'actuator_probe_starved\{{[^}}]*probe="kl_drift"[^}}]*run="{run["id"]}"[^}}]*\}} (\S+)',
                         httpx.get(f"{url}/metrics").text)
        return float(line.group(1)) if line else None

    assert report(0, {"probe_share": 0.1}) is None  # never starved: no series
    assert report(1, {"probe_share": 0.1, "probe_starved.kl_drift": 3.0}) == 3.0
    assert report(2, {"loss": 1.0}) == 3.0  # not a probe report: unchanged
    assert report(3, {"probe_share": 0.1}) == 0.0  # it ran
