"""Run liveness (runs.error, pid, host, heartbeat_at), invocations.memory_policy,
teacher_scores.temperature; invocation_history shows memory_policy.

Both views are dropped first and recreated last: SQLite cannot drop (or batch-copy) a column a view
uses, and Postgres refuses to drop a column a view depends on.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
TS = sa.DateTime(timezone=True)

_HISTORY_COLUMNS = """
       i.step AS step, i.kind AS kind, {memory_policy}i.id AS invocation_id,
       i.prompt_text AS prompt_text, i.output_text AS output_text,
       i.memory_before AS memory_before, i.memory_after AS memory_after,
       i.chunk_index AS chunk_index, i.prompt_tokens AS prompt_tokens, i.output_tokens AS output_tokens,
       i.policy_version AS policy_version, i.finish_reason AS finish_reason, i.latency_s AS latency_s,
       i.created_at AS created_at
"""


def _invocation_history(memory_policy: bool) -> str:
    columns = _HISTORY_COLUMNS.format(memory_policy="i.memory_policy AS memory_policy, " if memory_policy else "")
    return (
        "CREATE VIEW invocation_history AS\n"
        "SELECT e.run_id AS run_id, i.episode_id AS episode_id, e.task_id AS task_id, e.sample_index AS sample,"
        f"{columns}FROM invocations i JOIN episodes e ON e.id = i.episode_id\n"
    )


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


def _create_views(memory_policy: bool) -> None:
    op.execute(_invocation_history(memory_policy))
    op.execute(EPISODE_SUMMARY)


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("error", sa.Text, nullable=True))
        batch.add_column(sa.Column("pid", sa.Integer, nullable=True))
        batch.add_column(sa.Column("host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("heartbeat_at", TS, nullable=True))
    with op.batch_alter_table("invocations") as batch:
        batch.add_column(sa.Column("memory_policy", sa.String(64), nullable=False, server_default="overwrite"))
    with op.batch_alter_table("teacher_scores") as batch:
        batch.add_column(sa.Column("temperature", sa.Float, nullable=False, server_default=sa.text("1.0")))
    _create_views(memory_policy=True)


def downgrade() -> None:
    _drop_views()
    with op.batch_alter_table("teacher_scores") as batch:
        batch.drop_column("temperature")
    with op.batch_alter_table("invocations") as batch:
        batch.drop_column("memory_policy")
    with op.batch_alter_table("runs") as batch:
        for column in ("heartbeat_at", "host", "pid", "error"):
            batch.drop_column(column)
    _create_views(memory_policy=False)
