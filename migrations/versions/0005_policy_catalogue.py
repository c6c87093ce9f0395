"""policy versions keep the catalogue entries they were accepted with

A knob or probe registered only in the agent's process (``@knob_setter(Knob(...))``, a probe of
its own) travels with the run's registration (``RunCreate.catalogue``). The service validates the
run's policy with those entries beside its own, and keeps them with the policy version it stores,
so the version is read again (the run's engine, ``GET /v1/policies``) as it was accepted. Existing
versions need none: NULL.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 09:40:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('policies') as batch:
        batch.add_column(sa.Column('catalogue', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('policies') as batch:
        batch.drop_column('catalogue')
