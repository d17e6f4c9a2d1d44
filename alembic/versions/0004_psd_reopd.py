"""Privileged sampling (PSD off-policy) and replayed-prefix calls (ReOPD) on invocations:

- ``sampled_context`` ('aligned' or 'privileged', default 'aligned'): which prompt sampled the outputs;
- ``privileged_ids`` (nullable blob): the ids spliced before ``prompt_ids`` for the sampler of a privileged
  call, kept apart so that ``prompt_ids`` stays the student-visible prompt;
- ``parent_invocation_id`` (nullable, indexed, foreign key to ``invocations.id``): the stored call a replay
  call branched from. A foreign key, not a plain column: a replay call is worthless without the call it
  branched from, the store never deletes calls, and both databases enforce it (SQLite with foreign keys
  on). The index serves "which replay calls branched from this one".
invocation_history shows sampled_context and parent_invocation_id.

Both views are dropped first and recreated last (see 0002). The downgrade cannot keep a privileged call's
ids apart: it writes them back into ``prompt_ids`` (``privileged_ids + prompt_ids``, ``prompt_tokens``
updated), which is what the sampler consumed, the invariant of 0003's schema; the branch links are lost.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-20
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
BLOB = sa.LargeBinary()
FK = "fk_invocations_parent_invocation_id_invocations"
IX = "ix_invocations_parent_invocation_id"

_HISTORY = """
CREATE VIEW invocation_history AS
SELECT e.run_id AS run_id, i.episode_id AS episode_id, e.task_id AS task_id, e.sample_index AS sample,
       i.step AS step, i.kind AS kind, i.memory_policy AS memory_policy, i.role AS role, {extra}i.id AS invocation_id,
       i.prompt_text AS prompt_text, i.output_text AS output_text,
       i.memory_before AS memory_before, i.memory_after AS memory_after,
       i.chunk_index AS chunk_index, i.prompt_tokens AS prompt_tokens, i.output_tokens AS output_tokens,
       i.policy_version AS policy_version, i.finish_reason AS finish_reason, i.latency_s AS latency_s,
       i.created_at AS created_at
FROM invocations i JOIN episodes e ON e.id = i.episode_id
"""
_EXTRA = "i.sampled_context AS sampled_context, i.parent_invocation_id AS parent_invocation_id, "

EPISODE_SUMMARY = """
CREATE VIEW episode_summary AS
SELECT e.run_id AS run_id, e.id AS episode_id, e.env AS env, e.task_id AS task_id,
       e.sample_index AS sample, e.question AS question, e.gold_answers AS gold,
       e.prediction AS prediction, e.f1 AS f1, e.em AS em, e.sub_em AS sub_em, e.reward AS reward,
       COALESCE(c.n_calls, 0) AS n_calls, COALESCE(c.prompt_tokens, 0) AS prompt_tokens,
       COALESCE(c.output_tokens, 0) AS output_tokens, e.status AS status, e.stop_reason AS stop_reason,
       e.error AS error, e.created_at AS created_at, e.finished_at AS finished_at
FROM episodes e LEFT JOIN (
    SELECT episode_id, COUNT(*) AS n_calls, SUM(prompt_tokens) AS prompt_tokens,
           SUM(output_tokens) AS output_tokens
    FROM invocations GROUP BY episode_id
) c ON c.episode_id = e.id
"""


def _drop_views() -> None:
    op.execute("DROP VIEW IF EXISTS episode_summary")
    op.execute("DROP VIEW IF EXISTS invocation_history")


def _create_views(extra: bool) -> None:
    op.execute(_HISTORY.format(extra=_EXTRA if extra else ""))
    op.execute(EPISODE_SUMMARY)


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("invocations") as batch:
        batch.add_column(sa.Column("sampled_context", sa.String(16), nullable=False, server_default="aligned"))
        batch.add_column(sa.Column("privileged_ids", BLOB, nullable=True))
        batch.add_column(sa.Column("parent_invocation_id", sa.String(64), nullable=True))
        batch.create_foreign_key(FK, "invocations", ["parent_invocation_id"], ["id"])
        batch.create_index(IX, ["parent_invocation_id"])
    _create_views(extra=True)


def _fold_privileged_ids() -> None:
    invocations = sa.table("invocations", sa.column("id", sa.String), sa.column("prompt_ids", BLOB),
                           sa.column("prompt_tokens", sa.Integer), sa.column("privileged_ids", BLOB))
    conn = op.get_bind()
    rows = conn.execute(sa.select(invocations.c.id, invocations.c.privileged_ids, invocations.c.prompt_ids)
                        .where(invocations.c.privileged_ids.is_not(None))).all()
    for ident, privileged, prompt in rows:
        ids = np.concatenate([np.frombuffer(bytes(privileged), "<i4"), np.frombuffer(bytes(prompt), "<i4")])
        conn.execute(invocations.update().where(invocations.c.id == ident)
                     .values(prompt_ids=ids.astype("<i4").tobytes(), prompt_tokens=int(ids.shape[0])))


def downgrade() -> None:
    _drop_views()
    _fold_privileged_ids()
    with op.batch_alter_table("invocations") as batch:
        batch.drop_index(IX)
        batch.drop_constraint(FK, type_="foreignkey")
        batch.drop_column("parent_invocation_id")
        batch.drop_column("privileged_ids")
        batch.drop_column("sampled_context")
    _create_views(extra=False)
