"""Adding a law is one module plus one registration: a toy bang-bang law defined outside the
package (tests/plugins/bang_bang_law.py) drives a knob through a real service in another process,
which imports it at start (``ACTUATOR_PLUGINS``); a service without the plugin refuses the kind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import pytest

from actuator.testing import make_service

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
KNOB = {"name": "entropy_coef", "value": 0.01, "min": 0.0, "max": 0.1, "scale": "linear"}
POLICY = {"name": "toy-bang-bang", "controllers": [{
    "name": "flip", "kind": "bang_bang", "probe": "train.entropy", "knob": "entropy_coef",
    "threshold": 0.5, "low": 0.0, "high": 0.05}]}


def _service(tmp_path: Path, plugins: str | None):
    env = {"PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if plugins is not None:
        env["ACTUATOR_PLUGINS"] = plugins
    return make_service(f"sqlite:///{tmp_path / 'actuator.db'}", log_dir=str(tmp_path), extra_env=env)


@pytest.mark.timeout(180)
def test_a_toy_law_registered_by_a_plugin_decides_in_the_service(tmp_path: Path) -> None:
    svc = _service(tmp_path, "bang_bang_law").start()
    try:
        url = svc.url
        # validation runs in a worker process: it knows the law too (and checks it against the knobs)
        r = httpx.post(f"{url}/v1/policies/validate", json={**POLICY, "knobs": [KNOB]}, timeout=60)
        assert r.status_code == 200 and r.json()["valid"] is True, r.text
        r = httpx.post(f"{url}/v1/runs", json={"policy": POLICY, "knobs": [KNOB]}, timeout=30)
        assert r.status_code == 201, r.text
        run = r.json()
        auth = {"Authorization": f"Bearer {run['token']}"}
        value, seen = KNOB["value"], []
        for k, entropy in enumerate([0.3, 0.4, 0.7, 0.8, 0.2]):
            answer = httpx.post(f"{url}/v1/runs/{run['id']}/observations", headers=auth, timeout=30, json={
                "observations": [{"seq": k, "step": 10 * (k + 1), "metrics": {"entropy": entropy, "loss": 1.0},
                                  "knobs": {"entropy_coef": value}}]})
            assert answer.status_code == 200, answer.text
            for d in sorted(answer.json()["decisions"], key=lambda d: d["number"]):
                if d["number"] > len(seen):  # an answer repeats the decisions not applied yet
                    seen.append((entropy, d["old_value"], d["new_value"], d["reason"]))
                    value = d["new_value"]
        assert [(e, old, new) for e, old, new, _ in seen] == [(0.3, 0.01, 0.05), (0.7, 0.05, 0.0), (0.2, 0.0, 0.05)]
        assert seen[1][3] == "bang_bang flip: train.entropy 0.7 above 0.5: entropy_coef 0.05 -> 0", seen[1][3]
        stored = httpx.get(f"{url}/v1/runs/{run['id']}/decisions", params={"limit": 10}).json()["items"]
        assert sorted(d["new_value"] for d in stored) == [0.0, 0.05, 0.05]
        assert all(d["controller"] == "flip" and d["inputs"]["threshold"] == 0.5 for d in stored)
        state = httpx.get(f"{url}/v1/runs/{run['id']}").json()
        assert state["controllers"]["flip"]["components"] == {"above": 0.0}, state["controllers"]["flip"]

        # what every law gets from the engine without writing it: an operator's override holds the
        # knob (the law decides nothing), and the law acts again once it is released
        run_url = f"{url}/v1/runs/{run['id']}"
        assert httpx.post(f"{run_url}/knobs/entropy_coef/override", json={"value": 0.02}).status_code == 200
        before = len(httpx.get(f"{run_url}/decisions", params={"limit": 100}).json()["items"])
        r = httpx.post(f"{run_url}/observations", headers=auth, timeout=30, json={"observations": [
            {"seq": 5, "step": 60, "metrics": {"entropy": 0.9, "loss": 1.0}, "knobs": {"entropy_coef": 0.02}}]})
        assert r.status_code == 200, r.text
        assert len(httpx.get(f"{run_url}/decisions", params={"limit": 100}).json()["items"]) == before
        assert httpx.delete(f"{run_url}/knobs/entropy_coef/override").status_code == 200
        r = httpx.post(f"{run_url}/observations", headers=auth, timeout=30, json={"observations": [
            {"seq": 6, "step": 70, "metrics": {"entropy": 0.95, "loss": 1.0}, "knobs": {"entropy_coef": 0.02}}]})
        last = max(r.json()["decisions"], key=lambda d: d["number"])
        assert (last["controller"], last["old_value"], last["new_value"]) == ("flip", 0.02, 0.0), last
        # what the kind allows is asked of its registration: no setpoint to change
        r = httpx.put(f"{run_url}/controllers/flip/setpoint", json={"setpoint": 0.5})
        assert r.status_code == 422 and "switches train.entropy at its threshold" in r.text, r.text
    finally:
        svc.stop()


@pytest.mark.timeout(180)
def test_without_the_plugin_the_kind_is_refused_and_a_missing_plugin_stops_the_start(tmp_path: Path) -> None:
    svc = _service(tmp_path, None).start()
    try:
        r = httpx.post(f"{svc.url}/v1/runs", json={"policy": POLICY, "knobs": [KNOB]}, timeout=30)
        assert r.status_code == 422, r.text
        assert any(e["loc"] == "body.policy.controllers.0.kind" for e in r.json()["detail"]["errors"]), r.text
    finally:
        svc.stop()
    broken = _service(tmp_path / "b", "no_such_plugin_module")
    (tmp_path / "b").mkdir()
    with pytest.raises(RuntimeError, match="ACTUATOR_PLUGINS: cannot import 'no_such_plugin_module'"):
        broken.start(timeout=60)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
