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
actuator_probe_starved                          gauge      run, probe
=============================================  =========  ==================================

Service:

=============================================  =========  ==================================
actuator_observations_ingested_total            counter    -
actuator_observations_duplicate_total           counter    -
actuator_request_duration_seconds               histogram  route (template), method, status
actuator_requests_rejected_total                counter    reason (the 4xx status code)
actuator_backend_errors_total                   counter    backend (store|redis)
actuator_notifications_total                    counter    outcome (sent|failed|dropped)
actuator_live_unpublished_events_total          counter    -
actuator_streams_refused_total                  counter    cap (run|client)
actuator_streams_dropped_total                  counter    -
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
prometheus_client cannot delete a series from its files (they keep every label set ever
written, and every scrape reads them all), so per-run series are not written there: each worker
files them in two files of its own in the same directory and format (``counter_runs-<pid>.db``,
``gauge_mostrecent_runs-<pid>.db``), which the same collector merges, and which it rewrites
without a run once the run's series are due to go. A worker that retires a run appends it to
``retired-runs`` in the directory; every worker reads that file (at least every second), rewrites
its files when a run's time is up, and leaves the run's samples out of its scrapes meanwhile. A
scrape reads the series of the runs still exported, whatever the number of runs seen before.
So per-run series are written through the methods here (``observe_*``, ``set_state``), never
through the metric objects, whose values would land in prometheus_client's files for good.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from .run_state import PROBE_REPORT, STARVED_PREFIX, RunContext
from .schemas import FINAL_STATES, RUN_STATES, GuardrailBreach, RunStateName

__all__ = ["Metrics", "RUN_STATES", "FINAL_STATES", "DECISION_REASONS", "GUARDRAIL_ACTIONS", "BACKENDS"]

_NS = "actuator"
# RUN_STATES (the run_state gauge's label values) are RunStateName's; in FINAL_STATES the run's series can go.
DECISION_REASONS = ("controller", "guardrail", "operator")
GUARDRAIL_ACTIONS = ("alert", "adjust", "halt", "rollback")
BACKENDS = ("store", "redis")
# Retired runs remembered so that nothing of theirs is exported again (a run forgotten past this
# and observed again is retired again: its series come back for retire_after seconds, then go).
_GONE_REMEMBERED = 10_000
# Per-run gauges: one writer at a time per run, so across workers the latest write is the truth.
_GAUGE_MODE: Literal["mostrecent"] = "mostrecent"
# How often each worker reads ``retired-runs`` and forgets the runs whose time is up, requests or
# not (a worker that gets none would otherwise keep their series in its files).
_SWEEP_SECONDS = 1.0

log = logging.getLogger("actuator.metrics")


@dataclass(frozen=True)
class _Family:
    """A per-run metric as prometheus_client files its samples in multiprocess mode."""

    kind: Literal["counter", "gauge"]
    name: str  # the family: actuator_decisions
    sample: str  # its sample: actuator_decisions_total
    doc: str
    labels: tuple[str, ...]  # "run" first


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
        # run -> when its series go (this worker's retirements and, in multiprocess mode, every worker's)
        self._retiring: dict[str, float] = {}
        self._retire_lock = threading.Lock()
        self._gone: dict[str, None] = {}  # runs whose series were removed, oldest first (bounded)
        self._families: dict[Any, _Family] = {}  # the per-run metrics
        self._run_files: _RunFiles | None = None
        r: CollectorRegistry | None = self.registry
        if self.multiprocess_dir:
            self._retired_log = _RetiredLog(os.path.join(self.multiprocess_dir, "retired-runs"))
            self._run_files = _RunFiles(self.multiprocess_dir, on_open=self._start_sweeper)
            self.registry.register(_WithoutRetired(MultiProcessCollector(None, path=self.multiprocess_dir),
                                                   self._gone_runs))
            r = None  # registering the live objects too would expose this worker twice

        def gauge(name: str, doc: str, labels: list[str]) -> Gauge:
            metric = Gauge(name, doc, labels, namespace=_NS, registry=r, multiprocess_mode=_GAUGE_MODE)
            self._families[metric] = _Family("gauge", f"{_NS}_{name}", f"{_NS}_{name}", doc, tuple(labels))
            return metric

        def run_counter(name: str, doc: str, labels: list[str]) -> Counter:
            metric = Counter(name, doc, labels, namespace=_NS, registry=r)
            self._families[metric] = _Family("counter", f"{_NS}_{name}", f"{_NS}_{name}_total", doc, tuple(labels))
            return metric

        def counter(name: str, doc: str, labels: list[str] | None = None) -> Counter:
            return Counter(name, doc, labels or [], namespace=_NS, registry=r)

        # per run
        self.knob_value = gauge("knob_value", "Knob value in effect: the agent's latest report, or a value it "
                                "acknowledged applying since.", ["run", "knob"])
        self.knob_target = gauge("knob_target", "Knob value the controller orders.", ["run", "knob"])
        self.probe_value = gauge("probe_value", "Latest raw probe value.", ["run", "probe"])
        self.probe_filtered = gauge("probe_filtered_value", "Filtered probe value a controller acts on.",
                                    ["run", "controller", "probe"])
        self.setpoint = gauge("setpoint", "Controller setpoint (probe units).", ["run", "controller", "probe"])
        self.threshold = gauge("guardrail_threshold", "Guardrail threshold in force (probe units).",
                               ["run", "guardrail", "probe"])
        self.pid_component = gauge("controller_component", "Last PID components, p/i/d (knob scale units).",
                                   ["run", "controller", "component"])
        self.decisions = run_counter("decisions", "Decisions taken, by knob and what took them.",
                                     ["run", "knob", "reason"])
        self.breaches = run_counter("guardrail_breaches", "Guardrail breaches (firings), by action.",
                                    ["run", "action"])
        self.run_state = gauge("run_state", "1 for the state the run is in, 0 for the others.", ["run", "state"])
        self.last_observation = gauge("last_observation_timestamp_seconds",
                                      "Unix time of the run's last stored observation "
                                      "(stale agents: time() - this).", ["run"])
        self.training_step = gauge("run_step", "Latest optimizer step observed.", ["run"])
        self.probe_starved = gauge("probe_starved", "Consecutive due steps the probe-time budget skipped the probe, "
                                   "in the run's latest probe report (0: it ran).", ["run", "probe"])
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
        self.notifications = counter("notifications", "Webhook notifications (ACTUATOR_WEBHOOK_URL), by outcome: "
                                     "sent, failed (after its retries), dropped (queue full).", ["outcome"])
        for outcome in ("sent", "failed", "dropped"):
            self.notifications.labels(outcome)
        self.unpublished = counter("live_unpublished_events", "Live events not published: Redis down or slow "
                                   "(their runs' streams get a gap).")
        self.streams_refused = counter("streams_refused", "Live streams refused (429), by the cap reached.", ["cap"])
        for cap in ("run", "client"):
            self.streams_refused.labels(cap)
        self.streams_dropped = counter("streams_dropped", "Live streams ended because their client fell behind.")

    def render(self) -> tuple[bytes, str]:
        """The exposition body and its content type, for ``GET /metrics``."""
        self._remove_retired()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    # -- writing a run's series ----------------------------------------------------------------
    def _set(self, metric: Gauge, value: float, *labels: str) -> None:
        """Set a per-run gauge: in this process's registry, or filed for the workers' merge."""
        if self._run_files is None:
            metric.labels(*labels).set(value)
        else:
            self._run_files.put(self._families[metric], labels, value)

    def _add(self, metric: Counter, amount: float, *labels: str) -> None:
        """Add to a per-run counter; 0 creates it at zero."""
        if self._run_files is not None:
            self._run_files.add(self._families[metric], labels, amount)
            return
        child = metric.labels(*labels)
        if amount:
            child.inc(amount)

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
        """Remove the series of runs whose time is up: from this process's registry, or in
        multiprocess mode (where any worker may have retired the run) from this worker's files."""
        now = time.time()
        with self._retire_lock:
            if self.multiprocess_dir:
                for run, when in self._retired_log.read_new():
                    if run not in self._gone:
                        self._retiring[run] = min(when, self._retiring.get(run, when))
            due = [run for run, when in self._retiring.items() if when <= now]
            for run in due:
                del self._retiring[run]
                self._gone[run] = None  # a late observation of the run does not bring them back
            while len(self._gone) > _GONE_REMEMBERED:
                del self._gone[next(iter(self._gone))]
        if self._run_files is not None:
            self._run_files.forget(due)
            return
        for run in due:
            for metric in self._families:
                metric.remove_by_labels({"run": run})

    def _gone_runs(self) -> set[str]:
        with self._retire_lock:
            return set(self._gone)

    def _start_sweeper(self) -> None:
        """Called when this process first files per-run series: from then on it forgets retired
        runs on time, requests or not."""
        threading.Thread(target=self._sweep, name="actuator-metrics-sweep", daemon=True).start()

    def _sweep(self) -> None:
        while True:
            time.sleep(_SWEEP_SECONDS)
            try:
                self._remove_retired()
            except Exception:  # noqa: BLE001 - metrics never take a worker down; the next sweep retries
                log.exception("retiring runs' Prometheus series failed")

    # -- what the service reports -------------------------------------------------------------
    def _init_run(self, run: str, knobs: Any = ()) -> None:
        """Create the run's counters at zero (idempotent)."""
        for action in GUARDRAIL_ACTIONS:
            self._add(self.breaches, 0, run, action)
        for knob in knobs:
            for reason in DECISION_REASONS:
                self._add(self.decisions, 0, run, knob, reason)

    def observe_registration(self, run: str, state: RunStateName, knobs: dict[str, float]) -> None:
        """A run registered: its state (its counters start at 0) and the knob values it starts from."""
        self.set_state(run, state)
        if not self._exported(run):
            return
        for knob, value in knobs.items():
            self._set(self.knob_target, value, run, knob)

    def observe_ingest(self, out: Any) -> None:
        """Export what one ingest (a store ``IngestOutcome``: its run snapshot, with the run's
        typed context) changed."""
        run = out.run
        ctx: RunContext = run.context
        self.observations.inc(out.accepted)
        self.duplicates.inc(out.duplicates)
        if not self._exported(run.id):
            return
        self._init_run(run.id, ctx.knobs)
        if out.accepted:
            self._set(self.last_observation, time.time(), run.id)
            self._set(self.training_step, run.last_step or 0, run.id)
        for probe, v in run.latest_probes.items():
            self._set(self.probe_value, v, run.id, probe)
        reports = [o.metrics for o in getattr(out, "new_observations", ()) if PROBE_REPORT in o.metrics]
        if reports:  # every probe ever starved in the run: its skips in the latest report, 0 once it ran
            for key in run.latest_metrics:
                if key.startswith(STARVED_PREFIX):
                    self._set(self.probe_starved, float(reports[-1].get(key, 0.0)), run.id,
                              key.removeprefix(STARVED_PREFIX))
        for knob, v in (getattr(out, "knobs_in_effect", None) or {}).items():  # the store's value in effect (acknowledged too)
            self._set(self.knob_value, v, run.id, knob)
        for knob, spec in ctx.knobs.items():
            self._set(self.knob_target, spec.value, run.id, knob)
        for name, st in ctx.controllers.items():
            if st.filtered is not None and st.probe is not None:
                self._set(self.probe_filtered, st.filtered, run.id, name, st.probe)
                if st.setpoint is not None:  # a maximize controller has none
                    self._set(self.setpoint, st.setpoint, run.id, name, st.probe)
            for comp in ("p", "i", "d"):
                value = (st.components or {}).get(comp)
                if value is not None:
                    self._set(self.pid_component, value, run.id, name, comp)
        for name, gs in ctx.guardrails.items():
            if gs.threshold is not None and gs.probe is not None:
                self._set(self.threshold, gs.threshold, run.id, name, gs.probe)
        # One increment per label set, not per decision (a batch of 100 can make 99 of them).
        decided = collections.Counter((d.knob, "controller" if d.controller else "guardrail") for d in out.created)
        for (knob, reason), n in decided.items():
            self._add(self.decisions, n, run.id, knob, reason)
        fired = collections.Counter(ev.action for ev in out.events if isinstance(ev, GuardrailBreach))
        for action, n in fired.items():
            self._add(self.breaches, n, run.id, action)
        self.set_state(run.id, ctx.state)

    def observe_control(self, run: str, ctx: RunContext, decisions: Any = ()) -> None:
        """Export an operator action (pause/resume, manual override, setpoint, policy change) on
        run ``run``, whose context is ``ctx`` after it: the run's state, knob targets and
        setpoints, and the decisions it made (reason ``operator``)."""
        if not self._exported(run):
            return
        self._init_run(run, ctx.knobs)
        for knob, spec in ctx.knobs.items():
            self._set(self.knob_target, spec.value, run, knob)
        for name, st in ctx.controllers.items():
            if st.setpoint is not None and st.probe:
                self._set(self.setpoint, st.setpoint, run, name, st.probe)
        for knob, n in collections.Counter(d.knob for d in decisions).items():
            self._add(self.decisions, n, run, knob, "operator")
        self.set_state(run, ctx.state)

    def set_state(self, run: str, state: RunStateName) -> None:
        """The run's state (called at registration too, which is when its counters start at 0).
        A final state starts the countdown to the removal of the run's series."""
        if not self._exported(run):
            return
        self._init_run(run)
        for s in RUN_STATES:
            self._set(self.run_state, 1.0 if s == state else 0.0, run, s)
        if state in FINAL_STATES:
            self._retire(run)


class _RunFiles:
    """This worker's per-run series in multiprocess mode: two files in prometheus_client's format
    and naming, which its ``MultiProcessCollector`` merges with every worker's metrics, but
    written by this class alone, under its own lock, so that it can forget a run: ``forget``
    writes a file anew without the run's samples and renames it into place (a reader opens the
    old file or the new one, each whole; prometheus_client's own files are never rewritten)."""

    _PREFIXES: dict[str, str] = {"counter": "counter", "gauge": f"gauge_{_GAUGE_MODE}"}

    def __init__(self, directory: str, on_open: Callable[[], None]) -> None:
        self.directory = directory
        self._on_open = on_open
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._files: dict[str, MmapedDict] = {}
        self._paths: dict[str, str] = {}
        # run -> (sample, label values) -> (kind, key in the file): the key cache, and what to drop
        self._keys: dict[str, dict[tuple[str, tuple[str, ...]], tuple[str, str]]] = {}

    def put(self, family: _Family, labels: tuple[str, ...], value: float) -> None:
        with self._lock:
            file, key = self._slot(family, labels)
            file.write_value(key, value, time.time())  # the timestamp picks the most recent across workers

    def add(self, family: _Family, labels: tuple[str, ...], amount: float) -> None:
        with self._lock:
            file, key = self._slot(family, labels)
            file.write_value(key, file.read_value(key)[0] + amount, 0.0)  # summed across workers

    def forget(self, runs: Iterable[str]) -> None:
        """Rewrite this worker's files without the samples of ``runs``."""
        with self._lock:
            if self._pid != os.getpid():
                return  # nothing filed by this process yet
            dropped: dict[str, set[str]] = {}
            for run in runs:
                for kind, key in self._keys.pop(run, {}).values():
                    dropped.setdefault(kind, set()).add(key)
            for kind, keys in dropped.items():
                self._rewrite(kind, keys)

    def _slot(self, family: _Family, labels: tuple[str, ...]) -> tuple[MmapedDict, str]:
        if self._pid != os.getpid():
            self._open()
        keys = self._keys.setdefault(labels[0], {})
        slot = keys.get((family.sample, labels))
        if slot is None:
            key = mmap_key(family.name, family.sample, list(family.labels), list(labels), family.doc)
            slot = keys[(family.sample, labels)] = (family.kind, key)
        return self._files[slot[0]], slot[1]

    def _open(self) -> None:
        """This process's files (new ones after a fork: a child never writes its parent's)."""
        self._pid = os.getpid()
        self._files, self._keys = {}, {}
        for kind, prefix in self._PREFIXES.items():
            path = self._paths[kind] = os.path.join(self.directory, f"{prefix}_runs-{self._pid}.db")
            self._files[kind] = MmapedDict(path)
            for key, _, _ in self._files[kind].read_all_values():  # left by an earlier process with this pid
                _, sample, labels, _ = json.loads(key)
                self._keys.setdefault(labels.get("run", ""), {})[(sample, tuple(sorted(labels.items())))] = (kind, key)
        self._on_open()

    def _rewrite(self, kind: str, dropped: set[str]) -> None:
        old, path = self._files[kind], self._paths[kind]
        fd, tmp = tempfile.mkstemp(prefix=".runs-", suffix=".tmp", dir=self.directory)  # not *.db: never read
        os.close(fd)
        try:
            new = MmapedDict(tmp)
            try:
                for key, value, timestamp in old.read_all_values():
                    if key not in dropped:
                        new.write_value(key, value, timestamp)
            finally:
                new.close()
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        old.close()
        self._files[kind] = MmapedDict(path)


class _RetiredLog:
    """Runs retired by any worker: one ``<run> <unix time>`` line each, appended (a single small
    write with O_APPEND: lines from several workers never interleave). Read incrementally."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0

    def add(self, run: str, when: float) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{run} {when:.3f}\n".encode())
        finally:
            os.close(fd)

    def read_new(self) -> list[tuple[str, float]]:
        """The runs appended since the last call, each with when its series go (not thread-safe:
        the caller serialises)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1  # a line still being written is read next time
        self._offset += end
        retired = []
        for line in chunk[:end].decode(errors="replace").splitlines():
            run, _, when = line.partition(" ")
            try:
                retired.append((run, float(when)))
            except ValueError:
                continue
        return retired


class _WithoutRetired:
    """The multiprocess collector without the samples of retired runs (until every worker has
    rewritten its files without them)."""

    def __init__(self, inner: MultiProcessCollector, gone: Callable[[], set[str]]) -> None:
        self.inner, self.gone = inner, gone

    def collect(self) -> Iterator[Any]:
        gone = self.gone()
        for family in self.inner.collect():
            if gone:
                family.samples = [s for s in family.samples if s.labels.get("run") not in gone]
            yield family
