"""decisions record the agent's acknowledgement

A decision stored after the run's last step was never applied, yet the audit trail listed it like
one that was. The agent now reports, with its next observations, each decision it applied (the
step from which it was in effect and the value it really set) or set aside (and why); these
nullable columns keep that. NULL in all three: not acknowledged.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 18:00:00
"""
from __future__ import annotations

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('decisions') as batch:
        batch.add_column(sa.Column('applied_step', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('applied_value', sa.Float(), nullable=True))
        batch.add_column(sa.Column('skipped', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('decisions') as batch:
        batch.drop_column('skipped')
        batch.drop_column('applied_value')
        batch.drop_column('applied_step')
