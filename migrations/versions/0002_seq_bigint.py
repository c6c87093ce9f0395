"""observation sequence numbers in 64-bit columns

A run whose agent (or anyone holding its token) posted seq 2**31 - 1 could append nothing more:
every larger seq overflowed the 32-bit column. seq and the run's last_seq are BIGINT now (SQLite
integers are 64-bit already; the batch mode rewrites its tables to record the type).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 08:40:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('observations') as batch:
        batch.alter_column('seq', existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False)
    with op.batch_alter_table('runs') as batch:
        batch.alter_column('last_seq', existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=True)


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.alter_column('last_seq', existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=True)
    with op.batch_alter_table('observations') as batch:
        batch.alter_column('seq', existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False)
