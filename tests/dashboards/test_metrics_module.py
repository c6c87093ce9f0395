"""actuator.metrics: the documented metric list is the real one, runs start their counters at
zero, and multiprocess mode merges worker files (counters summed, gauges most recent)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import actuator.metrics as metrics_module
from actuator.metrics import GUARDRAIL_ACTIONS, Metrics
from actuator.run_state import RunContext
from actuator.schemas import GuardrailBreach


def _documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metric table of the module docstring: name -> (type, label names)."""
    out = {}
    for line in metrics_module.__doc__.splitlines():  # type: ignore[union-attr]
        m = re.match(r"^(actuator_\w+)\s+(gauge|counter|histogram)\s+(.*)$", line.strip())
        if m:
            labels = tuple(re.sub(r"\s*\(.*?\)", "", m.group(3)).replace("-", "").replace(",", " ").split())
            out[m.group(1)] = (m.group(2), labels)
    return out


def test_docstring_lists_every_metric_with_its_type_and_labels() -> None:
    m = Metrics(CollectorRegistry())
    # prometheus_client keeps name, type and label names on these (stable) attributes
    real = {}
    for obj in vars(m).values():
        if hasattr(obj, "_labelnames") and hasattr(obj, "_type"):
            name = obj._name + ("_total" if obj._type == "counter" else "")
            real[name] = (obj._type, tuple(obj._labelnames))
    assert real == _documented()
    assert all(n.startswith("actuator_") for n in real)
    assert all(n.endswith("_total") for n, (t, _) in real.items() if t == "counter")
    for banned in ("step", "name", "value", "message", "path"):
        assert all(banned not in labels for _, labels in real.values()), banned


def test_injected_registry_and_counters_born_at_zero() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.set_state("r1", "running")  # what registration does
    for action in GUARDRAIL_ACTIONS:
        assert reg.get_sample_value("actuator_guardrail_breaches_total", {"run": "r1", "action": action}) == 0
    assert reg.get_sample_value("actuator_backend_errors_total", {"backend": "redis"}) == 0
    assert reg.get_sample_value("actuator_run_state", {"run": "r1", "state": "running"}) == 1
    assert Metrics(CollectorRegistry()).registry is not reg  # a fresh one each time


def _outcome(**run_fields):  # type: ignore[no-untyped-def]
    state = run_fields.pop("state", "running")
    knobs = run_fields.pop("knobs", {"learning_rate": {"value": 8e-4, "min": 1e-6, "max": 1e-2}})
    context = RunContext.from_json(
        knobs,
        {"drift": {"probe": "kl_drift", "filtered": 0.15, "setpoint": 0.1,
                   "components": {"p": -0.05, "i": -0.01, "d": None, "error": 0.05}}},
        {"ceiling": {"probe": "kl_drift", "threshold": 0.5}}, state=state)
    run = SimpleNamespace(id="r1", last_step=10, latest_probes={"kl_drift": 0.2},
                          knobs_in_effect={"learning_rate": 1e-3}, context=context, **run_fields)
    decision = SimpleNamespace(knob="learning_rate", controller="drift")
    breach = GuardrailBreach(step=1, guardrail="ceiling", action="adjust", value=0.6, threshold=0.5, reason="r")
    # knobs_in_effect: what the store computed for this ingest (observed, or acknowledged since)
    return SimpleNamespace(run=run, accepted=1, duplicates=0, created=[decision], events=[breach],
                           knobs_in_effect={"learning_rate": 1e-3})


def test_observe_ingest_exports_the_run() -> None:
    reg = CollectorRegistry()
    Metrics(reg).observe_ingest(_outcome())
    v = reg.get_sample_value
    assert v("actuator_observations_ingested_total") == 1
    assert v("actuator_knob_value", {"run": "r1", "knob": "learning_rate"}) == 1e-3
    assert v("actuator_knob_target", {"run": "r1", "knob": "learning_rate"}) == 8e-4
    assert v("actuator_probe_filtered_value", {"run": "r1", "controller": "drift", "probe": "kl_drift"}) == 0.15
    assert v("actuator_setpoint", {"run": "r1", "controller": "drift", "probe": "kl_drift"}) == 0.1
    assert v("actuator_guardrail_threshold", {"run": "r1", "guardrail": "ceiling", "probe": "kl_drift"}) == 0.5
    assert v("actuator_controller_component", {"run": "r1", "controller": "drift", "component": "p"}) == -0.05
    assert v("actuator_controller_component", {"run": "r1", "controller": "drift", "component": "d"}) is None
    assert v("actuator_decisions_total", {"run": "r1", "knob": "learning_rate", "reason": "controller"}) == 1
    assert v("actuator_decisions_total", {"run": "r1", "knob": "learning_rate", "reason": "guardrail"}) == 0
    assert v("actuator_guardrail_breaches_total", {"run": "r1", "action": "adjust"}) == 1
    assert v("actuator_last_observation_timestamp_seconds", {"run": "r1"}) > 0


_WORKER = """
import sys, time
from actuator.metrics import Metrics
m = Metrics()
m.observations.inc(int(sys.argv[1]))
m.knob_value.labels("r1", "learning_rate").set(float(sys.argv[2]))
m.set_state("r1", sys.argv[3])
"""
_EXPOSE = """
import sys
from prometheus_client import CollectorRegistry
from actuator.metrics import Metrics
body, ctype = Metrics(CollectorRegistry()).render()
sys.stdout.write(body.decode())
"""


def test_multiprocess_mode_merges_worker_files(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def py(code: str, *args: str) -> str:
        return subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, capture_output=True,
                              text=True, timeout=60).stdout

    py(_WORKER, "3", "0.001", "running")
    py(_WORKER, "4", "0.0005", "halted")  # the later write wins for gauges
    families = {f.name: f for f in text_string_to_metric_families(py(_EXPOSE))}
    assert [s.value for s in families["actuator_observations_ingested"].samples
            if s.name.endswith("_total")] == [7]
    knob = families["actuator_knob_value"].samples
    assert [(s.labels, s.value) for s in knob] == [({"run": "r1", "knob": "learning_rate"}, 0.0005)]
    state = {s.labels["state"]: s.value for s in families["actuator_run_state"].samples}
    assert state == {"running": 0.0, "paused": 0.0, "halted": 1.0, "finished": 0.0}


def test_observe_control_counts_operator_decisions() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    ctx = RunContext.from_json({"learning_rate": {"value": 5e-4, "min": 1e-6, "max": 1e-2, "override": 5e-4}},
                               state="paused")
    m.observe_control("r1", ctx, [SimpleNamespace(knob="learning_rate", controller=None)])
    v = reg.get_sample_value
    assert v("actuator_decisions_total", {"run": "r1", "knob": "learning_rate", "reason": "operator"}) == 1
    assert v("actuator_decisions_total", {"run": "r1", "knob": "learning_rate", "reason": "controller"}) == 0
    assert v("actuator_knob_target", {"run": "r1", "knob": "learning_rate"}) == 5e-4
    assert v("actuator_run_state", {"run": "r1", "state": "paused"}) == 1
