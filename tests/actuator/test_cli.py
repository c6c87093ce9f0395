"""The typer CLI against a real service: runs, decisions (--explain), policy validate."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from actuator.cli import app

POLICY = {"name": "cli-policy", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                                  "setpoint": 0.1, "kp": 1.0, "ki": 0.2}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log"}]


def test_runs_and_decisions(sqlite_service):
    url = sqlite_service.url
    run = httpx.post(f"{url}/v1/runs", json={"name": "cli-run", "policy": POLICY, "knobs": KNOBS}).json()
    headers = {"Authorization": f"Bearer {run['token']}"}
    for seq, drift in enumerate([0.1, 0.4]):
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=headers,
                       json={"observations": [{"seq": seq, "step": 10 * (seq + 1), "probes": {"kl_drift": drift}}]})
        assert r.status_code == 200
    runner = CliRunner()
    out = runner.invoke(app, ["runs", "--url", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert run["id"] in out.output and "cli-run" in out.output and "cli-policy@1" in out.output

    out = runner.invoke(app, ["decisions", run["id"], "--url", url], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "learning_rate" in out.output and "1 decisions" in out.output

    out = runner.invoke(app, ["decisions", run["id"], "--url", url, "--explain"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "setpoint 0.1" in out.output and "raw 0.4" in out.output and "P " in out.output

    out = runner.invoke(app, ["decisions", "no-such-run", "--url", url])
    assert out.exit_code == 1 and "404" in out.output


def test_unreachable_service_is_a_clear_error():
    out = CliRunner().invoke(app, ["runs", "--url", "http://127.0.0.1:9"])
    assert out.exit_code == 1 and "error" in out.output


def test_policy_validate(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: learning_rate, setpoint: 0.1, kp: 1}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\ncontrollers:\n  - {name: c, probe: kl_drift, knob: warp_speed, setpoint: 0.1, kp: -1}\n")
    runner = CliRunner()
    assert runner.invoke(app, ["policy", "validate", str(good)]).exit_code == 0
    out = runner.invoke(app, ["policy", "validate", str(bad)], env={"COLUMNS": "200"})
    assert out.exit_code == 1
    assert "controllers.0.knob" in out.output and "controllers.0.kp" in out.output
