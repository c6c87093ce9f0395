"""SQLAlchemy 2.0 tables of the store. Every change here ships an Alembic revision in migrations/."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from .schemas import RunStateName

__all__ = ["Base", "PolicyRow", "RunRow", "ObservationRow", "DecisionRow", "EventRow", "new_epoch", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def new_epoch() -> str:
    """A decision numbering's identity: random, so a restored store cannot bring back one it started later."""
    return secrets.token_hex(8)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class PolicyRow(Base):
    __tablename__ = "policies"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_policies_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), index=True)
    version: Mapped[int] = mapped_column(Integer)
    document: Mapped[dict[str, Any]]
    # The knobs and probe keys the document was accepted with beyond the service's catalogue (0005):
    # a registration's CatalogueSpec, as JSON; NULL when it needed none.
    catalogue: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    archived: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RunRow(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"))
    policy_name: Mapped[str] = mapped_column(String(64))
    policy_version: Mapped[int] = mapped_column(Integer)
    state: Mapped[RunStateName] = mapped_column(String(16), default="running", index=True)
    token_hash: Mapped[str] = mapped_column(String(64))
    knobs: Mapped[dict[str, Any]]  # name -> KnobSpec dict; "value" is the controller's target
    controllers: Mapped[dict[str, Any]]  # controller name -> {pid, filter, last_step, ...}
    guardrails: Mapped[dict[str, Any]]  # guardrail name -> {baseline, breaches, active}
    latest_probes: Mapped[dict[str, Any]]
    latest_metrics: Mapped[dict[str, Any]]
    knobs_in_effect: Mapped[dict[str, Any]]
    run_metadata: Mapped[dict[str, Any]]
    last_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # seq is 64-bit (0002)
    decision_count: Mapped[int] = mapped_column(Integer, default=0)
    # The identity of the run's decision numbering and the decision count it started at (0004): a
    # store restored from a backup numbers decisions again from its restored count, and starts a
    # new epoch when an agent shows it has seen decisions the store no longer has.
    decision_epoch: Mapped[str] = mapped_column(String(32), default=new_epoch, server_default="0")
    epoch_from: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class ObservationRow(Base):
    __tablename__ = "observations"
    __table_args__ = (UniqueConstraint("run_id", "seq", name="uq_observations_run_seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(Integer)
    probes: Mapped[dict[str, Any]]
    metrics: Mapped[dict[str, Any]]
    knobs: Mapped[dict[str, Any]]
    agent_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class DecisionRow(Base):
    __tablename__ = "decisions"
    __table_args__ = (
        UniqueConstraint("run_id", "number", name="uq_decisions_run_number"),
        Index("ix_decisions_run_id", "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    knob: Mapped[str] = mapped_column(String(64))
    old_value: Mapped[float] = mapped_column(Float)
    new_value: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    controller: Mapped[str | None] = mapped_column(String(64), nullable=True)
    policy_version: Mapped[int] = mapped_column(Integer)
    components: Mapped[dict[str, Any]]
    inputs: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # What the agent acknowledged (migration 0003): applied from a step with a value, or skipped.
    applied_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    applied_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    skipped: Mapped[str | None] = mapped_column(Text, nullable=True)


class EventRow(Base):
    """Audit trail beside decisions: guardrail breaches, overrides, policy moves, state changes."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_run_id", "run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(32))
    step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    payload: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
