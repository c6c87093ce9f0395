"""Every Prometheus metric of the service, in one place (``actuator_`` namespace).

Labels are bounded: run ids, knob and probe names (validated identifiers), controller and
guardrail names from policies, route templates (never raw paths), and small enums. Never a
step, a value or free text. The registry is injected so tests get a fresh one.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_NS = "actuator"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        # per run
        self.knob_value = Gauge("knob_value", "Knob value in effect, as reported by the agent.",
                                ["run", "knob"], namespace=_NS, registry=r)
        self.knob_target = Gauge("knob_target", "Knob value the controller orders.",
                                 ["run", "knob"], namespace=_NS, registry=r)
        self.probe_value = Gauge("probe_value", "Latest raw probe value.", ["run", "probe"], namespace=_NS, registry=r)
        self.probe_filtered = Gauge("probe_filtered_value", "Filtered probe value a controller acts on.",
                                    ["run", "probe"], namespace=_NS, registry=r)
        self.setpoint = Gauge("setpoint", "Controller setpoint.", ["run", "probe"], namespace=_NS, registry=r)
        self.threshold = Gauge("guardrail_threshold", "Guardrail threshold in force.",
                               ["run", "probe"], namespace=_NS, registry=r)
        self.pid_component = Gauge("controller_component", "PID components (scale units).",
                                   ["run", "controller", "component"], namespace=_NS, registry=r)
        self.decisions = Counter("decisions", "Decisions taken.", ["run", "knob", "reason"], namespace=_NS, registry=r)
        self.breaches = Counter("guardrail_breaches", "Guardrail breaches.", ["run", "action"], namespace=_NS, registry=r)
        self.run_state = Gauge("run_state", "1 for the state the run is in.", ["run", "state"], namespace=_NS, registry=r)
        self.last_observation = Gauge("last_observation_timestamp_seconds",
                                      "Unix time of the run's last observation (stale agents: time() - this).",
                                      ["run"], namespace=_NS, registry=r)
        self.training_step = Gauge("run_step", "Latest optimizer step observed.", ["run"], namespace=_NS, registry=r)
        # service
        self.observations = Counter("observations_ingested", "Observations stored.", namespace=_NS, registry=r)
        self.duplicates = Counter("observations_duplicate", "Observations ignored as already stored.",
                                  namespace=_NS, registry=r)
        self.requests = Histogram("request_duration_seconds", "Request latency by route.",
                                  ["route", "method", "status"], namespace=_NS, registry=r,
                                  buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.rejected = Counter("requests_rejected", "Requests refused, by reason.", ["reason"], namespace=_NS, registry=r)
        self.backend_errors = Counter("backend_errors", "Store and Redis errors.", ["backend"], namespace=_NS, registry=r)

    def set_state(self, run: str, state: str) -> None:
        for s in ("running", "paused", "halted", "finished"):
            self.run_state.labels(run, s).set(1.0 if s == state else 0.0)
