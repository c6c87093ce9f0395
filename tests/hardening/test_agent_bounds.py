"""Issue 51, agent side: the controller's history and answers cannot turn control off or grow the
training process.

A real ``Trainer.train()`` on a tiny model runs under ActuatorCallback against the real service
under uvicorn, on Postgres where a store is restored. The cases come from corpus/incidents.yaml:

- a **restored store**: the run's rows are put back as a backup taken mid-run holds them (the
  decisions, observations and events after it gone, the run's row as it was), the way a restore
  from a backup or a failover to a lagging replica leaves them. The service numbers decisions
  again from its restored count: every one of them must be applied or set aside, and the agent
  must say loudly that control resumed after the controller's history changed.
- a **decision storm**: one answer carrying 1,000 decisions on one knob; the rate limit holds per
  step boundary (only the newest is applied), the rest are acknowledged as superseded.
- **unbounded answers**: decisions whose reasons are huge, many of them: what the agent keeps of
  the decisions it applied is bounded in entries and bytes, whatever the controller sends.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import create_engine, text
from transformers import TrainerCallback

import actuator.agents.session as session_module
from actuator.agents.callback import ActuatorCallback, Connection, Reporting
from actuator.agents.probes import KLDrift
from actuator.testing import Postgres, Service, make_service
from agent_helpers import HELD_OUT, SlowSteps, make_trainer, record_lr_used
from harden import ServedApp, wait_until
from test_agent_hostile import Front, sender_with, warnings_with

CORPUS = yaml.safe_load((Path(__file__).parent / "corpus" / "incidents.yaml").read_text())
# Drift above a zero setpoint: the controller lowers the learning rate on nearly every observation.
POLICY = {"name": "bounds", "controllers": [{"name": "drift", "probe": "kl_drift", "knob": "learning_rate",
                                             "setpoint": 0.0, "kp": 0.5, "ki": 0.1}]}
MAX_STEP = 0.2  # the learning rate's rate limit, in its log scale: at most x e^0.2 per boundary
KNOBS = {"learning_rate": {"min": 1e-7, "max": 1e-2, "max_step": MAX_STEP}}
RESUMED = "control resumed after the controller's history changed"


def _cases(kind: str) -> list[Any]:
    return [pytest.param(c, id=c["name"]) for c in CORPUS[kind]]


@pytest.fixture
def pg_service(postgres: Postgres, tmp_path: Path) -> Any:
    svc = make_service(postgres.create_database(f"bounds_{tmp_path.name[-12:].lower()}"), log_dir=str(tmp_path))
    svc.start()
    yield svc
    svc.stop()


def train(tmp_path: Path, tokenizer: Any, url: str, *, steps: int, lr: float = 1e-3, every: int = 1,
          extra: TrainerCallback | None = None) -> tuple[ActuatorCallback, list[float]]:
    """A tiny Trainer under ActuatorCallback at ``url``; the lr each optimizer step really used."""
    trainer = make_trainer(tmp_path, tokenizer, steps=steps, scheduler="constant", lr=lr)
    used = record_lr_used(trainer)
    cb = ActuatorCallback(POLICY, connection=Connection(url, flush_timeout=20.0), knobs=KNOBS,
                          reporting=Reporting(budget_share=1.0),
                          probes=[KLDrift(HELD_OUT, tokenizer, every=every, max_length=32)]).attach(trainer)
    trainer.add_callback(SlowSteps(0.03))
    if extra is not None:
        extra.cb = cb  # type: ignore[attr-defined]
        trainer.add_callback(extra)
    trainer.train()
    assert trainer.state.global_step == steps
    return cb, used


def decisions(url: str, run_id: str) -> list[dict[str, Any]]:
    """Every decision of the run as stored, a page at a time."""
    items: list[dict[str, Any]] = []
    while True:
        r = httpx.get(f"{url}/v1/runs/{run_id}/decisions", timeout=30,
                      params={"limit": 1000, "after": items[-1]["number"] if items else 0})
        assert r.status_code == 200, r.text
        if not r.json()["items"]:
            return items
        items += r.json()["items"]


# -- a restored store ------------------------------------------------------------------------------
class Backup:
    """What a backup of one run holds, and the run's rows put back as restoring it leaves them
    (Postgres): its row as it was, its decisions, observations and events after it gone."""

    def __init__(self, url: str, run_id: str) -> None:
        self.engine, self.run_id = create_engine(url), run_id
        self.decisions = self.seq = self.event = 0

    def take(self) -> None:
        with self.engine.begin() as c:
            c.execute(text("DROP TABLE IF EXISTS backup_run"))
            c.execute(text("CREATE TABLE backup_run AS SELECT * FROM runs WHERE id = :id"), {"id": self.run_id})
            self.decisions = c.scalar(text("SELECT decision_count FROM backup_run"))
            self.seq = c.scalar(text("SELECT coalesce(max(seq), -1) FROM observations WHERE run_id = :id"),
                                {"id": self.run_id})
            self.event = c.scalar(text("SELECT max(id) FROM events WHERE run_id = :id"), {"id": self.run_id})

    def restore(self) -> None:
        with self.engine.begin() as c:
            columns = [r[0] for r in c.execute(text(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' AND column_name <> 'id'"))]
            c.execute(text(f"UPDATE runs SET {', '.join(f'{k} = b.{k}' for k in columns)} FROM backup_run b "
                           "WHERE runs.id = b.id"))
            args = {"id": self.run_id, "n": self.decisions, "seq": self.seq, "event": self.event}
            c.execute(text("DELETE FROM decisions WHERE run_id = :id AND number > :n"), args)
            c.execute(text("DELETE FROM observations WHERE run_id = :id AND seq > :seq"), args)
            c.execute(text("DELETE FROM events WHERE run_id = :id AND id > :event"), args)

    def close(self) -> None:
        self.engine.dispose()


class Incident(TrainerCallback):
    """At step boundaries: back the run up once the agent has applied ``backup_after`` decisions,
    restore it once the agent has seen ``restore_after`` decisions the backup does not have."""

    def __init__(self, url: str, backup_after: int, restore_after: int) -> None:
        self.url, self.backup_after, self.restore_after = url, backup_after, restore_after
        self.cb: ActuatorCallback | None = None
        self.backup: Backup | None = None
        self.restored_at: int | None = None
        self.seen = 0  # the highest decision number the agent had when the store was restored

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        cb = self.cb
        if cb is None or cb.session.run_id is None or self.restored_at is not None:
            return
        if self.backup is None:
            if len(cb.session.applied) >= self.backup_after:
                self.backup = Backup(self.url, cb.session.run_id)
                self.backup.take()
        elif cb.session.last_decision >= self.backup.decisions + self.restore_after:
            self.seen = cb.session.last_decision
            self.backup.restore()
            self.restored_at = state.global_step


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _cases("restored_stores"))
def test_control_resumes_after_a_restored_store(case: dict[str, Any], tmp_path: Path, char_tokenizer: Any,
                                                pg_service: Service, postgres: Postgres,
                                                caplog: pytest.LogCaptureFixture) -> None:
    incident = Incident(pg_service.env["ACTUATOR_DATABASE_URL"], case["backup_after"], case["restore_after"])
    with caplog.at_level(logging.INFO, logger="actuator.agents"):
        cb, used = train(tmp_path, char_tokenizer, pg_service.url, steps=case["steps"], extra=incident)
    assert incident.backup is not None and incident.restored_at is not None, "the store was backed up and restored"
    incident.backup.close()
    restored, seen, at = incident.backup.decisions, incident.seen, incident.restored_at
    stored = decisions(pg_service.url, cb.session.run_id)
    after = [d for d in stored if d["number"] > restored]  # numbered again from the restored count
    print(f"\nrestored store: backup at {restored} decisions, the agent had seen {seen}, restored after step {at}; "
          f"{len(after)} decisions since, {len(cb.session.applied)} applied entries")
    assert len(after) >= case["restore_after"], "the controller decided again after the restore"

    # every decision numbered again was applied or set aside (none ignored as "seen before"), the
    # ones the agent had seen under those numbers included; the last boundary's may come too late
    last = max(e["step"] for e in cb.session.applied)
    for d in after:
        if d["step"] < last:
            assert d["applied_step"] is not None or d["skipped"], d
    events = httpx.get(f"{pg_service.url}/v1/runs/{cb.session.run_id}/events", params={"limit": 1000}).json()
    changed = [e for e in events if e["kind"] == "history_changed"]
    assert len(changed) == 1, changed
    epoch = changed[0]["payload"]["epoch"]
    # (an answer of the old history that came in before the restore may still be applied after it)
    resumed = [e for e in cb.session.applied if e["epoch"] == epoch]
    assert [e for e in resumed if restored < e["number"] <= seen], \
        f"decisions {restored + 1}-{seen} of the restored store were applied"
    by_number = {d["number"]: d for d in stored}
    for entry in resumed:
        # the restored controller orders from its older values: the agent's rate limit may clip them
        assert entry["ordered"] == by_number[entry["number"]]["new_value"]
        if entry["step"] < last:  # acknowledged with the value set, and the optimizer ran with it
            assert by_number[entry["number"]]["applied_value"] == pytest.approx(entry["applied"], rel=1e-12)
        if entry["step"] < len(used):
            assert used[entry["step"]] == pytest.approx(entry["applied"], rel=1e-12)

    # said loudly, once, with the numbers; and recorded on the service
    loud = warnings_with(caplog, RESUMED)
    assert len(loud) == 1, caplog.text
    told = re.search(r"had seen decision (\d+), the controller's decisions now follow (\d+)", loud[0])
    assert told is not None and int(told.group(1)) >= seen and int(told.group(2)) == restored, loud
    assert changed[0]["payload"]["resumed_after"] == restored and changed[0]["payload"]["new_epoch"] is True
    assert changed[0]["payload"]["agent_last_decision"] >= seen
    assert cb.session.sender is not None and cb.session.sender.stats.resyncs == 1 and cb.session.sender.stats.dropped == 0


# -- a decision storm --------------------------------------------------------------------------------
class Storm(TrainerCallback):
    """At step ``at``: an operator's script orders ``count`` overrides of the learning rate, each a
    decision (from the value in effect up to ``factor`` times it); the next observation's answer
    brings them all before the next boundary."""

    def __init__(self, url: str, at: int, count: int, factor: float) -> None:
        self.url, self.at, self.count, self.factor = url, at, count, factor
        self.cb: ActuatorCallback | None = None
        self.numbers: list[int] = []
        self.before = 0.0

    def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
        cb = self.cb
        if cb is None or state.global_step != self.at:
            return
        assert cb.session.sender is not None and cb.session.run_id is not None
        assert cb.session.sender.flush(30)
        cb.session.receive()  # what came before the storm is applied first, at this boundary
        self.before = cb.session.knob_values()["learning_rate"]
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for i in range(1, self.count + 1):
                value = self.before * self.factor ** (i / self.count)
                r = http.post(f"/v1/runs/{cb.session.run_id}/knobs/learning_rate/override", json={"value": value})
                assert r.status_code == 200, r.text
                self.numbers += [d["number"] for d in r.json()["decisions"]]
        cb.session.submit(state.global_step, {})  # one observation: its answer carries the storm
        assert cb.session.sender.flush(60)
        wait_until(lambda: cb.session.sender.stats.sent >= cb.session.seq, 30, "the storm's answer")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _cases("decision_storms"))
def test_a_decision_storm_moves_a_knob_within_one_rate_limit(case: dict[str, Any], tmp_path: Path,
                                                             char_tokenizer: Any, module_service: Service,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    storm = Storm(module_service.url, case["at"], case["decisions"], case["factor"])
    with caplog.at_level(logging.INFO, logger="actuator.agents"):
        cb, used = train(tmp_path, char_tokenizer, module_service.url, steps=case["at"] + 6, lr=1e-4, every=3,
                         extra=storm)
    assert len(storm.numbers) == case["decisions"]
    at = case["at"] + 1  # the boundary after the storm's answer came in
    entries = [e for e in cb.session.applied if e["step"] == at]
    print(f"\ndecision storm: {len(storm.numbers)} decisions, lr {storm.before:.4g} -> {used[at]:.4g} at boundary "
          f"{at} (the storm ordered {storm.before * case['factor']:.4g}); applied there: {entries}")
    # one decision applied on the knob at that boundary: the newest, moved by one rate limit at most
    assert [e["number"] for e in entries] == [storm.numbers[-1]], entries
    assert used[at] == pytest.approx(entries[0]["applied"], rel=1e-12)
    assert used[at] / storm.before <= math.exp(MAX_STEP) * (1 + 1e-9), (storm.before, used[at])
    assert used[at] > storm.before  # it moved, toward the newest order
    # the others were acknowledged as set aside, superseded by it: the audit trail is true
    stored = {d["number"]: d for d in decisions(module_service.url, cb.session.run_id) if d["number"] in storm.numbers}
    skipped = [n for n in storm.numbers[:-1] if "superseded by decision" in (stored[n]["skipped"] or "")]
    assert len(skipped) == case["decisions"] - 1, f"{len(skipped)} of {case['decisions'] - 1}"
    assert stored[storm.numbers[-1]]["applied_step"] == at
    said = [r.getMessage() for r in caplog.records if f"step {at}: {case['decisions']} decisions arrived" in r.getMessage()]
    assert len(said) == 1 and f"{case['decisions'] - 1} set aside as superseded" in said[0], said


# -- what the agent keeps of the decisions it applied --------------------------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _cases("unbounded_answers"))
def test_the_applied_decision_history_is_bounded(case: dict[str, Any], tmp_path: Path, char_tokenizer: Any,
                                                 module_service: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every decision carries a huge reason and there are more decisions than the agent keeps
    whole (lowered here from 1,000 so that a short run passes it): the entries kept, their bytes
    and their reasons are bounded, the older decisions are summarised per knob, none uncounted."""
    sender_with(monkeypatch)
    kept = case["kept"]
    monkeypatch.setattr(session_module, "APPLIED_KEPT", kept, raising=False)
    front = Front(module_service.url, {"answer": "ingest", "add": {"decisions": {"reason": "r" * case["reason_bytes"]}}})
    with ServedApp(front.app) as served:
        cb, _ = train(tmp_path, char_tokenizer, served.url, steps=case["steps"])
    session = cb.session
    size = len(json.dumps(cb.session.applied))
    print(f"\nbounded history: {len(cb.session.applied)} decisions kept whole ({size:,} bytes); reasons of "
          f"{case['reason_bytes']:,} bytes each")
    assert size <= 2 * kept * 1000, size  # ~1 kB an entry at most, whatever the reasons' size
    assert kept <= len(cb.session.applied) <= 2 * kept
    assert all(len(e["reason"]) <= 200 for e in cb.session.applied)
    summary = session.applied_summary.get("learning_rate", {"decisions": 0})
    assert session.applied_total > 2 * kept, "more decisions than the agent keeps whole"
    # nothing uncounted: the entries kept and the summary add up to every decision applied
    assert summary["decisions"] + len(cb.session.applied) == session.applied_total
    assert summary["last_step"] < cb.session.applied[0]["step"] or summary["last_step"] == cb.session.applied[0]["step"]
