"""The store: policies, runs, observations, decisions and audit events in SQLAlchemy 2.0.

SQLite (embedded default) or Postgres (production). ``ingest`` is the hot path: one
transaction that locks the run row (``SELECT ... FOR UPDATE`` on Postgres, a per-run lock in
process for SQLite), skips already-stored sequence numbers, runs the engine on the new
observations in order and writes observations, decisions, events and the run's new state
together, so a crash never leaves decisions without the state that produced them.

The hot path is SQLAlchemy Core over plain dicts, not the ORM: the run row is read once, its
JSON columns decoded once and written back only when they changed; a batch's rows are one
statement per table (on Postgres every write of an ingest is one statement: the rows travel as
one JSON document each, expanded by ``json_to_recordset``). The rest (registration, operator
actions, reads) uses the ORM.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import json
import math
import secrets
import select as _select
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import pydantic_core
from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    cast,
    create_engine,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from ._exceptions import ActuatorError
from .engine import Engine
from .models import Base, DecisionRow, EventRow, ObservationRow, PolicyRow, RunRow, new_epoch, utcnow
from .policy import PolicyDocument
from .run_state import AutoPending, ControllerState, KnobState, RunContext, StepWindow, knobs_in_effect
from .schemas import (
    FINAL_STATES,
    MAX_SEQ_GAP,
    Action,
    CatalogueSpec,
    Decision,
    DecisionPublic,
    Event,
    HistoryChanged,
    ObservationBatch,
    ObservationCreate,
    PolicyMoved,
    RunCreate,
    RunRegistered,
    RunStateName,
    StateChanged,
    declared_catalogue,
)
from .tune import fit_warmup
from .warmup import FitNeeded, FitsOutsideLock, fits_in_place

__all__ = ["Store", "IngestOutcome", "ObservationRefused", "RunTokenRefused", "PolicyVersionConflict", "RunSnapshot",
           "hash_token", "new_token", "make_engine", "stored_policy", "MAX_NAMES"]

# Distinct probe, metric and knob names one run may report over its life: each becomes a key of
# the run's row (read and written on every ingest) and a Prometheus label value.
MAX_NAMES = 1024

_T = TypeVar("_T")


def _table(row: type[Base]) -> Table:
    """A mapped class's table (declarative classes type ``__table__`` as any FromClause)."""
    table = row.__table__
    assert isinstance(table, Table)
    return table


_RUNS, _OBS, _DEC, _EV, _POL = (_table(RunRow), _table(ObservationRow), _table(DecisionRow), _table(EventRow),
                                _table(PolicyRow))
# The run's JSON columns an ingest reads and may write (run_metadata is never touched by one): the
# run's context (knobs, controllers, guardrails), then what it last observed.
_CONTEXT_JSON = ("knobs", "controllers", "guardrails")
_STATE_JSON = (*_CONTEXT_JSON, "latest_probes", "latest_metrics", "knobs_in_effect")
# The run row under its lock; the JSON columns as their stored text, so an ingest can tell which
# ones it changed by comparing encodings (whatever the engine mutates, and however deep).
_LOCK_RUN = (select(_RUNS.c.id, _RUNS.c.policy_id, _RUNS.c.policy_version, _RUNS.c.state, _RUNS.c.token_hash,
                    _RUNS.c.last_step, _RUNS.c.last_seq, _RUNS.c.decision_count, _RUNS.c.decision_epoch,
                    _RUNS.c.epoch_from,
                    *(cast(_RUNS.c[name], Text).label(name) for name in _STATE_JSON))
             .where(_RUNS.c.id == bindparam("run_id")).with_for_update())
# The hot path's other statements, built once (building and cache-keying a statement per request
# costs more than executing it on SQLite).
_TOKEN_HASH = select(_RUNS.c.token_hash).where(_RUNS.c.id == bindparam("run_id"))
_STORED_SEQS = select(_OBS.c.seq).where(_OBS.c.run_id == bindparam("run_id"),
                                        _OBS.c.seq.in_(bindparam("seqs", expanding=True)))
_DECISIONS_BETWEEN = (select(*(_DEC.c[name] for name in DecisionPublic.model_fields))  # the record's fields
                      .where(_DEC.c.run_id == bindparam("run_id"), _DEC.c.number > bindparam("after"),
                             _DEC.c.number <= bindparam("up_to"))
                      .order_by(_DEC.c.number))
# The agent's acknowledgement of a decision, recorded once: a repeat (a retried request) is ignored.
_ACK = (update(_DEC)
        .where(_DEC.c.run_id == bindparam("ack_run"), _DEC.c.number == bindparam("ack_number"),
               _DEC.c.applied_step.is_(None), _DEC.c.skipped.is_(None))
        .values(applied_step=bindparam("ack_step"), applied_value=bindparam("ack_value"),
                skipped=bindparam("ack_skipped")))
# What an acknowledgement is checked against: the step a decision was ordered for and its knob.
_ORDERED = select(_DEC.c.number, _DEC.c.step, _DEC.c.knob).where(
    _DEC.c.run_id == bindparam("run_id"), _DEC.c.number.in_(bindparam("numbers", expanding=True)))
# An applied value may differ from a knob's bound by float rounding (a setter that rescales a
# schedule reads back a product of floats); anything further is no value the agent could have set.
_BOUND_RTOL = 1e-9
# Writers of one policy name that lose the race for a version number try again with the next one;
# each loss means another writer stored a version, so this many losses in a row is contention no
# publisher should meet (the request is refused with 409 rather than spin).
_VERSION_ATTEMPTS = 32
_DECISION_IDS = select(_DEC.c.number, _DEC.c.id).where(_DEC.c.run_id == bindparam("run_id"),
                                                       _DEC.c.number >= bindparam("first"))
# What SQLAlchemy's JSON type writes too (stored text compares equal), but refusing NaN and
# infinities: every backend holds finite numbers only (Postgres' JSON has no others), so a
# non-finite value is the same error on SQLite as on Postgres, never stored on one of them only.
_dumps = functools.partial(json.dumps, allow_nan=False)
# Ingests of one batch that give up the run's lock for a gains-auto fit before one fits in place.
_FIT_ATTEMPTS = 3


def _json(value: Any) -> str:
    """JSON for rows (a batch's, or one value): pydantic-core's encoder, several times faster
    than json.dumps; NaN and infinities written as json.dumps writes them."""
    return pydantic_core.to_json(value, inf_nan_mode="constants").decode()


class RunTokenRefused(ActuatorError, PermissionError):
    """The token does not grant the run (checked on the locked row: a cached verification of the
    token never outlives a change of the run's token)."""


class ObservationRefused(ActuatorError, ValueError):
    """A batch contradicts itself or what is stored for its run; nothing of it is stored.
    ``loc`` names the field (``observations.3.step``); ``status`` is 422 (the request alone is
    wrong) or 409 (it conflicts with stored observations)."""

    def __init__(self, loc: str, message: str, status: int = 422) -> None:
        super().__init__(f"{loc}: {message}")
        self.loc, self.message, self.status = loc, message, status


class PolicyVersionConflict(ActuatorError, RuntimeError):
    """Other writers kept taking the next version of this policy name (see ``create_policy``)."""


def stored_policy(row: Any) -> PolicyDocument:
    """A stored policy version's document (a ``PolicyRow``, or a row with its ``document`` and
    ``catalogue``), validated with the catalogue entries it was accepted with."""
    with declared_catalogue(row.catalogue):
        return PolicyDocument.model_validate(row.document)


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
    # No pool_pre_ping (a round trip per checkout): a pooled connection the server has closed
    # (a restart sends it a FATAL message and EOF) is readable while idle, which a zero-timeout
    # poll sees for free; one that died silently fails its first statement, which invalidates
    # the pool, and reads and ingests retry once on a fresh connection (``_retry_on_disconnect``).
    # Up to 30 connections (as before), all kept: an overflow connection is closed when it is
    # checked in, so a service busier than the persistent part connected anew (a Postgres backend
    # forked) on every other request.
    engine = create_engine(url, pool_size=30, max_overflow=0)

    @event.listens_for(engine, "checkout")
    def _drop_closed(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if _closed_by_server(dbapi_conn):
            raise DisconnectionError("the server closed this pooled connection")  # the pool connects anew

    return engine


def _closed_by_server(dbapi_conn: Any) -> bool:
    """An idle libpq connection has nothing to read unless the server hung up (or sent a notice,
    after which a reconnect costs little)."""
    try:
        fd = dbapi_conn.pgconn.socket
    except Exception:  # noqa: BLE001 - closed or broken: psycopg raises when there is no socket
        return True
    if hasattr(_select, "poll"):
        poller = _select.poll()
        poller.register(fd, _select.POLLIN)
        return bool(poller.poll(0))
    return bool(_select.select([fd], [], [], 0)[0])  # pragma: no cover - Windows


def _retry_on_disconnect(fn: Callable[..., _T]) -> Callable[..., _T]:
    """Run ``fn`` once more when its pooled connection turned out dead (the database restarted
    since it was last used): the failure invalidated the pool, so the retry connects anew. Only
    for reads and for transactions whose first statement failed (nothing written yet)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
        return fn(*args, **kwargs)

    return wrapper


@dataclass(eq=False)
class RunSnapshot:
    """The run's row as an ingest read it under the lock and left it (what the answer and the
    metrics need): its control state typed (``context``: knobs, controllers, guardrails, state,
    decision count), the latest values it observed decoded."""

    id: str
    policy_id: int
    policy_version: int
    token_hash: str
    last_step: int | None
    last_seq: int | None
    context: RunContext
    latest_probes: dict[str, float]
    latest_metrics: dict[str, float]
    knobs_in_effect: dict[str, float]
    epoch: str = "0"  # the decision numbering's identity, and the decision count it started at
    epoch_from: int = 0

    @property
    def state(self) -> RunStateName:
        return self.context.state

    @property
    def decision_count(self) -> int:
        return self.context.decision_count


@dataclass
class IngestOutcome:
    accepted: int
    duplicates: int
    new_observations: list[ObservationCreate]
    decisions: list[DecisionPublic]  # decisions after the agent's last_decision (to apply), oldest first
    created: list[DecisionPublic]  # the decisions this request created
    actions: list[Action]
    events: list[Event]
    run: RunSnapshot
    controller_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    more_decisions: bool = False  # ``decisions`` stopped at the cap: more follow the last one
    resync: HistoryChanged | None = None  # the agent's history was not the store's: where it resumes
    # the knob values in effect after this request (Store.knobs_in_effect); None: it changed nothing
    knobs_in_effect: dict[str, float] | None = None


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.is_sqlite = url.startswith("sqlite")
        self._run_locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._policy_lock = threading.Lock()
        self._policy_engines: dict[int, Engine] = {}  # policy versions are immutable
        self._write = self._write_sqlite if self.is_sqlite else self._write_postgres

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
    def create_policy(self, doc: PolicyDocument, *, reuse_identical: bool = False,
                      catalogue: CatalogueSpec | None = None) -> PolicyRow:
        """Store ``doc`` as the next version of its name. ``reuse_identical``: return the latest
        version instead when it holds the same document and is not archived (a registration
        carrying a policy inline stores it once, however many carry it at the same time).
        ``catalogue``: the entries ``doc`` was validated with beyond the service's own (a
        registration's), kept with the version so that it reads again as it was accepted.

        The next number is read without a lock, so two writers (threads here, other workers) can
        read the same one: the unique key (name, version) lets one of them store it, and the other
        tries again in a new transaction, which sees the winner. Every publisher succeeds, versions
        stay contiguous; :class:`PolicyVersionConflict` only after ``_VERSION_ATTEMPTS`` losses."""
        document = doc.model_dump(mode="json")
        # the threads of this process take turns: only other processes can make an attempt lose
        with self._policy_lock:
            for _ in range(_VERSION_ATTEMPTS):
                try:
                    with self.session() as s:
                        latest = s.scalars(select(PolicyRow).where(PolicyRow.name == doc.name)
                                           .order_by(PolicyRow.version.desc()).limit(1)).first()
                        if reuse_identical and latest is not None and not latest.archived \
                                and latest.document == document:
                            return latest
                        row = PolicyRow(name=doc.name, version=(latest.version if latest else 0) + 1,
                                        document=document,
                                        catalogue=catalogue.model_dump(mode="json") if catalogue else None)
                        s.add(row)
                    return row
                except IntegrityError:
                    continue  # another writer stored this version number first
        raise PolicyVersionConflict(f"policy {doc.name!r}: other writers took the next version "
                                    f"{_VERSION_ATTEMPTS} times in a row; try again")

    @_retry_on_disconnect
    def get_policy(self, name: str, version: int | None = None) -> PolicyRow | None:
        with self.sessions() as s:
            q = select(PolicyRow).where(PolicyRow.name == name)
            q = q.where(PolicyRow.version == version) if version else q.order_by(PolicyRow.version.desc())
            return s.scalars(q.limit(1)).first()

    @_retry_on_disconnect
    def get_policy_by_id(self, policy_id: int) -> PolicyRow | None:
        with self.sessions() as s:
            return s.get(PolicyRow, policy_id)

    @_retry_on_disconnect
    def list_policies(self, include_archived: bool = False, *, offset: int = 0, limit: int | None = None,
                      max_bytes: int | None = None) -> list[PolicyRow]:
        """Policy versions by name and version, ``limit`` from ``offset``. ``max_bytes``: the page
        ends before its documents' stored size passes it (one document at least), so a page of
        large documents is never loaded whole; the next page starts at offset + len(page)."""
        with self.sessions() as s:
            ids = select(PolicyRow.id).order_by(PolicyRow.name, PolicyRow.version).offset(offset).limit(limit)
            if not include_archived:
                ids = ids.where(PolicyRow.archived.is_(False))
            if max_bytes is None:
                chosen = list(s.scalars(ids))
            else:
                sizes = s.execute(ids.add_columns(func.length(cast(PolicyRow.document, Text)))).all()
                chosen, total = [], 0
                for policy_id, size in sizes:
                    total += size or 0
                    if chosen and total > max_bytes:
                        break
                    chosen.append(policy_id)
            rows = {r.id: r for r in s.scalars(select(PolicyRow).where(PolicyRow.id.in_(chosen)))} if chosen else {}
            return [rows[i] for i in chosen]

    def policy_engine(self, policy_id: int, conn: Connection | None = None) -> Engine:
        """The engine of a policy version, built once per process (versions are immutable).
        ``conn``: load the policy through it (a caller holding a connection never waits for a
        second one from the pool)."""
        engine = self._policy_engines.get(policy_id)
        if engine is None:
            if conn is None:
                with self.engine.connect() as own:
                    return self.policy_engine(policy_id, own)
            row = conn.execute(select(_POL.c.document, _POL.c.version, _POL.c.catalogue)
                               .where(_POL.c.id == policy_id)).first()
            if row is None:  # pragma: no cover - the foreign key guarantees it
                raise LookupError(f"policy {policy_id} not found")
            engine = Engine(stored_policy(row), row.version,
                            tuner=FitsOutsideLock(fit_warmup))  # gains auto's fit: outside the run's lock
            self._policy_engines[policy_id] = engine
        return engine

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
            # gains auto: each declared warm-up step test, pending until its first observation at its end
            controllers={w.controller: ControllerState(
                auto=AutoPending(window=StepWindow(w.start, w.end, w.size))).to_dict() for w in body.identification},
            guardrails={},
            latest_probes={},
            latest_metrics={},
            knobs_in_effect={k.name: k.value for k in body.knobs},
            run_metadata=dict(body.metadata),
            decision_count=0,
            decision_epoch=new_epoch(),
            epoch_from=0,
            created_at=now,
            updated_at=now,
        )
        with self.session() as s:
            s.add(row)
            s.flush()  # no ORM relationship orders the two inserts; the event's FK needs the run
            s.add(EventRow(run_id=row.id, **RunRegistered(policy=policy.name, version=policy.version,
                                                          knobs={k.name: k for k in body.knobs}).row()))
        return row, token

    @_retry_on_disconnect
    def get_run(self, run_id: str) -> RunRow | None:
        with self.sessions() as s:
            return s.get(RunRow, run_id)

    @_retry_on_disconnect
    def run_token_hash(self, run_id: str) -> str | None:
        """The stored hash of the run's token (None: no such run); what authenticating an agent
        needs, without loading the run."""
        with self.engine.connect() as conn:
            return conn.scalar(_TOKEN_HASH, {"run_id": run_id})

    @_retry_on_disconnect
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
    def _run_lock(self, run_id: str) -> Iterator[None]:
        """SQLite has no row locks: one writer per run within this process."""
        if not self.is_sqlite:
            yield
            return
        with self._locks_guard:
            lock = self._run_locks.setdefault(run_id, threading.Lock())
        with lock:
            yield

    @contextmanager
    def _locked_run(self, run_id: str) -> Iterator[tuple[Session, RunRow | None]]:
        """An ORM transaction holding the run's write lock (operator actions)."""
        with self._run_lock(run_id), self.session() as s:
            run = s.scalars(select(RunRow).where(RunRow.id == run_id).with_for_update()).first()
            yield s, run

    @contextmanager
    def _locked_snapshot(self, run_id: str) -> Iterator[tuple[Connection, RunSnapshot | None, dict[str, str]]]:
        """A Core transaction holding the run's write lock (ingest): the connection, the run as
        read under the lock (None: no such run) and its JSON columns' stored text. Commits when
        the block ends, rolls back when it raises."""
        with self._run_lock(run_id):
            conn, row = self._lock(run_id)
            try:
                if row is None:
                    yield conn, None, {}
                else:
                    stored = {name: getattr(row, name) for name in _STATE_JSON}
                    columns = {name: json.loads(value) for name, value in stored.items()}
                    context = RunContext.from_json(columns["knobs"], columns["controllers"], columns["guardrails"],
                                                   row.state, row.decision_count)
                    run = RunSnapshot(row.id, row.policy_id, row.policy_version, row.token_hash, row.last_step,
                                      row.last_seq, context, columns["latest_probes"], columns["latest_metrics"],
                                      columns["knobs_in_effect"], row.decision_epoch, row.epoch_from)
                    yield conn, run, stored
                conn.commit()
            finally:
                conn.close()  # rolls back what was not committed

    @_retry_on_disconnect
    def _lock(self, run_id: str) -> tuple[Connection, Any]:
        conn = self.engine.connect()
        try:
            return conn, conn.execute(_LOCK_RUN, {"run_id": run_id}).first()
        except BaseException:
            conn.close()
            raise

    def set_state(self, run_id: str, state: RunStateName, reason: str = "") -> RunRow | None:
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            old = run.state
            run.state = state
            run.updated_at = utcnow()
            s.add(EventRow(run_id=run_id, **StateChanged(step=run.last_step, from_=old, to=state,
                                                         reason=reason).row()))
            return run

    @staticmethod
    def context(run: RunRow) -> RunContext:
        """The run's control state, typed, from its row."""
        return RunContext.from_json(run.knobs, run.controllers, run.guardrails, run.state,
                                    run.decision_count)

    def mutate(self, run_id: str, op: Any) -> tuple[RunRow, RunContext, list[DecisionPublic], list[Event]] | None:
        """Apply an operator action ``op(ctx, run) -> (decision drafts, events)`` under the run's
        lock, persisting the context, decisions and audit events in one transaction: the run after
        it, its context, the decisions as stored and the events. ``op`` may raise ``ValueError``
        to refuse (nothing is stored then)."""
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            ctx = self.context(run)
            drafts, events = op(ctx, run)
            now = utcnow()
            rows = self._event_rows(events)
            if ctx.state != run.state:
                rows.append(StateChanged(step=run.last_step, from_=run.state, to=ctx.state).row())
            decisions = self._persist(s.connection(), run.id, now, drafts, run.policy_version, rows)
            columns = ctx.to_json()
            _dumps(columns)  # finite, or refused here as by the hot path
            run.knobs, run.controllers, run.guardrails = columns["knobs"], columns["controllers"], columns["guardrails"]
            run.state, run.decision_count = ctx.state, ctx.decision_count
            run.updated_at = now
            s.flush()
            return run, ctx, decisions, events

    def move_policy(self, run_id: str, policy: PolicyRow, reason: str) -> RunRow | None:
        """Move a live run to another policy version (an explicit, audited action). Controllers
        that keep their name restart bumplessly from the knob values in effect."""
        with self._locked_run(run_id) as (s, run):
            if run is None:
                return None
            old = f"{run.policy_name}@{run.policy_version}"
            run.policy_id, run.policy_name, run.policy_version = policy.id, policy.name, policy.version
            reset = {k: ControllerState.from_dict(v) for k, v in run.controllers.items()}
            for st in reset.values():
                st.reset = True
            run.controllers = {k: st.to_dict() for k, st in reset.items()}
            run.updated_at = utcnow()
            s.add(EventRow(run_id=run_id, **PolicyMoved(step=run.last_step, from_=old, to=f"{policy.name}@{policy.version}",
                                                        reason=reason).row()))
            return run

    def archive_policy(self, name: str) -> int:
        with self.session() as s:
            rows = list(s.scalars(select(PolicyRow).where(PolicyRow.name == name)))
            for r in rows:
                r.archived = True
            return len(rows)

    # -- observations: the hot path ----------------------------------------------------------
    def ingest(self, run_id: str, batch: ObservationBatch, engine: Engine | None = None, *,
               token_hash: str | None = None, max_pending: int | None = None) -> IngestOutcome | None:
        """Store a batch and run the engine on its new observations (None: no such run).
        ``engine``: the run's policy engine (default: the one of the policy the locked row names);
        ``token_hash``: refuse (:class:`RunTokenRefused`) unless it is the run's token's hash;
        ``max_pending``: most decisions after ``batch.last_decision`` to return (None: all).

        A gains-auto warm-up fit the batch makes due is made outside the run's lock: the engine's
        tuner asks for it (:class:`FitNeeded`, nothing stored), it is made, and the ingest runs
        again, taking the same decisions with it; a run whose state moves meanwhile has its fit
        made in place at the last attempt."""
        for _ in range(_FIT_ATTEMPTS):
            try:
                return self._ingest(run_id, batch, engine, token_hash, max_pending)
            except FitNeeded as needed:
                needed.fit()
        with fits_in_place():
            return self._ingest(run_id, batch, engine, token_hash, max_pending)

    def _ingest(self, run_id: str, batch: ObservationBatch, engine: Engine | None, token_hash: str | None,
                max_pending: int | None) -> IngestOutcome | None:
        now = utcnow()
        with self._locked_snapshot(run_id) as (conn, run, stored):
            if run is None:
                return None
            if token_hash is not None and not hmac.compare_digest(token_hash, run.token_hash):
                raise RunTokenRefused(f"this token does not grant access to run {run_id!r}")
            new = self._new_observations(conn, run, batch)
            self._check_new(conn, run, batch, new)
            engine = engine or self.policy_engine(run.policy_id, conn)
            ctx = run.context  # the engine moves it on: the snapshot is left as the ingest leaves the run
            before = (run.state, run.decision_count, run.last_step, run.last_seq)
            resync = self._history_changed(run, batch)
            acked = self._acknowledge(conn, run, batch, before[1]) if resync is None else []
            # the decisions the agent has (its last, or where a changed history resumes it)
            after = batch.last_decision if resync is None else resync.resumed_after
            drafts: list[Decision] = []
            actions: list[Action] = []
            events: list[Event] = []
            outputs: dict[str, dict[str, Any]] = {}
            probes, metrics, in_effect = run.latest_probes, run.latest_metrics, run.knobs_in_effect
            observations = []
            for obs in new:
                observations.append({"seq": obs.seq, "step": obs.step, "probes": obs.probes, "metrics": obs.metrics,
                                     "knobs": obs.knobs, "agent_time": obs.time})
                fresh = run.last_step is None or obs.step >= run.last_step
                if fresh:
                    probes.update(obs.probes)
                    metrics.update(obs.metrics)
                    in_effect.update(obs.knobs)
                    run.last_step = obs.step
                run.last_seq = obs.seq if run.last_seq is None else max(run.last_seq, obs.seq)
                if not fresh or ctx.state in FINAL_STATES:
                    # A late observation (delivered out of order, its step older than one already
                    # evaluated) is kept for the record only: controllers and guardrails move
                    # forward in time, and counting it would reorder consecutive-breach counts.
                    continue
                result = engine.observe(ctx, obs)
                outputs.update(result.controller_outputs)
                actions.extend(result.actions)
                events.extend(result.events)
                drafts.extend(result.decisions)
            # The knob values in effect: the latest observation's, then what the agent acknowledged
            # applying at or after its step (its next request may carry no newer observation, as at
            # a run's end: the observation alone would show the value the decision replaced). Kept
            # in the run's row, so every reader (REST, console, CLI, metrics) reads this one value.
            in_effect = knobs_in_effect(in_effect, run.last_step, acked)
            for field_name, names in (("probes", probes), ("metrics", metrics)):
                if len(names) > MAX_NAMES:
                    raise ObservationRefused(f"observations.{field_name}",
                                             f"a run reports at most {MAX_NAMES} distinct {field_name} names")
            created: list[DecisionPublic] = []
            if new or resync is not None:  # a batch of duplicates changes nothing, unless the history changed
                changes: dict[str, Any] = {name: value for name, old, value in zip(
                    ("state", "decision_count", "last_step", "last_seq"), before,
                    (run.state, run.decision_count, run.last_step, run.last_seq)) if value != old}
                if resync is not None and resync.new_epoch:
                    changes["decision_epoch"], changes["epoch_from"] = resync.epoch, resync.resumed_after
                    run.epoch, run.epoch_from = resync.epoch, resync.resumed_after
                if resync is not None:
                    events.insert(0, resync)
                values = {**ctx.to_json(), "latest_probes": probes, "latest_metrics": metrics,
                          "knobs_in_effect": in_effect}
                for name in _STATE_JSON:
                    encoded = _dumps(values[name])
                    if encoded != stored[name]:
                        changes[name] = encoded
                changes["updated_at"] = now
                event_rows = self._event_rows(events)
                if run.state != before[0]:
                    event_rows.append(StateChanged(step=run.last_step, from_=before[0], to=run.state).row())
                created = self._persist(conn, run_id, now, drafts, engine.policy_version, event_rows,
                                        observations, changes)
            elif acked and _dumps(in_effect) != stored["knobs_in_effect"]:  # acknowledgements alone
                conn.execute(update(RunRow).where(RunRow.id == run_id).values(knobs_in_effect=in_effect,
                                                                               updated_at=now))
            pending = [d for d in created if d.number > after]
            # Decisions from earlier requests the agent has not applied: numbers are gapless, so
            # how many there are is known without counting them. At most ``max_pending`` are
            # answered (the oldest first); the agent asks again from the last one it got.
            earlier = max(0, before[1] - after)
            room = earlier if max_pending is None else min(earlier, max_pending)
            if room:
                query = _DECISIONS_BETWEEN if room == earlier else _DECISIONS_BETWEEN.limit(room)
                pending[:0] = [DecisionPublic.model_construct(**row._mapping) for row in conn.execute(
                    query, {"run_id": run_id, "after": after, "up_to": before[1]})]
            more = max_pending is not None and earlier + len(pending) - room > max_pending
            if more:
                del pending[max_pending:]
            effect = dict(in_effect) if new or acked else None
        return IngestOutcome(len(new), len(batch.observations) - len(new), new, pending, created, actions, events,
                             run, outputs, more_decisions=more, resync=resync,
                             knobs_in_effect=effect)

    @staticmethod
    def _history_changed(run: RunSnapshot, batch: ObservationBatch) -> HistoryChanged | None:
        """Whether the agent followed another history than the store has (None: the same one).

        An agent of another epoch has seen none of this one: its decisions follow the epoch's start.
        An agent that has seen a decision number the run does not have saw a history the store lost
        (restored from a backup, failed over to a lagging replica, which number new decisions again
        from their count): a new epoch starts at the count, and decisions after it are the agent's
        to apply. Either way its acknowledgements name decisions of the other history: not recorded."""
        count = run.decision_count
        if batch.epoch is not None and batch.epoch != run.epoch:
            resumed, fresh = run.epoch_from, False
        elif batch.last_decision > count:
            resumed, fresh = count, True
        else:
            return None
        return HistoryChanged(step=run.last_step, epoch=new_epoch() if fresh else run.epoch, new_epoch=fresh,
                              agent_epoch=batch.epoch, agent_last_decision=batch.last_decision, decisions=count,
                              resumed_after=min(resumed, count), acks_dropped=len(batch.applied))

    @staticmethod
    def _acknowledge(conn: Connection, run: RunSnapshot, batch: ObservationBatch,
                     decided: int) -> list[tuple[str, int, float]]:
        """Record what the agent did with decisions it received. Only what can be true is
        recorded: a decision that existed before this request, acknowledged at or after the step
        it was ordered for, with a value within its knob's bounds; anything else refuses the whole
        batch (nothing of it is stored: the agent's sender then drops its acknowledgements)."""
        if not batch.applied:
            return []
        for i, ack in enumerate(batch.applied):
            if ack.number > decided:
                raise ObservationRefused(f"applied.{i}.number",
                                         f"run {run.id!r} has no decision {ack.number} (it has {decided})")
        numbers = sorted({a.number for a in batch.applied})
        ordered = {row.number: row for row in conn.execute(_ORDERED, {"run_id": run.id, "numbers": numbers})}
        for i, ack in enumerate(batch.applied):
            decision = ordered[ack.number]  # numbers are gapless: every one up to ``decided`` exists
            if ack.step < decision.step:
                raise ObservationRefused(f"applied.{i}.step", f"decision {ack.number} was ordered for step "
                                         f"{decision.step}; it cannot have been {ack.status} at step {ack.step}")
            spec = run.context.knobs.get(decision.knob)
            if ack.value is not None and spec is not None and not _within_bounds(spec, ack.value):
                raise ObservationRefused(f"applied.{i}.value", f"{ack.value!r} is outside {decision.knob}'s "
                                         f"bounds [{spec.min}, {spec.max}]: no value the agent could set")
        conn.execute(_ACK, [{"ack_run": run.id, "ack_number": a.number,
                             "ack_step": a.step if a.status == "applied" else None,
                             "ack_value": a.value if a.status == "applied" else None,
                             "ack_skipped": (f"step {a.step}: {a.reason or 'set aside by the agent'}"
                                             if a.status == "skipped" else None)}
                            for a in batch.applied])
        return [(ordered[a.number].knob, a.step, a.value) for a in sorted(batch.applied, key=lambda a: a.number)
                if a.status == "applied" and a.value is not None]

    @staticmethod
    def _new_observations(conn: Connection, run: RunSnapshot, batch: ObservationBatch) -> list[ObservationCreate]:
        """The batch's observations not stored yet, in seq order. Every stored seq is at most the
        run's last_seq, so only seqs up to it need looking up (none, as a rule)."""
        last = run.last_seq
        candidates = [o.seq for o in batch.observations if last is not None and o.seq <= last]
        seen = set(conn.scalars(_STORED_SEQS, {"run_id": run.id, "seqs": candidates})) if candidates else set()
        return sorted((o for o in batch.observations if o.seq not in seen), key=lambda o: o.seq)

    @staticmethod
    def _event_rows(events: list[Event]) -> list[dict[str, Any]]:
        return [ev.row() for ev in events]

    def _persist(self, conn: Connection, run_id: str, now: datetime, drafts: list[Decision], policy_version: int,
                 events: list[dict[str, Any]], observations: list[dict[str, Any]] | None = None,
                 changes: dict[str, Any] | None = None) -> list[DecisionPublic]:
        """Write decisions (the engine's or an operator's), events, observations and the run's
        changed columns (JSON ones already encoded); the decisions as stored."""
        decisions = [{**d.model_dump(), "policy_version": policy_version} for d in drafts]
        ids = self._write(conn, run_id, now, observations or [], decisions, events, changes or {})
        # what the database gives back for the timestamp (SQLite keeps no time zone)
        created_at = now.replace(tzinfo=None) if self.is_sqlite else now
        return [DecisionPublic.model_construct(id=ids[d["number"]], run_id=run_id, created_at=created_at, **d)
                for d in decisions]

    @staticmethod
    def _write_postgres(conn: Connection, run_id: str, now: datetime, observations: list[dict[str, Any]],
                        decisions: list[dict[str, Any]], events: list[dict[str, Any]],
                        changes: dict[str, Any]) -> dict[int, int]:
        """Every write as one statement: each table's rows as one JSON parameter, the run's
        update beside them. Returns decision number -> id."""
        parts: list[str] = []
        params: dict[str, Any] = {"run_id": run_id, "now": now}
        for table, rows in ((_OBS_ROWS, observations), (_DEC_ROWS, decisions), (_EV_ROWS, events)):
            if rows:
                parts.append(table.pg_cte)
                params[table.cte] = _json(rows)
        if changes:
            sets = []
            for column, value in changes.items():
                sets.append(f"{column} = CAST(%(set_{column})s AS json)" if column in _STATE_JSON
                            else f"{column} = %(set_{column})s")
                params[f"set_{column}"] = value
            parts.append(f"run AS (UPDATE runs SET {', '.join(sets)} WHERE id = %(run_id)s)")
        if not parts:
            return {}
        main = "SELECT number, id FROM dec" if decisions else "SELECT NULL, NULL WHERE false"
        # the driver's own SQL (psycopg placeholders): nothing for SQLAlchemy to parse or compile
        return dict(conn.exec_driver_sql(f"WITH {', '.join(parts)} {main}", params).all())

    @staticmethod
    def _write_sqlite(conn: Connection, run_id: str, now: datetime, observations: list[dict[str, Any]],
                      decisions: list[dict[str, Any]], events: list[dict[str, Any]],
                      changes: dict[str, Any]) -> dict[int, int]:
        """One executemany per table (sqlite3 steps one prepared statement per row in C); JSON
        values encoded here, in pydantic-core."""
        ids: dict[int, int] = {}
        for table, rows in ((_OBS_ROWS, observations), (_DEC_ROWS, decisions), (_EV_ROWS, events)):
            if rows:
                conn.execute(table.sqlite_insert, [{**row, **{c: _json(row[c]) for c in table.json_columns},
                                                    "run_id": run_id, table.stamp: now} for row in rows])
        if decisions:
            ids = dict(conn.execute(_DECISION_IDS, {"run_id": run_id, "first": decisions[0]["number"]}).all())
        if changes:
            conn.execute(_sqlite_update(tuple(changes)),
                         {"run_id": run_id, **{f"set_{k}": v for k, v in changes.items()}})
        return ids

    @staticmethod
    def _check_new(conn: Connection, run: RunSnapshot, batch: ObservationBatch, new: list[ObservationCreate]) -> None:
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
            unknown = sorted(set(obs.knobs) - set(run.context.knobs)) if obs.knobs else None
            if unknown:
                raise refuse(obs, f"knobs.{unknown[0]}", f"the run has no knob {unknown[0]!r} "
                             f"(knobs: {sorted(run.context.knobs)})", 422)
        base = run.last_seq if run.last_seq is not None else 0
        for obs in new:
            if obs.seq > base + MAX_SEQ_GAP:
                raise refuse(obs, "seq", f"seq {obs.seq} leaps more than {MAX_SEQ_GAP} past the run's last seq "
                             f"({run.last_seq}); number observations consecutively", 422)
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
            stored = _OBS.c.run_id == run.id
            below = conn.scalar(select(func.max(_OBS.c.step)).where(stored, _OBS.c.seq < obs.seq))
            above = conn.scalar(select(func.min(_OBS.c.step)).where(stored, _OBS.c.seq > obs.seq))
            if (below is not None and obs.step < below) or (above is not None and obs.step > above):
                raise refuse(obs, "step", f"step {obs.step} (seq {obs.seq}) does not fit between the stored "
                             f"steps around it ({below} .. {above}): steps cannot decrease as seq grows", 409)

    # -- reading ----------------------------------------------------------------------------
    @_retry_on_disconnect
    def list_decisions(self, run_id: str, *, offset: int = 0, limit: int = 100,
                       after: int | None = None) -> tuple[list[DecisionRow], int]:
        with self.sessions() as s:
            base = select(DecisionRow).where(DecisionRow.run_id == run_id)
            if after is not None:
                base = base.where(DecisionRow.number > after)
            total = s.scalar(select(func.count()).select_from(base.subquery())) or 0
            rows = list(s.scalars(base.order_by(DecisionRow.number).offset(offset).limit(limit)))
            return rows, total

    @_retry_on_disconnect
    def list_observations(self, run_id: str, *, offset: int = 0, limit: int = 1000) -> list[ObservationRow]:
        with self.sessions() as s:
            q = (select(ObservationRow).where(ObservationRow.run_id == run_id)
                 .order_by(ObservationRow.seq).offset(offset).limit(limit))
            return list(s.scalars(q))

    @_retry_on_disconnect
    def list_events(self, run_id: str, *, limit: int = 1000, after: int | None = None,
                    latest: bool = False) -> list[EventRow]:
        """A run's events in id order: the first ``limit`` with id > ``after``, or with
        ``latest`` the last ``limit``."""
        with self.sessions() as s:
            q = select(EventRow).where(EventRow.run_id == run_id)
            if after is not None:
                q = q.where(EventRow.id > after)
            if latest:
                return list(reversed(s.scalars(q.order_by(EventRow.id.desc()).limit(limit)).all()))
            return list(s.scalars(q.order_by(EventRow.id).limit(limit)))

    @staticmethod
    def knobs_in_effect(runs: Sequence[RunRow]) -> dict[str, dict[str, float]]:
        """Per run, the knob values in effect: its latest observation's, updated by the values the
        agent acknowledged applying at or after its step (:func:`actuator.run_state.knobs_in_effect`,
        applied by :meth:`ingest`, the one place this value is computed, and kept in the run's
        row). The REST answers, the console, the CLI and the metrics read it here."""
        return {r.id: dict(r.knobs_in_effect) for r in runs}

    @_retry_on_disconnect
    def breach_counts(self, run_id: str) -> dict[str, int]:
        """Per guardrail, how many times it fired (its stored ``guardrail_breach`` events)."""
        with self.sessions() as s:
            payloads = s.scalars(select(EventRow.payload).where(EventRow.run_id == run_id,
                                                                EventRow.kind == "guardrail_breach"))
            return dict(collections.Counter(str(p.get("guardrail")) for p in payloads))

    @_retry_on_disconnect
    def probe_readings(self, run_id: str, probes: Sequence[str]) -> dict[str, int]:
        """Per probe, how many of the run's stored observations carry a reading of it."""
        if not probes:
            return {}
        with self.sessions() as s:
            return {p: s.scalar(select(func.count()).select_from(ObservationRow).where(
                ObservationRow.run_id == run_id, ObservationRow.probes[p].as_float().is_not(None))) or 0
                    for p in probes}

    @_retry_on_disconnect
    def first_event(self, run_id: str, kind: str) -> EventRow | None:
        with self.sessions() as s:
            q = select(EventRow).where(EventRow.run_id == run_id, EventRow.kind == kind).order_by(EventRow.id)
            return s.scalars(q.limit(1)).first()

    @_retry_on_disconnect
    def count_for_run(self, table: type[Base], run_id: str) -> int:
        """How many rows of ``table`` (ObservationRow, DecisionRow, EventRow) the run has."""
        t = _table(table)
        with self.engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(t).where(t.c.run_id == run_id)) or 0

    @_retry_on_disconnect
    def sample_observations(self, run_id: str, every: int, total: int) -> list[ObservationRow]:
        """Every ``every``-th of a run's ``total`` observations in seq order, and the last one: a
        downsampled series read without loading the rest (they are ranked in the database)."""
        if every <= 1:
            return self.list_observations(run_id, limit=max(total, 1))
        ranked = (select(_OBS.c.id, func.row_number().over(order_by=_OBS.c.seq).label("rn"))
                  .where(_OBS.c.run_id == run_id).subquery())
        picked = select(ranked.c.id).where(((ranked.c.rn - 1) % every == 0) | (ranked.c.rn == total))
        with self.sessions() as s:
            q = select(ObservationRow).where(ObservationRow.id.in_(picked)).order_by(ObservationRow.seq)
            return list(s.scalars(q))

    @_retry_on_disconnect
    def latest_decisions(self, run_id: str, limit: int) -> list[DecisionRow]:
        """The run's last ``limit`` decisions, oldest first."""
        with self.sessions() as s:
            q = select(DecisionRow).where(DecisionRow.run_id == run_id).order_by(DecisionRow.number.desc())
            return list(reversed(s.scalars(q.limit(limit)).all()))

    @_retry_on_disconnect
    def count(self, table: type) -> int:
        with self.sessions() as s:
            return s.scalar(select(func.count()).select_from(table)) or 0


def _within_bounds(spec: KnobState, value: float) -> bool:
    """Whether ``value`` is one the agent can have set for a knob (``spec`` as the run stores it):
    within its bounds, give or take float rounding. The agent rounds an integer knob's clamped
    value to the nearest integer, which may pass a fractional bound by up to a half."""
    lo, hi = float(spec.min), float(spec.max)
    if spec.scale == "integer":
        lo, hi = math.floor(lo), math.ceil(hi)
    slack = _BOUND_RTOL * max(abs(lo), abs(hi))
    return lo - slack <= value <= hi + slack


class _RowTable:
    """How the hot path inserts a table's rows: every column but the key, the run id and the
    timestamp comes from a row dict. On Postgres, one data-modifying CTE per table whose rows
    arrive as one JSON array (``json_to_recordset``); on SQLite, one executemany whose JSON
    columns arrive as text."""

    _PG_TYPES = ((JSON, "json"), (BigInteger, "bigint"), (Integer, "integer"), (Float, "float8"), (String, "text"))

    def __init__(self, table: Any, stamp: str, cte: str, returning: str = "") -> None:
        columns = [c for c in table.columns if c.name not in ("id", "run_id", stamp)]
        self.cte, self.stamp = cte, stamp
        self.json_columns = tuple(c.name for c in columns if isinstance(c.type, JSON))
        self.sqlite_insert = insert(table).values({c: bindparam(c, type_=Text) for c in self.json_columns})
        names = [c.name for c in columns]
        record = ", ".join(f"{c.name} {next(t for kind, t in self._PG_TYPES if isinstance(c.type, kind))}"
                           for c in columns)
        self.pg_cte = (f"{cte} AS (INSERT INTO {table.name} (run_id, {', '.join(names)}, {stamp}) "
                       f"SELECT %(run_id)s, {', '.join('r.' + n for n in names)}, %(now)s "
                       f"FROM json_to_recordset(CAST(%({cte})s AS json)) AS r({record}){returning})")


@functools.lru_cache(maxsize=256)
def _sqlite_update(columns: tuple[str, ...]) -> Any:
    """UPDATE of these run columns (JSON ones given as their text), one statement per set."""
    return update(_RUNS).where(_RUNS.c.id == bindparam("run_id")).values(
        {c: bindparam(f"set_{c}", type_=Text if c in _STATE_JSON else _RUNS.c[c].type) for c in columns})


_OBS_ROWS = _RowTable(_OBS, "received_at", "obs")
_DEC_ROWS = _RowTable(_DEC, "created_at", "dec", " RETURNING number, id")
_EV_ROWS = _RowTable(_EV, "created_at", "ev")
