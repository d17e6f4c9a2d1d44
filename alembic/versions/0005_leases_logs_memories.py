"""Episode leases (many rollout workers on one run), the programmatic memory log, teacher-written memories.

- ``episodes.lease_owner`` (nullable), ``lease_expires_at`` (nullable) and ``attempts`` (default 0): a
  rollout run's episodes are work items; a worker claims an episode (``FOR UPDATE SKIP LOCKED`` on
  Postgres), renews its lease while it works, and only the owner of a live lease may store the episode's
  calls. ``attempts`` counts the claims; after the run's limit an episode is marked failed. An index on
  (run_id, status) serves the claim query.
- ``memory_log``: the ``log`` memory policy's episode log (PRO-LONG), one row per entry, appended verbatim:
  (episode_id, seq) is unique, ``invocation_id`` is the call that appended it, ``source`` says what it is
  (``chunk`` or ``note``). Reads of the log (searches) are never written here.
- ``memories``: workflow memories written by a teacher (or the oracle) from a successful episode, with
  provenance: the build run, the source episode and the source invocations (a JSON list of ids).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
TS = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
IX_CLAIM = "ix_episodes_run_id_status"

# The views are dropped first and recreated last (see 0002): SQLite may copy the episodes table.
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


def _create_views() -> None:
    op.execute(_HISTORY.format(extra=_EXTRA))
    op.execute(EPISODE_SUMMARY)




def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("episodes") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(255), nullable=True))
        batch.add_column(sa.Column("lease_expires_at", TS, nullable=True))
        batch.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch.create_index(IX_CLAIM, ["run_id", "status"])
    _create_views()
    op.create_table(
        "memory_log",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("invocation_id", sa.String(64), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.id"], name="fk_memory_log_episode_id_episodes"),
        sa.ForeignKeyConstraint(["invocation_id"], ["invocations.id"],
                                name="fk_memory_log_invocation_id_invocations"),
        sa.PrimaryKeyConstraint("id", name="pk_memory_log"),
        sa.UniqueConstraint("episode_id", "seq", name="uq_memory_log_episode_id_seq"),
    )
    op.create_table(
        "memories",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("build_run_id", sa.String(64), nullable=True),
        sa.Column("source_run_id", sa.String(64), nullable=False),
        sa.Column("source_episode_id", sa.String(64), nullable=False),
        sa.Column("source_invocation_ids", JSON, nullable=False),
        sa.Column("writer", sa.String(512), nullable=False),
        sa.Column("env", sa.String(64), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("f1", sa.Float(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(["build_run_id"], ["runs.id"], name="fk_memories_build_run_id_runs"),
        sa.ForeignKeyConstraint(["source_run_id"], ["runs.id"], name="fk_memories_source_run_id_runs"),
        sa.ForeignKeyConstraint(["source_episode_id"], ["episodes.id"],
                                name="fk_memories_source_episode_id_episodes"),
        sa.PrimaryKeyConstraint("id", name="pk_memories"),
    )
    op.create_index("ix_memories_build_run_id", "memories", ["build_run_id"])
    op.create_index("ix_memories_source_episode_id", "memories", ["source_episode_id"])


def downgrade() -> None:
    op.drop_index("ix_memories_source_episode_id", table_name="memories")
    op.drop_index("ix_memories_build_run_id", table_name="memories")
    op.drop_table("memories")
    op.drop_table("memory_log")
    _drop_views()
    with op.batch_alter_table("episodes") as batch:
        batch.drop_index(IX_CLAIM)
        batch.drop_column("attempts")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
    _create_views()
