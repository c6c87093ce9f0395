"""One knob value in effect (issue 57): the latest observation's, or a value the agent acknowledged
applying since, computed by the store and shown alike by the REST answers, the CLI, the console's
run list and Prometheus (SQLite and Postgres). A decision never applied is not in effect."""

from __future__ import annotations

import json
import re

import httpx
from typer.testing import CliRunner

from actuator.cli import app

POLICY = {"name": "in-effect", "controllers": [{"name": "kl-lr", "probe": "kl_drift", "knob": "learning_rate",
                                                 "setpoint": 0.1, "kp": 2.0, "ki": 0.5, "direction": "direct"}]}
KNOBS = [{"name": "learning_rate", "value": 5e-5, "min": 5e-7, "max": 5e-5, "scale": "log", "max_step": 1.0},
         {"name": "kl_weight", "value": 0.4629, "min": 0.0, "max": 2.0, "scale": "linear", "max_step": 0.25}]


def _run_with_an_unapplied_decision(url: str) -> tuple[str, float, float]:
    """A run whose second decision the agent applied within its own limits (not exactly the value
    ordered) and acknowledged with no newer observation, as at a run's end. Returns (run id,
    value in effect, value ordered)."""
    run = httpx.post(f"{url}/v1/runs", json={"name": "in-effect-run-with-a-long-name", "policy": POLICY,
                                              "knobs": KNOBS}).json()
    auth = {"Authorization": f"Bearer {run['token']}"}

    def post(body: dict) -> list[dict]:
        r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, json=body)
        assert r.status_code == 200, r.text
        return r.json()["decisions"]

    knobs = {"learning_rate": 5e-5, "kl_weight": 0.4629}
    first = post({"observations": [{"seq": 0, "step": 0, "probes": {"kl_drift": 0.0}, "knobs": knobs},
                                   {"seq": 1, "step": 4, "probes": {"kl_drift": 0.2}, "knobs": knobs}]})[0]
    knobs["learning_rate"] = first["new_value"]
    second = post({"observations": [{"seq": 2, "step": 8, "probes": {"kl_drift": 0.3}, "knobs": knobs}],
                   "last_decision": first["number"],
                   "applied": [{"number": first["number"], "status": "applied", "step": 5,
                                "value": first["new_value"]}]})[-1]
    assert second["number"] == first["number"] + 1
    applied = second["new_value"] * 1.2  # the agent's own limits held it back
    # a repeat of the last observation (a duplicate) carries the acknowledgement
    post({"observations": [{"seq": 2, "step": 8, "probes": {"kl_drift": 0.3}, "knobs": knobs}],
          "last_decision": second["number"],
          "applied": [{"number": second["number"], "status": "applied", "step": 9, "value": applied}]})
    return run["id"], applied, second["new_value"]


def test_rest_cli_console_and_metrics_show_the_value_in_effect_not_the_last_ordered(service) -> None:
    url = service.url
    run_id, applied, ordered = _run_with_an_unapplied_decision(url)
    assert abs(applied - ordered) / applied > 0.05

    listed = next(r for r in httpx.get(f"{url}/v1/runs").json() if r["id"] == run_id)
    assert listed["knobs_in_effect"]["learning_rate"] == applied
    assert listed["knobs"]["learning_rate"]["value"] == ordered  # what was ordered stays told apart
    state = httpx.get(f"{url}/v1/runs/{run_id}").json()
    assert state["knobs_in_effect"] == listed["knobs_in_effect"]

    metrics = httpx.get(f"{url}/metrics").text
    shown = re.search(r'actuator_knob_value\{knob="learning_rate",run="%s"\} (\S+)' % run_id, metrics)
    assert shown is not None and float(shown.group(1)) == applied

    page = httpx.get(f"{url}/ui").text
    assert f"learning_rate={applied:.4g}" in page and f"{ordered:.4g}" not in page

    runner = CliRunner()
    out = runner.invoke(app, ["runs", "--url", url], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    assert f"{applied:.4g}" in out.output and f"{ordered:.4g}" not in out.output
    lines = out.output.splitlines()
    assert max(map(len, lines)) <= 80, out.output
    # whole words: a knob's name and its value are never broken into fragments
    words = {w for line in lines for w in line.split()}
    assert {"learning_rate", "kl_weight", f"{applied:.4g}", "0.4629", run_id, "in-effect@1"} <= words, out.output

    wide = runner.invoke(app, ["runs", "--url", url, "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    row = next(line for line in wide.output.splitlines() if run_id in line)
    assert "in-effect-run-with-a-long-name" in row and "learning_rate" in row and "kl_weight" in row
    assert run_id in row

    as_json = runner.invoke(app, ["runs", "--url", url, "-o", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.output)[0]["knobs_in_effect"]["learning_rate"] == applied
