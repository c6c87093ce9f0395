"""``kind: maximize`` end to end over real HTTP (uvicorn, SQLite): the service climbs a concave
acceptance curve with extremum seeking, every decision explains itself, the law's state is
stored between requests, ``validate`` / registration / ``simulate`` / the setpoint action treat
it as their own, and bad fields are refused with a 4xx naming the field."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from actuator.cli import app

KNOB = {"name": "onpolicy_fraction", "value": 0.1, "min": 0.0, "max": 1.0, "scale": "linear", "max_step": 0.5}
POLICY = {"name": "max-accept", "controllers": [{
    "name": "climb", "kind": "maximize", "probe": "draft.acceptance", "knob": "onpolicy_fraction",
    "dither": 0.1, "gain": 0.5, "max_step": 0.05}]}
PEAK = 0.6


def acceptance(fraction: float, step: int) -> float:
    # concave in the knob (peak at PEAK) on top of a probe that rises by itself as training goes on
    return 0.3 - 0.5 * (fraction - PEAK) ** 2 + 0.001 * step


def _observe(url: str, run: dict, seq: int, step: int, value: float, last: int) -> dict:
    r = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers={"Authorization": f"Bearer {run['token']}"},
                   json={"observations": [{"seq": seq, "step": step, "knobs": {"onpolicy_fraction": value},
                                           "probes": {"draft.acceptance": acceptance(value, step)}}],
                         "last_decision": last})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_service_climbs_to_the_peak_and_explains_each_move(sqlite_service):
    url = sqlite_service.url
    r = httpx.post(f"{url}/v1/runs", json={"name": "es", "policy": POLICY, "knobs": [KNOB]})
    assert r.status_code == 201, r.text
    run = r.json()
    value, last, decisions = KNOB["value"], 0, []
    for seq in range(60):
        body = _observe(url, run, seq, 2 * seq, value, last)
        for d in body["decisions"]:
            value, last = d["new_value"], d["number"]
            decisions.append(d)
    state = httpx.get(f"{url}/v1/runs/{run['id']}").json()["controllers"]["climb"]
    law = state["law"]
    # the centre of the search ends within 0.06 of the peak it started 0.5 away from
    assert abs(law["centre"] - PEAK) < 0.06, law
    assert law["updates"] == 60 and law["estimates"] == 57
    # the knob alternates around the centre by the dither, within the bounds, every decision
    assert len(decisions) == 60
    assert all(0.0 <= d["new_value"] <= 1.0 for d in decisions)
    assert all(abs(abs(d["new_value"] - d["components"]["centre"]) - 0.1) < 1e-9 for d in decisions)
    for d in decisions:
        assert d["controller"] == "climb" and d["reason"].startswith("maximize climb: draft.acceptance ")
        assert set(d["components"]) == {"objective", "gradient", "step", "dither", "centre"}
    assert "estimating the gradient" in decisions[0]["reason"]
    assert "d/d(onpolicy_fraction) ≈ +" in decisions[5]["reason"] and "limited by rate" in decisions[5]["reason"]
    assert decisions[10]["inputs"]["demodulated"] is not None and decisions[10]["inputs"]["dither"] == 0.1
    # the stored audit trail is what the responses said
    stored = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 100}).json()
    assert stored["total"] == 60
    # simulate replays the recorded observations through the same law
    r = httpx.post(f"{url}/v1/policies/simulate", json={"policy": POLICY, "run_id": run["id"]})
    assert r.status_code == 200, r.text
    sim = r.json()
    assert len(sim["decisions"]) == 60 and sim["decisions"][0]["reason"].startswith("maximize climb")
    # a maximize controller has no setpoint to change: refused, nothing changes
    r = httpx.put(f"{url}/v1/runs/{run['id']}/controllers/climb/setpoint", json={"setpoint": 0.5})
    assert 400 <= r.status_code < 500 and "no setpoint" in r.text, r.text


def test_bad_maximize_fields_are_refused_naming_the_field(sqlite_service):
    url = sqlite_service.url
    spec = POLICY["controllers"][0]
    cases = [
        ({**spec, "dither": None}, "controllers.0.dither"),
        ({**spec, "gain": -1.0}, "controllers.0.gain"),
        ({**spec, "setpoint": 0.5}, "controllers.0.setpoint"),
        ({**spec, "kp": 1.0}, "controllers.0.kp"),
        ({**spec, "cost_weight": 1.0}, "controllers.0.cost"),
        ({**spec, "cost": "train.step_seconds"}, "controllers.0.cost_weight"),
        ({**spec, "smoothing": 0.0}, "controllers.0.smoothing"),
        ({**spec, "scale": "integer"}, "controllers.0.scale"),
        ({**spec, "kind": "setpoint"}, "controllers.0.setpoint"),
    ]
    for controller, loc in cases:
        policy = {"name": "bad", "controllers": [{k: v for k, v in controller.items() if v is not None}]}
        r = httpx.post(f"{url}/v1/policies/validate", json=policy)
        assert r.status_code in (200, 422), r.text
        errors = r.json()["errors"] if r.status_code == 200 else r.json()["detail"]["errors"]
        assert loc in [e["loc"].removeprefix("body.") for e in errors], (loc, r.text)
        r = httpx.post(f"{url}/v1/runs", json={"name": "bad", "policy": policy, "knobs": [KNOB]})
        assert r.status_code == 422, r.text
        assert f"body.policy.{loc}" in [e["loc"] for e in r.json()["detail"]["errors"]], r.text
    # valid alone, unusable on this knob: the dither flip plus the step exceed the knob's rate limit
    wide = {"name": "wide", "controllers": [{**spec, "dither": 0.3}]}
    r = httpx.post(f"{url}/v1/policies/validate", json={**wide, "knobs": [KNOB]})
    assert r.status_code == 200 and r.json()["valid"] is False, r.text
    assert [e["loc"] for e in r.json()["errors"]] == ["controllers.0.dither"] and "max_step" in r.text
    r = httpx.post(f"{url}/v1/runs", json={"name": "wide", "policy": wide, "knobs": [KNOB]})
    assert r.status_code == 422 and "body.policy.controllers.0.dither" in r.text, r.text


def test_cli_validates_a_maximize_policy(tmp_path):
    import yaml

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(POLICY))
    bad.write_text(yaml.safe_dump({"name": "bad", "controllers": [{**POLICY["controllers"][0], "setpoint": 0.4,
                                                                   "dither": 0.0}]}))
    runner = CliRunner()
    assert runner.invoke(app, ["policy", "validate", str(good)]).exit_code == 0
    out = runner.invoke(app, ["policy", "validate", str(bad)], env={"COLUMNS": "200"})
    assert out.exit_code != 0
    assert "controllers.0.dither" in out.output
