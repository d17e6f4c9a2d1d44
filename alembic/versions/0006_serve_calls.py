"""``serve_calls``: what a client sent with each call recorded by ``agentmem serve``.

One row per served invocation (``invocation_id`` is both key and link): the request's ``messages`` and
``tools`` as JSON (NULL for a completions call), the sampling parameters (``sampling``: temperature, top_p,
max_tokens, seed, stop, n, logprobs), what the client named (``client``: episode, task, kind), and in gateway
mode the upstream's per-token prompt log-probs (``prompt_logprobs``, float32 little-endian, NaN for the
first token). Written in the transaction of its invocation.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
TS = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BLOB = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "serve_calls",
        sa.Column("invocation_id", sa.String(64), nullable=False),
        sa.Column("messages", JSON, nullable=True),
        sa.Column("tools", JSON, nullable=True),
        sa.Column("sampling", JSON, nullable=False),
        sa.Column("client", JSON, nullable=False),
        sa.Column("prompt_logprobs", BLOB, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["invocation_id"], ["invocations.id"], name="fk_serve_calls_invocation_id_invocations"),
        sa.PrimaryKeyConstraint("invocation_id", name="pk_serve_calls"),
    )


def downgrade() -> None:
    op.drop_table("serve_calls")
