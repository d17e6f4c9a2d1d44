"""``serve_calls.messages`` and ``.tools`` keep the client's JSON as sent, key order included.

A chat template renders tools (and tool-call arguments) with ``tojson``, in the order of their keys, so the
teacher contexts that re-render a served chat (``persistent_chat``) need the keys in the order the client
sent them. Postgres ``jsonb`` reorders object keys; these two columns become ``json`` there (the text kept as
written). SQLite stores JSON as text already: nothing changes there. Rows written before keep the order
``jsonb`` gave them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_COLUMNS = ("messages", "tools")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in _COLUMNS:
            op.execute(f"ALTER TABLE serve_calls ALTER COLUMN {column} TYPE json USING {column}::json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in _COLUMNS:
            op.execute(f"ALTER TABLE serve_calls ALTER COLUMN {column} TYPE jsonb USING {column}::jsonb")
