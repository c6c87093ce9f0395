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

A run's series end with it: once the run is finished or halted (both final), they stay
``retire_after`` seconds (so Prometheus scrapes their final values) and are then removed from
``/metrics``; nothing is exported for the run after that. Without this the ``run`` label's
cardinality grows with every run the service has ever seen.

Several worker processes: when ``PROMETHEUS_MULTIPROC_DIR`` is set (before the process starts;
prometheus_client picks its value store at import), values live in per-process files in that
directory, every gauge aggregates as ``mostrecent`` (the last write across workers wins), and
``registry`` exposes the merge of all workers' files through a ``MultiProcessCollector``. Empty
the directory before the workers start. The registry is injected so tests get a fresh one.
prometheus_client cannot delete a series from those files, so there a run is retired by a line
in ``retired-runs`` in the same directory (any worker may write it) and the collector leaves the
run's samples out; the files keep them until the service restarts and empties the directory.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

__all__ = ["Metrics", "RUN_STATES", "FINAL_STATES", "DECISION_REASONS", "GUARDRAIL_ACTIONS", "BACKENDS"]

_NS = "actuator"
RUN_STATES = ("running", "paused", "halted", "finished")
FINAL_STATES = ("halted", "finished")  # no way back to running: the run's series can go
DECISION_REASONS = ("controller", "guardrail", "operator")
GUARDRAIL_ACTIONS = ("alert", "adjust", "halt", "rollback")
BACKENDS = ("store", "redis")
# Retired runs remembered so that nothing of theirs is exported again (a run forgotten past this
# and observed again is retired again: its series come back for retire_after seconds, then go).
_GONE_REMEMBERED = 10_000
# Per-run gauges: one writer at a time per run, so across workers the latest write is the truth.
_GAUGE_MODE: Literal["mostrecent"] = "mostrecent"


class Metrics:
    """The service's metrics.

    ``registry`` is what ``/metrics`` exposes. Single process: the metrics are registered in it
    (injected or fresh). Multiprocess mode: the metrics write to per-process files and
    ``registry`` holds only the collector that merges them.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, retire_after: float = 300.0) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self.retire_after = retire_after
        self._retiring: dict[str, float] = {}  # run -> when its series go (in order: retire_after is fixed)
        self._retire_lock = threading.Lock()
        self._gone: dict[str, None] = {}  # runs whose series were removed, oldest first (bounded)
        r: CollectorRegistry | None = self.registry
        if self.multiprocess_dir:
            self._retired_log = _RetiredLog(os.path.join(self.multiprocess_dir, "retired-runs"))
            self.registry.register(_WithoutRetired(MultiProcessCollector(None, path=self.multiprocess_dir),
                                                   self._retired_log))
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
        self._per_run = (self.knob_value, self.knob_target, self.probe_value, self.probe_filtered, self.setpoint,
                         self.threshold, self.pid_component, self.decisions, self.breaches, self.run_state,
                         self.last_observation, self.training_step)
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
        self._remove_retired()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # -- the end of a run's series ------------------------------------------------------------
    def _exported(self, run: str) -> bool:
        """Whether the run's series are still written (False once they were retired)."""
        if run in self._gone:
            return False
        when = self._retiring.get(run)
        return when is None or time.time() < when

    def _retire(self, run: str) -> None:
        """The run reached a final state: its series go ``retire_after`` seconds from now."""
        with self._retire_lock:
            if run in self._retiring:
                return
            self._retiring[run] = when = time.time() + self.retire_after
        if self.multiprocess_dir:
            self._retired_log.add(run, when)
        self._remove_retired()

    def _remove_retired(self) -> None:
        """Remove the series of runs whose time is up (in this process; in multiprocess mode the
        collector leaves them out for every worker)."""
        now = time.time()
        with self._retire_lock:
            due = [run for run, when in self._retiring.items() if when <= now]
            for run in due:
                del self._retiring[run]
                self._gone[run] = None  # a late observation of the run does not bring them back
            while len(self._gone) > _GONE_REMEMBERED:
                del self._gone[next(iter(self._gone))]
        if self.multiprocess_dir:
            return  # the files cannot forget a series; _WithoutRetired hides them
        for run in due:
            for metric in self._per_run:
                metric.remove_by_labels({"run": run})

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
        self.observations.inc(out.accepted)
        self.duplicates.inc(out.duplicates)
        if not self._exported(run.id):
            return
        self._init_run(run.id, run.knobs)
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
                if st.get("setpoint") is not None:  # a maximize controller has none
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
        if not self._exported(run.id):
            return
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
        """The run's state (called at registration too, which is when its counters start at 0).
        A final state starts the countdown to the removal of the run's series."""
        if not self._exported(run):
            return
        self._init_run(run)
        for s in RUN_STATES:
            self.run_state.labels(run, s).set(1.0 if s == state else 0.0)
        if state in FINAL_STATES:
            self._retire(run)


class _RetiredLog:
    """Runs retired by any worker: one ``<run> <unix time>`` line each, appended (a single small
    write with O_APPEND: lines from several workers never interleave). Read incrementally."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._when: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, run: str, when: float) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{run} {when:.3f}\n".encode())
        finally:
            os.close(fd)

    def gone(self) -> set[str]:
        """The runs whose series are due to be hidden now."""
        with self._lock:
            try:
                with open(self.path, "rb") as fh:
                    fh.seek(self._offset)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
            self._offset += end
            for line in chunk[:end].decode(errors="replace").splitlines():
                run, _, when = line.partition(" ")
                try:
                    self._when[run] = min(float(when), self._when.get(run, float("inf")))
                except ValueError:
                    continue
            now = time.time()
            return {run for run, when in self._when.items() if when <= now}


class _WithoutRetired:
    """The multiprocess collector without the samples of retired runs."""

    def __init__(self, inner: MultiProcessCollector, log: _RetiredLog) -> None:
        self.inner, self.log = inner, log

    def collect(self) -> Iterator[Any]:
        gone = self.log.gone()
        for family in self.inner.collect():
            if gone:
                family.samples = [s for s in family.samples if s.labels.get("run") not in gone]
            yield family
