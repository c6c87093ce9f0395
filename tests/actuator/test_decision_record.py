"""One decision record (engine -> store -> API -> report) and a typed run state (issue 17)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from actuator.api.views import decision_public
from actuator.models import DecisionRow
from actuator.policy import PolicyDocument
from actuator.report import build_report
from actuator.run_state import ControllerState, RunContext
from actuator.schemas import Decision, DecisionPublic, KnobSpec, ObservationBatch, RunCreate
from actuator.store import Store

POLICY = {"name": "rec", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                          "setpoint": 0.1, "kp": 1.0, "ki": 0.2}],
          "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.3, "action": "adjust",
                          "knob": "learning_rate"}]}
LR = {"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}


def test_the_table_holds_exactly_the_record():
    assert set(DecisionPublic.model_fields) == {c.name for c in DecisionRow.__table__.columns}
    # what the store assigns, and what the agent acknowledges (migration 0003)
    assert set(DecisionPublic.model_fields) - set(Decision.model_fields) == {
        "id", "run_id", "policy_version", "created_at", "applied_step", "applied_value", "skipped"}


@pytest.mark.parametrize("field, value", [("new_value", math.inf), ("old_value", math.nan),
                                          ("components", {"p": math.inf}),
                                          ("inputs", {"unclamped": math.inf}), ("inputs", {"bounds": [0.0, math.nan]})])
def test_a_non_finite_decision_cannot_be_made(field, value):
    fields = {"number": 1, "step": 1, "knob": "learning_rate", "old_value": 1.0, "new_value": 2.0, "reason": "r",
              "controller": None, "components": {}, "inputs": {}}
    with pytest.raises(ValidationError):
        Decision(**{**fields, field: value})


def test_stored_json_round_trips_through_the_typed_state():
    stored = {
        "knobs": {"learning_rate": {**LR, "override": 2e-3}, "rank": {"name": "rank", "value": 8, "min": 1, "max": 64,
                                                                      "scale": "integer", "max_step": None}},
        "controllers": {"drift": {"pid": {"integral": -6.9, "last_measurement": 0.2, "last_output": 1e-3,
                                          "since_change": None, "updates": 3},
                                  "filter": {"count": 3}, "last_step": 30, "probe": "kl_drift", "knob": "learning_rate",
                                  "raw": 0.2, "filtered": 0.2, "baseline": 0.05, "setpoint": 0.1,
                                  "components": {"p": 0.1, "i": -6.9, "d": 0.0, "error": -0.1},
                                  "setpoint_override": [[0, 0.1], [100, 0.2]], "reset": True},
                        "fresh": {"pid": None, "filter": None, "last_step": None}},
        "guardrails": {"cap": {"baseline": 0.05, "breaches": 1, "active": True, "probe": "kl_drift",
                               "threshold": 0.3, "value": 0.31}},
    }
    ctx = RunContext.from_json(stored["knobs"], stored["controllers"], stored["guardrails"])
    assert ctx.to_json() == stored
    st = ctx.controllers["drift"]
    assert isinstance(st, ControllerState) and st.reset and st.baseline == 0.05 and st.pid is not None
    assert ctx.knobs["learning_rate"].override == 2e-3 and ctx.guardrails["cap"].active


def test_engine_store_api_and_report_share_the_record(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        from actuator.migrate import upgrade

        upgrade(store.url)
        policy = store.create_policy(PolicyDocument.model_validate(POLICY))
        run, _ = store.create_run(RunCreate(policy="rec", knobs=[KnobSpec(**LR)]), policy)
        batch = ObservationBatch(observations=[{"seq": i, "step": 10 * i, "probes": {"kl_drift": v}}
                                               for i, v in enumerate([0.1, 0.2, 0.35, 0.36])])
        out = store.ingest(run.id, batch)
        assert out is not None and out.created and out.decisions == out.created
        assert all(type(d) is DecisionPublic for d in out.created)
        rows, total = store.list_decisions(run.id)
        assert total == len(out.created)
        for row, made in zip(rows, out.created):
            assert decision_public(row).model_dump() == made.model_dump(mode="python") | {
                "created_at": decision_public(row).created_at}
            assert decision_public(made) is made
        report = build_report(store.get_run(run.id), store.list_observations(run.id), rows,
                              store.list_events(run.id), PolicyDocument.model_validate(POLICY))
        assert report["decisions"][0] == {k: getattr(rows[0], k) for k in report["decisions"][0]}
        assert set(report["decisions"][0]) <= set(DecisionPublic.model_fields)
        assert report["decisions"][0]["applied_step"] is None  # no agent has acknowledged it
        assert report["thresholds"] == {"kl_drift": 0.3} and report["setpoints"] == {"kl_drift": 0.1}
    finally:
        store.close()
