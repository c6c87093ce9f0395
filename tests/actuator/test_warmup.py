"""gains auto's warm-up as the engine's collaborator (actuator/warmup.py), against a real store on
SQLite and Postgres: the fit at the step test's end runs outside the run's lock, and the run gets
the same decisions at the same steps as a fit made in place; the warm-up's state is typed, and a
row the code before the types wrote loads and goes on; an engine without a tuner falls back and
says so; the fit's answer is typed and the warm-up asks it for no replay of the current gains."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest
from sqlalchemy import text

from actuator.engine import Engine
from actuator.migrate import upgrade
from actuator.policy import load_policy
from actuator.run_state import AutoFallback, AutoPending, AutoRecording, AutoTuned, ControllerState, StepWindow
from actuator.schemas import ObservationBatch, ObservationCreate, RunCreate
from actuator.store import Store
from actuator.tune import Tuned, fit_warmup, tune_controller
from actuator.warmup import FitsOutsideLock

SETPOINT = 1.7  # beyond where the step test takes the plant (1.0 -> ~1.45): the test runs to its end
POLICY = {"name": "warmup", "controllers": [{"name": "hold", "probe": "custom.y", "knob": "learning_rate",
                                             "setpoint": SETPOINT, "gains": "auto", "kp": 0.4, "ki": 0.05}]}
KNOBS = [{"name": "learning_rate", "value": 1e-3, "min": 1e-5, "max": 1e-1, "scale": "log", "max_step": 0.5}]
WINDOW = {"controller": "hold", "knob": "learning_rate", "start": 0, "end": 14, "size": 0.6}


def readings(first: int, last: int) -> list[ObservationCreate]:
    """y = 1 + 0.75 * (lag 3 steps of the knob's ln move) under the step test of WINDOW (knob up
    0.6 from step 3 to 13), then held: the observations of steps ``first`` to ``last``."""
    out, x = [], 0.0
    for k in range(last + 1):
        u = 0.6 if 4 <= k < 14 else 0.0  # the move the steps up to k ran at
        x = u + (x - u) * math.exp(-1 / 3)
        if k >= first:
            out.append(ObservationCreate(seq=k, step=k, probes={"custom.y": 1.0 + 0.75 * x},
                                         knobs={"learning_rate": 1e-3 * math.exp(0.6 if 3 <= k < 13 else 0.0)}))
    return out


@pytest.fixture
def store(database_url: str):
    upgrade(database_url)
    s = Store(database_url)
    yield s
    s.close()


def new_run(store: Store, name: str) -> tuple[str, Any]:
    policy = store.create_policy(load_policy({**POLICY, "name": name}))
    run, _ = store.create_run(RunCreate(policy=name, knobs=KNOBS, identification=[WINDOW]), policy)
    return run.id, policy


def outcome(store: Store, run_id: str) -> tuple[list[tuple[int, str, float, str]], list[tuple[str, int | None, Any]]]:
    decisions = [(d.step, d.knob, d.new_value, d.reason) for d in store.list_decisions(run_id, limit=1000)[0]]
    events = [(e.kind, e.step, e.payload) for e in store.list_events(run_id) if e.kind.startswith("auto_gains")]
    return decisions, events


def ingest_one_by_one(store: Store, run_id: str, observations: list[ObservationCreate],
                      engine: Engine | None = None) -> None:
    for o in observations:
        store.ingest(run_id, ObservationBatch(observations=[o]), engine)


def test_the_fit_runs_outside_the_runs_lock_and_the_decisions_are_those_of_a_fit_in_place(store):
    observations = readings(0, 30)
    # the store's own engines: the fit outside the lock
    default, _ = new_run(store, "warmup-default")
    ingest_one_by_one(store, default, observations)
    # a tuner that checks, while it fits, whether another writer can take the run's lock
    probed, policy = new_run(store, "warmup-probed")
    held: list[bool] = []

    def probing(*args: Any) -> Tuned:
        taken = threading.Event()

        def writer() -> None:
            with store._locked_run(probed):  # the lock every writer of the run takes (a row lock on Postgres)
                taken.set()

        other = threading.Thread(target=writer, daemon=True)
        other.start()
        held.append(not taken.wait(30))  # never set while this ingest holds the lock
        answer = fit_warmup(*args)
        other.join(60)
        return answer

    engine = Engine(load_policy({**POLICY, "name": "warmup-probed"}), policy.version, tuner=FitsOutsideLock(probing))
    ingest_one_by_one(store, probed, observations, engine)
    assert held == [False], "one fit, made while the run's lock was free"
    # the old way, the fit in place under the lock: a plain tuner
    in_place, policy = new_run(store, "warmup-in-place")
    ingest_one_by_one(store, in_place, observations,
                      Engine(load_policy({**POLICY, "name": "warmup-in-place"}), policy.version, tuner=fit_warmup))

    decisions, events = outcome(store, default)
    (tuned,) = events
    assert tuned[0] == "auto_gains" and tuned[1] == 14 and decisions and decisions[0][0] == 15
    assert outcome(store, probed) == outcome(store, in_place) == (decisions, events)
    state = ControllerState.from_dict(store.get_run(default).controllers["hold"]).auto
    assert isinstance(state, AutoTuned) and state.gains.model_dump() == tuned[2]["gains"]


def test_a_batch_that_ends_the_test_decides_as_one_observation_at_a_time_does(store):
    one, _ = new_run(store, "warmup-one")
    ingest_one_by_one(store, one, readings(0, 24))
    batch, _ = new_run(store, "warmup-batch")
    store.ingest(batch, ObservationBatch(observations=readings(0, 9)))
    store.ingest(batch, ObservationBatch(observations=readings(10, 24)))  # ends the test mid-batch
    assert outcome(store, one) == outcome(store, batch) and outcome(store, one)[0]


def test_the_state_is_typed_and_a_row_written_before_the_types_goes_on(store):
    run_id, _ = new_run(store, "warmup-typed")
    assert ControllerState.from_dict(store.get_run(run_id).controllers["hold"]).auto == \
        AutoPending(window=StepWindow(0, 14, 0.6))
    ingest_one_by_one(store, run_id, readings(0, 7))
    stored = store.get_run(run_id).controllers["hold"]["auto"]
    recording = ControllerState.from_dict(store.get_run(run_id).controllers["hold"]).auto
    assert isinstance(recording, AutoRecording) and stored["status"] == "recording"
    assert [s[1] for s in recording.samples] == list(range(8)) and recording.first == pytest.approx(1.0)

    # the same run as the code before the types left it: a recording test was "pending" with samples
    old, _ = new_run(store, "warmup-old-row")
    ingest_one_by_one(store, old, readings(0, 7))
    controllers = store.get_run(old).controllers
    controllers["hold"]["auto"]["status"] = "pending"
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET controllers = :c WHERE id = :id"),
                     {"c": json.dumps(controllers), "id": old})
    assert store.get_run(old).controllers["hold"]["auto"]["status"] == "pending"
    assert isinstance(ControllerState.from_dict(store.get_run(old).controllers["hold"]).auto, AutoRecording)
    for rid in (run_id, old):
        ingest_one_by_one(store, rid, readings(8, 24))
    assert outcome(store, old) == outcome(store, run_id)
    decisions, events = outcome(store, old)
    assert decisions and [e[0] for e in events] == ["auto_gains"]
    # a tuned row and a fallback row of the old code: their fields as it wrote them
    tuned = store.get_run(old).controllers["hold"]["auto"]
    assert list(tuned) == ["start", "end", "size", "status", "initial", "first", "gains"]
    assert ControllerState.from_dict({"auto": tuned}).to_dict()["auto"] == tuned
    legacy = {"status": "fallback", "problem": "no_window"}
    assert ControllerState.from_dict({"auto": legacy}).auto == AutoFallback(problem="no_window")


def test_an_engine_built_without_a_tuner_falls_back_and_says_so(store):
    run_id, policy = new_run(store, "warmup-untuned")
    ingest_one_by_one(store, run_id, readings(0, 20), Engine(load_policy({**POLICY, "name": "warmup-untuned"}),
                                                             policy.version))
    decisions, events = outcome(store, run_id)
    (fallback,) = events
    assert fallback[0] == "auto_gains_fallback" and fallback[2]["problem"] == "no_tuner"
    assert "built without a tuner" in fallback[2]["reason"] and "keeps its fallback gains" in fallback[2]["reason"]
    assert decisions and all(d[0] > 14 for d in decisions)  # the fallback gains act after the test
    assert store.get_run(run_id).controllers["hold"]["auto"]["problem"] == "no_tuner"


def test_the_fit_is_typed_and_the_warmup_asks_for_no_replay_of_the_current_gains():
    policy = load_policy(POLICY)
    knobs = {"learning_rate": KNOBS[0]}
    observations = readings(0, 14)
    full = tune_controller(policy, knobs, "hold", observations)
    warm = fit_warmup(policy, knobs, "hold", observations)
    assert isinstance(full, Tuned) and full.current is not None and warm.current is None
    assert warm.spec == full.spec and warm.proposed == full.proposed
    spec = warm.spec
    assert spec.gains == "absolute" and spec.identify is None
    assert (spec.kp, spec.ki, spec.kd, spec.setpoint_weight) == (warm.tuning.kp, warm.tuning.ki, warm.tuning.kd,
                                                                 warm.tuning.setpoint_weight)
    answer = full.to_dict()
    assert answer["gains"] == full.tuning.to_dict() and answer["predicted"]["current"] == full.current.to_dict()
    assert load_policy(answer["policy"]).controllers[0] == spec
