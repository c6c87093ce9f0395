"""runs carry the identity of their decision numbering (an epoch)

A store restored from a backup, or a failover to a lagging replica, numbered new decisions again
from the restored count, and the agent ignored every decision numbered at or below the last one it
had seen: control was off, silently. A run now keeps its numbering's epoch (random: a restore
cannot bring back one started after its backup) and the decision count the epoch started at. An
agent that reports a decision number the run does not have, or another epoch, starts a new one.
Existing runs get epoch "0" from 0.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 06:30:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('decision_epoch', sa.String(length=32), nullable=False, server_default='0'))
        batch.add_column(sa.Column('epoch_from', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('epoch_from')
        batch.drop_column('decision_epoch')
