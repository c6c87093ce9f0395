"""The store's ingest path (Core statements, not the ORM) against SQLite and Postgres: what it
answers is what it stored, it writes only what changed, it refuses without storing, and it
survives a database restart without a pre-ping."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from actuator.testing import start_postgres

import actuator.store as store_module
from actuator._exceptions import PolicyError
from actuator.migrate import upgrade
from actuator.models import DecisionRow, EventRow, ObservationRow
from actuator.policy import load_policy
from actuator.schemas import (
    MAX_INT,
    MAX_SEQ,
    KnobSpec,
    ObservationBatch,
    ObservationCreate,
    RunCreate,
)
from actuator.store import ObservationRefused, RunTokenRefused, Store, hash_token

POLICY = {
    "name": "hot-path",
    "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate", "setpoint": 0.1,
                     "kp": 1.0, "ki": 0.2}],
    "guardrails": [{"name": "cap", "probe": "kl_drift", "bound": "upper", "threshold": 0.8, "action": "alert",
                    "consecutive": 2}],
}
KNOB = {"name": "learning_rate", "value": 1e-3, "min": 1e-6, "max": 1e-2, "scale": "log", "max_step": 0.5}


def obs(seq: int, step: int, drift: float = 0.3, **extra) -> ObservationCreate:
    return ObservationCreate(seq=seq, step=step, probes={"kl_drift": drift}, metrics={"loss": 2.0 - seq / 100},
                             knobs={"learning_rate": 1e-3}, **extra)


def batch(*observations: ObservationCreate, last_decision: int = 0) -> ObservationBatch:
    return ObservationBatch(observations=list(observations), last_decision=last_decision)


@pytest.fixture
def store(database_url):
    upgrade(database_url)
    s = Store(database_url)
    yield s
    s.close()


@pytest.fixture
def run(store):
    policy = store.create_policy(load_policy(POLICY))
    row, token = store.create_run(RunCreate(policy=POLICY["name"], knobs=[KnobSpec(**KNOB)]), policy)
    return row.id, token


def counts(store: Store) -> tuple[int, ...]:
    return tuple(store.count(t) for t in (ObservationRow, DecisionRow, EventRow))


def test_the_answer_is_what_is_stored(store, run):
    run_id, token = run
    out = store.ingest(run_id, batch(*(obs(s, s + 1, 0.1 + 0.05 * s) for s in range(5))),
                       token_hash=hash_token(token))
    assert out.accepted == 5 and out.duplicates == 0 and out.created and out.decisions == out.created
    stored, total = store.list_decisions(run_id)
    assert total == len(out.created)
    fields = ("id", "run_id", "number", "step", "knob", "old_value", "new_value", "reason", "controller",
              "policy_version", "components", "inputs", "created_at")
    assert [{f: getattr(d, f) for f in fields} for d in out.created] == \
           [{f: getattr(d, f) for f in fields} for d in stored]
    row = store.get_run(run_id)
    for f in ("state", "latest_probes", "latest_metrics", "knobs_in_effect", "last_step", "last_seq", "decision_count"):
        assert getattr(row, f) == getattr(out.run, f), f
    assert out.run.context.to_json() == {f: getattr(row, f) for f in ("knobs", "controllers", "guardrails")}
    assert out.run.context == Store.context(row)  # the typed context the answer and the metrics read
    assert row.decision_count == out.created[-1].number and row.last_seq == 4 and row.last_step == 5
    assert [(o.seq, o.step, o.probes, o.metrics, o.knobs) for o in store.list_observations(run_id)] == \
           [(s, s + 1, {"kl_drift": 0.1 + 0.05 * s}, {"loss": 2.0 - s / 100}, {"learning_rate": 1e-3})
            for s in range(5)]


def test_unacknowledged_decisions_come_back_in_order_and_duplicates_write_nothing(store, run):
    run_id, _ = run
    first = store.ingest(run_id, batch(obs(0, 1, 0.1), obs(1, 2, 0.4), obs(2, 3, 0.5)))
    assert len(first.created) >= 2
    # the agent applied the first decision only, then sends a new observation
    second = store.ingest(run_id, batch(obs(3, 4, 0.6), last_decision=1))
    assert [d.number for d in second.decisions] == list(range(2, second.run.decision_count + 1))
    assert second.decisions[:len(first.created) - 1] and \
           [d.id for d in second.decisions[:len(first.created) - 1]] == [d.id for d in first.created[1:]]
    before, row = counts(store), store.get_run(run_id)
    again = store.ingest(run_id, batch(obs(1, 2, 0.4), obs(3, 4, 0.6), last_decision=1))
    assert (again.accepted, again.duplicates, again.created) == (0, 2, [])
    assert [d.number for d in again.decisions] == [d.number for d in second.decisions]
    assert counts(store) == before and store.get_run(run_id).updated_at == row.updated_at


def test_only_changed_columns_are_written(store, run, monkeypatch):
    run_id, _ = run
    store.ingest(run_id, batch(obs(0, 1, 0.1)))
    writes = []
    real = store._write
    monkeypatch.setattr(store, "_write", lambda *a: writes.append(dict(a[-1])) or real(*a))
    # a late observation: stored, evaluated by nothing, so only the counters move
    store.ingest(run_id, batch(obs(5, 10, 0.1)))
    out = store.ingest(run_id, batch(obs(3, 4, 5.0)))
    assert out.accepted == 1 and not out.created and not out.events
    assert set(writes[-1]) == {"updated_at"}, writes[-1]  # seq 3 < last_seq 5: nothing else changed
    assert store.get_run(run_id).latest_probes == {"kl_drift": 0.1}


REFUSED = {
    "unknown knob": (lambda: batch(obs(1, 11), ObservationCreate(seq=2, step=12, knobs={"kl_beta": 0.1})),
                     ObservationRefused),
    "step goes back": (lambda: batch(obs(1, 9)), ObservationRefused),
    "too many names": (lambda: batch(ObservationCreate(seq=1, step=11, probes={"a": 1.0, "b": 2.0, "c": 3.0})),
                       ObservationRefused),
    "another run's token": (lambda: batch(obs(1, 11)), RunTokenRefused),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_batches_store_nothing(store, run, case, monkeypatch):
    run_id, token = run
    store.ingest(run_id, batch(obs(0, 10)))
    before, row = counts(store), store.get_run(run_id)
    monkeypatch.setattr(store_module, "MAX_NAMES", 2)  # the run has 1 probe and 1 metric name so far
    make, error = REFUSED[case]
    with pytest.raises(error):
        store.ingest(run_id, make(), token_hash=hash_token(token + ("x" if error is RunTokenRefused else "")))
    assert counts(store) == before
    after = store.get_run(run_id)
    assert (after.updated_at, after.controllers, after.last_seq) == (row.updated_at, row.controllers, row.last_seq)


def test_unknown_run(store):
    assert store.ingest("no-such-run", batch(obs(0, 1))) is None
    assert store.run_token_hash("no-such-run") is None


def test_a_restarted_postgres_costs_no_request(monkeypatch):
    """No pre-ping: connections the restarted server closed are dropped at checkout for free, and
    one that fails its first statement is retried once on a fresh connection."""
    pg = start_postgres()
    try:
        url = pg.create_database("restart")
        upgrade(url)
        store = Store(url)
        try:
            policy = store.create_policy(load_policy(POLICY))
            row, _ = store.create_run(RunCreate(policy=POLICY["name"], knobs=[KnobSpec(**KNOB)]), policy)
            assert store.ingest(row.id, batch(obs(0, 1))).accepted == 1
            pg.stop()
            pg.start()
            assert store.ingest(row.id, batch(obs(1, 2))).accepted == 1  # the checkout drops the dead one
            pg.stop()
            pg.start()
            monkeypatch.setattr(store_module, "_closed_by_server", lambda conn: False)  # as if it died silently
            assert store.get_run(row.id).last_seq == 1  # a read: retried
            pg.stop()
            pg.start()
            assert store.ingest(row.id, batch(obs(2, 3))).accepted == 1  # the lock's statement: retried
            assert [o.seq for o in store.list_observations(row.id)] == [0, 1, 2]
        finally:
            store.close()
    finally:
        pg.remove()


def test_the_store_range_is_validated_before_the_store():
    """What the store's columns (32-bit, 64-bit for seq) cannot hold is refused by the wire models
    and the policy parser (the client gets the same errors as the service)."""
    with pytest.raises(ValidationError, match="seq"):
        ObservationCreate(seq=MAX_SEQ + 1, step=1)
    with pytest.raises(ValidationError, match="step"):
        ObservationCreate(seq=1, step=MAX_INT + 1)
    with pytest.raises(ValidationError, match="last_decision"):
        ObservationBatch(observations=[obs(0, 1)], last_decision=MAX_INT + 1)
    assert ObservationCreate(seq=MAX_SEQ, step=MAX_INT).seq == MAX_SEQ
    huge = {**POLICY["controllers"][0], "cooldown": 10**40, "setpoint": [[0, 0.1], [10**400, 0.2]]}
    with pytest.raises(PolicyError) as err:
        load_policy({"name": "p", "controllers": [huge], "probes": [{"name": "kl_drift", "every": MAX_INT + 1}]})
    assert {e["loc"] for e in err.value.errors} == {"controllers.0.cooldown", "controllers.0.setpoint.1.0",
                                                     "probes.0.every"}
    assert all("integer out of range" in e["msg"] for e in err.value.errors)
    with pytest.raises(PolicyError, match="guardrails.0.threshold: the percentage must be a finite number"):
        load_policy({"name": "p", "guardrails": [{"name": "g", "probe": "kl_drift", "bound": "upper",
                                                  "threshold": "+" + "9" * 400 + "%"}]})


def test_acknowledgements_are_recorded_once_and_bad_ones_refuse_the_batch(store, run):
    from actuator.schemas import DecisionAck

    run_id, _ = run
    made = store.ingest(run_id, batch(obs(0, 1), obs(1, 2, drift=0.5), obs(2, 3, drift=0.7))).created
    assert len(made) >= 2
    # at or after the step each decision was ordered for (3 and 4): the agent applies it at a later
    # step boundary
    applied = DecisionAck(number=1, status="applied", step=3, value=4.5e-4)
    skipped = DecisionAck(number=2, status="skipped", step=4, reason="identification holds learning_rate")
    store.ingest(run_id, ObservationBatch(observations=[obs(3, 4)], last_decision=2, applied=[applied, skipped]))
    rows = {d.number: d for d in store.list_decisions(run_id)[0]}
    assert (rows[1].applied_step, rows[1].applied_value, rows[1].skipped) == (3, 4.5e-4, None)
    assert (rows[2].applied_step, rows[2].applied_value) == (None, None)
    assert rows[2].skipped == "step 4: identification holds learning_rate"

    # A repeat (a retried request) changes nothing recorded, even with other figures.
    again = DecisionAck(number=1, status="applied", step=9, value=1e-3)
    store.ingest(run_id, ObservationBatch(observations=[obs(3, 4)], last_decision=2, applied=[again]))
    assert store.list_decisions(run_id)[0][0].applied_step == 3

    # A decision that does not exist (yet) refuses the whole batch: neither its observation nor
    # the valid acknowledgement beside it is stored.
    decided = store.get_run(run_id).decision_count
    before = counts(store)
    ok = DecisionAck(number=decided, status="applied", step=5, value=5e-4)
    bad = DecisionAck(number=decided + 1, status="applied", step=5, value=5e-4)
    with pytest.raises(ObservationRefused) as exc:
        store.ingest(run_id, ObservationBatch(observations=[obs(4, 5)], last_decision=decided, applied=[ok, bad]))
    assert exc.value.loc == "applied.1.number" and exc.value.status == 422
    assert counts(store) == before
    last = {d.number: d for d in store.list_decisions(run_id)[0]}[decided]
    assert last.applied_step is None


def test_an_acknowledgement_must_be_consistent():
    from actuator.schemas import DecisionAck

    with pytest.raises(ValidationError, match="value"):
        DecisionAck(number=1, status="applied", step=3)
    with pytest.raises(ValidationError, match="value"):
        DecisionAck(number=1, status="skipped", step=3, value=1.0)
    with pytest.raises(ValidationError, match="number"):
        DecisionAck(number=0, status="applied", step=3, value=1.0)
