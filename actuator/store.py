"""The store: policies, runs, observations, decisions and audit events in SQLAlchemy 2.0.

SQLite (embedded default) or Postgres (production). ``ingest`` is the hot path: one
transaction that locks the run row (``SELECT ... FOR UPDATE`` on Postgres, a per-run lock in
process for SQLite), skips already-stored sequence numbers, runs the engine on the new
observations in order and writes observations, decisions, events and the run's new state
together, so a crash never leaves decisions without the state that produced them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import create_engine, event, func, select
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.orm import Session, sessionmaker

from .engine import Engine, RunContext
from .models import DecisionRow, EventRow, ObservationRow, PolicyRow, RunRow, utcnow
from .policy import PolicyDocument
from .schemas import Action, ObservationBatch, ObservationCreate, RunCreate

__all__ = ["Store", "IngestOutcome", "ObservationRefused", "hash_token", "new_token", "make_engine", "MAX_NAMES"]

# Distinct probe, metric and knob names one run may report over its life: each becomes a key of
# the run's row (read and written on every ingest) and a Prometheus label value.
MAX_NAMES = 1024


class ObservationRefused(ValueError):
    """A batch contradicts itself or what is stored for its run; nothing of it is stored.
    ``loc`` names the field (``observations.3.step``); ``status`` is 422 (the request alone is
    wrong) or 409 (it conflicts with stored observations)."""

    def __init__(self, loc: str, message: str, status: int = 422) -> None:
        super().__init__(f"{loc}: {message}")
        self.loc, self.message, self.status = loc, message, status


def new_token() -> str:
    return "act_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Tokens are stored as SHA-256: they are random 256-bit secrets, so no salt/KDF is needed."""
    return hashlib.sha256(token.encode()).hexdigest()


def tokens_match(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)


def make_engine(url: str) -> SAEngine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@dataclass
class IngestOutcome:
    accepted: int
    duplicates: int
    new_observations: list[ObservationCreate]
    decisions: list[DecisionRow]  # every decision after the agent's last_decision (to apply)
    created: list[DecisionRow]  # the decisions this request created
    actions: list[Action]
    events: list[dict[str, Any]]
    run: RunRow
    controller_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.is_sqlite = url.startswith("sqlite")
        self._run_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as s, s.begin():
            yield s

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # -- policies ----------------------------------------------------------------------------
    def create_policy(self, doc: PolicyDocument) -> PolicyRow:
        with self.session() as s:
            latest = s.scalar(select(func.max(PolicyRow.version)).where(PolicyRow.name == doc.name))
            row = PolicyRow(name=doc.name, version=(latest or 0) + 1, document=doc.model_dump(mode="json"))
            s.add(row)
        return row

    def get_policy(self, name: str, version: int | None = None) -> PolicyRow | None:
        with self.sessions() as s:
            q = select(PolicyRow).where(PolicyRow.name == name)
            q = q.where(PolicyRow.version == version) if version else q.order_by(PolicyRow.version.desc())
            return s.scalars(q.limit(1)).first()

    def get_policy_by_id(self, policy_id: int) -> PolicyRow | None:
        with self.sessions() as s:
            return s.get(PolicyRow, policy_id)

    def list_policies(self, include_archived: bool = False) -> list[PolicyRow]:
        with self.sessions() as s:
            q = select(PolicyRow).order_by(PolicyRow.name, PolicyRow.version)
            if not include_archived:
                q = q.where(PolicyRow.archived.is_(False))
            return list(s.scalars(q))

    # -- runs --------------------------------------------------------------------------------
    def create_run(self, body: RunCreate, policy: PolicyRow) -> tuple[RunRow, str]:
        token = new_token()
        now = utcnow()
        row = RunRow(
            id=str(uuid.uuid4()),
            name=body.name,
            policy_id=policy.id,
            policy_name=policy.name,
            policy_version=policy.version,
            state="running",
            token_hash=hash_token(token),
            knobs={k.name: k.model_dump(mode="json") for k in body.knobs},
            controllers={},
            guardrails={},
            latest_probes={},
            latest_metrics={},
            knobs_in_effect={k.name: k.value for k in body.knobs},
            run_metadata=dict(body.metadata),
            decision_count=0,
            created_at=now,
            updated_at=now,
        )
        with self.session() as s:
            s.add(row)
            s.flush()  # no ORM relationship orders the two inserts; the event's FK needs the run
            s.add(EventRow(run_id=row.id, kind="run_registered", step=None,
                           payload={"policy": policy.name, "version": policy.version,
                                    "knobs": {k.name: k.model_dump(mode="json") for k in body.knobs}}))
        return row, token

    def get_run(self, run_id: str) -> RunRow | None:
        with self.sessions() as s:
            return s.get(RunRow, run_id)

    def list_runs(self, *, state: str | None = None, name: str | None = None,
                  limit: int = 100, offset: int = 0) -> list[RunRow]:
        with self.sessions() as s:
            q = select(RunRow).order_by(RunRow.created_at.desc())
            if state:
                q = q.where(RunRow.state == state)
            if name:
                q = q.where(RunRow.name == name)
            return list(s.scalars(q.offset(offset).limit(limit)))

    @contextmanager
    def _locked_run(self, run_id: str) -> Iterator[tuple[Session, RunRow | None]]:
        """A transaction holding the run's write lock."""
        lock: threading.Lock | None = None
        if self.is_sqlite:
            with self._locks_guard:
                lock = self._run_locks.setdefault(run_id, threading.Lock())
            lock.acquire()
        try:
            with self.session() as s:
                run = s.scalars(select(RunRow).where(RunRow.id == run_id).with_for_update()).first()
                yield s, run
        finally:
            if lock is not None:
                lock.release()

    def set_state(self, run_id: str, state: str, reason: str = "") -> RunRow | None:
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            old = run.state
            run.state = state
            run.updated_at = utcnow()
            s.add(EventRow(run_id=run_id, kind="state", step=run.last_step,
                           payload={"from": old, "to": state, "reason": reason}))
            return run

    def _context(self, run: RunRow) -> RunContext:
        return RunContext(
            knobs={k: dict(v) for k, v in run.knobs.items()},
            controllers={k: dict(v) for k, v in run.controllers.items()},
            guardrails={k: dict(v) for k, v in run.guardrails.items()},
            state=run.state,
            decision_count=run.decision_count,
        )

    def _persist(self, s: Session, run: RunRow, ctx: RunContext, drafts: list[Any], events: list[dict[str, Any]],
                 policy_version: int) -> list[DecisionRow]:
        rows = []
        for d in drafts:
            row = DecisionRow(run_id=run.id, number=d.number, step=d.step, knob=d.knob, old_value=d.old_value,
                              new_value=d.new_value, reason=d.reason, controller=d.controller,
                              policy_version=policy_version, components=d.components, inputs=d.inputs,
                              created_at=utcnow())
            s.add(row)
            rows.append(row)
        for ev in events:
            s.add(EventRow(run_id=run.id, kind=ev["kind"], step=ev.get("step"), payload=ev))
        if ctx.state != run.state:
            s.add(EventRow(run_id=run.id, kind="state", step=run.last_step,
                           payload={"from": run.state, "to": ctx.state}))
        run.knobs, run.controllers, run.guardrails = ctx.knobs, ctx.controllers, ctx.guardrails
        run.state, run.decision_count = ctx.state, ctx.decision_count
        run.updated_at = utcnow()
        return rows

    def mutate(self, run_id: str, op: Any) -> tuple[RunRow, list[DecisionRow], list[dict[str, Any]]] | None:
        """Apply an operator action ``op(ctx, run) -> (decision drafts, events)`` under the run's
        lock, persisting the context, decisions and audit events in one transaction. ``op`` may
        raise ``ValueError`` to refuse (nothing is stored then)."""
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            ctx = self._context(run)
            drafts, events = op(ctx, run)
            rows = self._persist(s, run, ctx, drafts, events, run.policy_version)
            s.flush()
            return run, rows, events

    def move_policy(self, run_id: str, policy: PolicyRow, reason: str) -> RunRow | None:
        """Move a live run to another policy version (an explicit, audited action). Controllers
        that keep their name restart bumplessly from the knob values in effect."""
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            old = f"{run.policy_name}@{run.policy_version}"
            run.policy_id, run.policy_name, run.policy_version = policy.id, policy.name, policy.version
            run.controllers = {k: {**v, "reset": True} for k, v in run.controllers.items()}
            run.updated_at = utcnow()
            s.add(EventRow(run_id=run_id, kind="policy_moved", step=run.last_step,
                           payload={"from": old, "to": f"{policy.name}@{policy.version}", "reason": reason}))
            return run

    def archive_policy(self, name: str) -> int:
        with self.session() as s:
            rows = list(s.scalars(select(PolicyRow).where(PolicyRow.name == name)))
            for r in rows:
                r.archived = True
            return len(rows)

    # -- observations: the hot path ----------------------------------------------------------
    def ingest(self, run_id: str, batch: ObservationBatch, engine: Engine) -> IngestOutcome | None:
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            seqs = [o.seq for o in batch.observations]
            seen = set(s.scalars(select(ObservationRow.seq).where(
                ObservationRow.run_id == run_id, ObservationRow.seq.in_(seqs))))
            new = sorted((o for o in batch.observations if o.seq not in seen), key=lambda o: o.seq)
            self._check_new(s, run, batch, new)
            ctx = self._context(run)
            drafts: list[Any] = []
            actions: list[Action] = []
            events: list[dict[str, Any]] = []
            outputs: dict[str, dict[str, Any]] = {}
            probes, metrics, in_effect = dict(run.latest_probes), dict(run.latest_metrics), dict(run.knobs_in_effect)
            for obs in new:
                s.add(ObservationRow(run_id=run_id, seq=obs.seq, step=obs.step, probes=obs.probes,
                                     metrics=obs.metrics, knobs=obs.knobs, agent_time=obs.time))
                fresh = run.last_step is None or obs.step >= run.last_step
                if fresh:
                    probes.update(obs.probes)
                    metrics.update(obs.metrics)
                    in_effect.update(obs.knobs)
                    run.last_step = obs.step
                run.last_seq = obs.seq if run.last_seq is None else max(run.last_seq, obs.seq)
                if not fresh or ctx.state in ("halted", "finished"):
                    # A late observation (delivered out of order, its step older than one already
                    # evaluated) is kept for the record only: controllers and guardrails move
                    # forward in time, and counting it would reorder consecutive-breach counts.
                    continue
                result = engine.observe(ctx, obs)
                outputs.update(result.controller_outputs)
                actions.extend(result.actions)
                events.extend(result.events)
                drafts.extend(result.decisions)
            for field_name, names in (("probes", probes), ("metrics", metrics)):
                if len(names) > MAX_NAMES:
                    raise ObservationRefused(f"observations.{field_name}",
                                             f"a run reports at most {MAX_NAMES} distinct {field_name} names")
            run.latest_probes, run.latest_metrics, run.knobs_in_effect = probes, metrics, in_effect
            decisions = self._persist(s, run, ctx, drafts, events, engine.policy_version)
            s.flush()
            pending = list(s.scalars(select(DecisionRow).where(
                DecisionRow.run_id == run_id, DecisionRow.number > batch.last_decision
            ).order_by(DecisionRow.number)))
            return IngestOutcome(len(new), len(batch.observations) - len(new), new, pending, decisions,
                                 actions, events, run, outputs)

    @staticmethod
    def _check_new(s: Session, run: RunRow, batch: ObservationBatch, new: list[ObservationCreate]) -> None:
        """Refuse a batch whose new observations name knobs the run does not have, or whose steps
        go back as seq grows (within the batch or against stored observations).

        seq orders observations as the agent took them, so steps must never decrease with it.
        Out-of-order *delivery* keeps that order (a late observation has a lower seq and a lower
        or equal step) and is accepted; a higher seq with a lower step means the agent's step
        counter went back, which no delivery order explains. Already-stored seqs are left out
        before this check: a redelivery is always an idempotent 200."""
        index = {o.seq: i for i, o in enumerate(batch.observations)}

        def refuse(obs: ObservationCreate, field_name: str, message: str, status: int) -> ObservationRefused:
            return ObservationRefused(f"observations.{index[obs.seq]}.{field_name}", message, status)

        for obs in new:
            unknown = sorted(set(obs.knobs) - set(run.knobs))
            if unknown:
                raise refuse(obs, f"knobs.{unknown[0]}", f"the run has no knob {unknown[0]!r} "
                             f"(knobs: {sorted(run.knobs)})", 422)
        for prev, obs in zip(new, new[1:]):
            if obs.step < prev.step:
                raise refuse(obs, "step", f"step {obs.step} (seq {obs.seq}) is lower than step {prev.step} "
                             f"(seq {prev.seq}): steps cannot decrease as seq grows", 422)
        if not new or run.last_seq is None:
            return
        appended = next((o for o in new if o.seq > run.last_seq), None)
        if appended is not None and run.last_step is not None and appended.step < run.last_step:
            raise refuse(appended, "step", f"step {appended.step} (seq {appended.seq}) is lower than step "
                         f"{run.last_step} already stored at seq {run.last_seq}: steps cannot decrease as "
                         f"seq grows", 409)
        for obs in new:
            if obs.seq > run.last_seq:
                break
            stored = ObservationRow.run_id == run.id
            below = s.scalar(select(func.max(ObservationRow.step)).where(stored, ObservationRow.seq < obs.seq))
            above = s.scalar(select(func.min(ObservationRow.step)).where(stored, ObservationRow.seq > obs.seq))
            if (below is not None and obs.step < below) or (above is not None and obs.step > above):
                raise refuse(obs, "step", f"step {obs.step} (seq {obs.seq}) does not fit between the stored "
                             f"steps around it ({below} .. {above}): steps cannot decrease as seq grows", 409)

    # -- reading ----------------------------------------------------------------------------
    def list_decisions(self, run_id: str, *, offset: int = 0, limit: int = 100,
                       after: int | None = None) -> tuple[list[DecisionRow], int]:
        with self.sessions() as s:
            base = select(DecisionRow).where(DecisionRow.run_id == run_id)
            if after is not None:
                base = base.where(DecisionRow.number > after)
            total = s.scalar(select(func.count()).select_from(base.subquery())) or 0
            rows = list(s.scalars(base.order_by(DecisionRow.number).offset(offset).limit(limit)))
            return rows, total

    def list_observations(self, run_id: str, *, offset: int = 0, limit: int = 1000) -> list[ObservationRow]:
        with self.sessions() as s:
            q = (select(ObservationRow).where(ObservationRow.run_id == run_id)
                 .order_by(ObservationRow.seq).offset(offset).limit(limit))
            return list(s.scalars(q))

    def list_events(self, run_id: str, *, limit: int = 1000) -> list[EventRow]:
        with self.sessions() as s:
            q = select(EventRow).where(EventRow.run_id == run_id).order_by(EventRow.id).limit(limit)
            return list(s.scalars(q))

    def count(self, table: type) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(table)) or 0
