"""Calls without sampler log-probs: invocations.output_logprobs nullable (NULL: no sampler wrote the
outputs) and invocations.role ('model' or 'oracle', default 'model'); invocation_history shows role.

Both views are dropped first and recreated last (see 0002). The downgrade cannot store NULL log-probs:
it writes them as float32 NaN, one per output token (what replay rebuilds a NULL into), then drops role.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10
"""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
BLOB = sa.LargeBinary()

_HISTORY = """
CREATE VIEW invocation_history AS
SELECT e.run_id AS run_id, i.episode_id AS episode_id, e.task_id AS task_id, e.sample_index AS sample,
       i.step AS step, i.kind AS kind, i.memory_policy AS memory_policy, {role}i.id AS invocation_id,
       i.prompt_text AS prompt_text, i.output_text AS output_text,
       i.memory_before AS memory_before, i.memory_after AS memory_after,
       i.chunk_index AS chunk_index, i.prompt_tokens AS prompt_tokens, i.output_tokens AS output_tokens,
       i.policy_version AS policy_version, i.finish_reason AS finish_reason, i.latency_s AS latency_s,
       i.created_at AS created_at
FROM invocations i JOIN episodes e ON e.id = i.episode_id
"""

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


def _create_views(role: bool) -> None:
    op.execute(_HISTORY.format(role="i.role AS role, " if role else ""))
    op.execute(EPISODE_SUMMARY)


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("invocations") as batch:
        batch.alter_column("output_logprobs", existing_type=BLOB, nullable=True)
        batch.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="model"))
    _create_views(role=True)


def _nan_logprobs() -> None:
    invocations = sa.table("invocations", sa.column("id", sa.String), sa.column("output_tokens", sa.Integer),
                           sa.column("output_logprobs", BLOB))
    conn = op.get_bind()
    rows = conn.execute(sa.select(invocations.c.id, invocations.c.output_tokens)
                        .where(invocations.c.output_logprobs.is_(None))).all()
    for ident, n in rows:
        nan = np.full(n, np.nan, dtype="<f4").tobytes()
        conn.execute(invocations.update().where(invocations.c.id == ident).values(output_logprobs=nan))


def downgrade() -> None:
    _drop_views()
    _nan_logprobs()
    with op.batch_alter_table("invocations") as batch:
        batch.drop_column("role")
        batch.alter_column("output_logprobs", existing_type=BLOB, nullable=False)
    _create_views(role=False)
