"""Every Prometheus metric of the service, in one place (``actuator_`` namespace).

Per run (label ``run`` = the run id, plus the names below):

=============================================  =========  ==================================
metric                                          type       labels
=============================================  =========  ==================================
actuator_knob_value                             gauge      run, knob
actuator_knob_target                            gauge      run, knob
actuator_probe_value                            gauge      run, probe
actuator_probe_filtered_value                   gauge      run, controller, probe
actuator_setpoint                               gauge      run, controller, probe
actuator_guardrail_threshold                    gauge      run, guardrail, probe
actuator_controller_component                   gauge      run, controller, component (p|i|d)
actuator_decisions_total                        counter    run, knob, reason (controller|guardrail|operator)
actuator_guardrail_breaches_total               counter    run, action (alert|adjust|halt|rollback)
actuator_run_state                              gauge      run, state (running|paused|halted|finished)
actuator_last_observation_timestamp_seconds     gauge      run
actuator_run_step                               gauge      run
=============================================  =========  ==================================

Service:

=============================================  =========  ==================================
actuator_observations_ingested_total            counter    -
actuator_observations_duplicate_total           counter    -
actuator_request_duration_seconds               histogram  route (template), method, status
actuator_requests_rejected_total                counter    reason (the 4xx status code)
actuator_backend_errors_total                   counter    backend (store|redis)
=============================================  =========  ==================================

Labels are bounded: run ids (one per registered run), knob and probe names (validated
identifiers), controller and guardrail names (from policies, at most 32/64 per policy), route
templates (never raw paths), status codes and the small enums above. Never a step, a value or
free text (a run's *name* is user text, so it is not a label). Stale agents are
``time() - actuator_last_observation_timestamp_seconds`` in PromQL.

Counters a run can increment are created at zero when the run is first seen, so ``rate()``,
``increase()`` and ``changes()`` see its first decision or breach (a series born at 1 looks flat).

Several worker processes: when ``PROMETHEUS_MULTIPROC_DIR`` is set (before the process starts;
prometheus_client picks its value store at import), values live in per-process files in that
directory, every gauge aggregates as ``mostrecent`` (the last write across workers wins), and
``registry`` exposes the merge of all workers' files through a ``MultiProcessCollector``. Empty
the directory before the workers start. The registry is injected so tests get a fresh one.
"""

from __future__ import annotations

import collections
import os
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["Metrics", "RUN_STATES", "DECISION_REASONS", "GUARDRAIL_ACTIONS", "BACKENDS"]

_NS = "actuator"
RUN_STATES = ("running", "paused", "halted", "finished")
DECISION_REASONS = ("controller", "guardrail", "operator")
GUARDRAIL_ACTIONS = ("alert", "adjust", "halt", "rollback")
BACKENDS = ("store", "redis")
# Per-run gauges: one writer at a time per run, so across workers the latest write is the truth.
_GAUGE_MODE = "mostrecent"


class Metrics:
    """The service's metrics.

    ``registry`` is what ``/metrics`` exposes. Single process: the metrics are registered in it
    (injected or fresh). Multiprocess mode: the metrics write to per-process files and
    ``registry`` holds only the collector that merges them.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        r: CollectorRegistry | None = self.registry
        if self.multiprocess_dir:
            MultiProcessCollector(self.registry, path=self.multiprocess_dir)
            r = None  # registering the live objects too would expose this worker twice

        def gauge(name: str, doc: str, labels: list[str]) -> Gauge:
            return Gauge(name, doc, labels, namespace=_NS, registry=r, multiprocess_mode=_GAUGE_MODE)

        def counter(name: str, doc: str, labels: list[str] | None = None) -> Counter:
            return Counter(name, doc, labels or [], namespace=_NS, registry=r)

        # per run
        self.knob_value = gauge("knob_value", "Knob value in effect, as reported by the agent.", ["run", "knob"])
        self.knob_target = gauge("knob_target", "Knob value the controller orders.", ["run", "knob"])
        self.probe_value = gauge("probe_value", "Latest raw probe value.", ["run", "probe"])
        self.probe_filtered = gauge("probe_filtered_value", "Filtered probe value a controller acts on.",
                                    ["run", "controller", "probe"])
        self.setpoint = gauge("setpoint", "Controller setpoint (probe units).", ["run", "controller", "probe"])
        self.threshold = gauge("guardrail_threshold", "Guardrail threshold in force (probe units).",
                               ["run", "guardrail", "probe"])
        self.pid_component = gauge("controller_component", "Last PID components, p/i/d (knob scale units).",
                                   ["run", "controller", "component"])
        self.decisions = counter("decisions", "Decisions taken, by knob and what took them.",
                                 ["run", "knob", "reason"])
        self.breaches = counter("guardrail_breaches", "Guardrail breaches (firings), by action.", ["run", "action"])
        self.run_state = gauge("run_state", "1 for the state the run is in, 0 for the others.", ["run", "state"])
        self.last_observation = gauge("last_observation_timestamp_seconds",
                                      "Unix time of the run's last stored observation "
                                      "(stale agents: time() - this).", ["run"])
        self.training_step = gauge("run_step", "Latest optimizer step observed.", ["run"])
        # service
        self.observations = counter("observations_ingested", "Observations stored.")
        self.duplicates = counter("observations_duplicate", "Observations ignored as already stored.")
        self.requests = Histogram("request_duration_seconds", "Request latency by route template.",
                                  ["route", "method", "status"], namespace=_NS, registry=r,
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.rejected = counter("requests_rejected", "Requests refused (4xx), by status code.", ["reason"])
        self.backend_errors = counter("backend_errors", "Store and Redis errors.", ["backend"])
        for backend in BACKENDS:
            self.backend_errors.labels(backend)

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def _init_run(self, run: str, knobs: Any = ()) -> None:
        """Create the run's counters at zero (idempotent)."""
        for action in GUARDRAIL_ACTIONS:
            self.breaches.labels(run, action)
        for knob in knobs:
            for reason in DECISION_REASONS:
                self.decisions.labels(run, knob, reason)

    def observe_ingest(self, out: Any) -> None:
        """Export what one ingest (a store ``IngestOutcome``) changed."""
        run = out.run
        self._init_run(run.id, run.knobs)
        self.observations.inc(out.accepted)
        self.duplicates.inc(out.duplicates)
        if out.accepted:
            self.last_observation.labels(run.id).set_to_current_time()
            self.training_step.labels(run.id).set(run.last_step or 0)
        for probe, v in run.latest_probes.items():
            self.probe_value.labels(run.id, probe).set(v)
        for knob, v in run.knobs_in_effect.items():
            self.knob_value.labels(run.id, knob).set(v)
        for knob, spec in run.knobs.items():
            self.knob_target.labels(run.id, knob).set(spec["value"])
        for name, st in run.controllers.items():
            if "filtered" in st:
                self.probe_filtered.labels(run.id, name, st["probe"]).set(st["filtered"])
                self.setpoint.labels(run.id, name, st["probe"]).set(st["setpoint"])
            for comp in ("p", "i", "d"):
                if (st.get("components") or {}).get(comp) is not None:
                    self.pid_component.labels(run.id, name, comp).set(st["components"][comp])
        for name, st in run.guardrails.items():
            if st.get("threshold") is not None:
                self.threshold.labels(run.id, name, st["probe"]).set(st["threshold"])
        # One increment per label set, not per decision (a batch of 100 can make 99 of them).
        decided = collections.Counter((d.knob, "controller" if d.controller else "guardrail") for d in out.created)
        for (knob, reason), n in decided.items():
            self.decisions.labels(run.id, knob, reason).inc(n)
        fired = collections.Counter(ev["action"] for ev in out.events if ev["kind"] == "guardrail_breach")
        for action, n in fired.items():
            self.breaches.labels(run.id, action).inc(n)
        self.set_state(run.id, run.state)

    def observe_control(self, run: Any, decisions: Any = ()) -> None:
        """Export an operator action (pause/resume, manual override, setpoint, policy change): the
        run's state, knob targets and setpoints, and the decisions it made (reason ``operator``)."""
        self._init_run(run.id, run.knobs)
        for knob, spec in run.knobs.items():
            self.knob_target.labels(run.id, knob).set(spec["value"])
        for name, st in run.controllers.items():
            if st.get("setpoint") is not None and st.get("probe"):
                self.setpoint.labels(run.id, name, st["probe"]).set(st["setpoint"])
        for knob, n in collections.Counter(d.knob for d in decisions).items():
            self.decisions.labels(run.id, knob, "operator").inc(n)
        self.set_state(run.id, run.state)

    def set_state(self, run: str, state: str) -> None:
        """The run's state (called at registration too, which is when its counters start at 0)."""
        self._init_run(run)
        for s in RUN_STATES:
            self.run_state.labels(run, s).set(1.0 if s == state else 0.0)
