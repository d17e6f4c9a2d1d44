"""``serve_calls.replayable``: whether a served call holds the sampler's own ids and log-probs.

A gateway in front of a provider that returns no token ids (a hosted API) stores the reply's text tokenized
with the local tokenizer and no log-probs: SFT can train on such a call, OPD (``distill``) cannot. Rows
written before are replayable (the default).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("serve_calls") as batch:
        batch.add_column(sa.Column("replayable", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("serve_calls") as batch:
        batch.drop_column("replayable")
