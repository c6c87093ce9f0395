"""Metrics of one ingest: decisions and breaches counted per label set, one increment each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from actuator.metrics import Metrics
from actuator.run_state import RunContext
from actuator.schemas import GuardrailBreach, GuardrailCleared


def _breach(action: str) -> GuardrailBreach:
    return GuardrailBreach(step=3, guardrail="cap", action=action, value=1.0, threshold=0.5, reason="r")


def _outcome() -> Any:
    ctx = RunContext.from_json({"lr": {"value": 1e-4, "min": 1e-6, "max": 1e-3}, "beta": {"value": 0.1, "min": 0, "max": 1}})
    run = SimpleNamespace(id="r1", last_step=10, latest_probes={}, knobs_in_effect={}, context=ctx)
    created = ([SimpleNamespace(knob="lr", controller="drift")] * 5 + [SimpleNamespace(knob="lr", controller=None)] * 2
               + [SimpleNamespace(knob="beta", controller="kl")] * 3)
    events = ([_breach("adjust")] * 2 + [GuardrailCleared(step=4, guardrail="cap", value=0.1, threshold=0.5)]
              + [_breach("alert")])
    return SimpleNamespace(run=run, accepted=10, duplicates=0, created=created, events=events)


def test_a_batch_counts_every_decision_and_breach_with_one_increment_per_label_set() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    incs: list[tuple[str, float]] = []
    for counter in (m.decisions, m.breaches):
        real = counter.labels

        def labels(*values: str, _real: Any = real) -> Any:
            child = _real(*values)
            inc = child.inc

            class Spy:
                def inc(self, amount: float = 1) -> None:
                    incs.append(("/".join(values), amount))
                    inc(amount)
            return Spy()
        counter.labels = labels  # type: ignore[method-assign]
    m.observe_ingest(_outcome())
    assert sorted(incs) == [("r1/adjust", 2), ("r1/alert", 1), ("r1/beta/controller", 3),
                            ("r1/lr/controller", 5), ("r1/lr/guardrail", 2)]
    v = reg.get_sample_value
    assert v("actuator_decisions_total", {"run": "r1", "knob": "lr", "reason": "controller"}) == 5
    assert v("actuator_decisions_total", {"run": "r1", "knob": "lr", "reason": "guardrail"}) == 2
    assert v("actuator_decisions_total", {"run": "r1", "knob": "beta", "reason": "controller"}) == 3
    assert v("actuator_decisions_total", {"run": "r1", "knob": "beta", "reason": "guardrail"}) == 0
    assert v("actuator_guardrail_breaches_total", {"run": "r1", "action": "adjust"}) == 2
    assert v("actuator_guardrail_breaches_total", {"run": "r1", "action": "alert"}) == 1
    assert v("actuator_guardrail_breaches_total", {"run": "r1", "action": "halt"}) == 0


def test_operator_decisions_are_counted_per_knob() -> None:
    reg = CollectorRegistry()
    ctx = RunContext.from_json({"lr": {"value": 1e-4, "min": 1e-6, "max": 1e-3}})
    Metrics(reg).observe_control("r1", ctx, [SimpleNamespace(knob="lr")] * 2)
    assert reg.get_sample_value("actuator_decisions_total", {"run": "r1", "knob": "lr", "reason": "operator"}) == 2
