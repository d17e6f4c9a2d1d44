"""Initial schema: runs, checkpoints, episodes, invocations, teacher_scores, train_steps, eval_results,
and the inspection views invocation_history and episode_summary.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Re-declared here on purpose: a migration must not change when the live models do.
TS = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BLOB = sa.LargeBinary().with_variant(postgresql.BYTEA(), "postgresql")
ID = sa.String(64)

INVOCATION_HISTORY = """
CREATE VIEW invocation_history AS
SELECT e.run_id AS run_id, i.episode_id AS episode_id, e.task_id AS task_id, e.sample_index AS sample,
       i.step AS step, i.kind AS kind, i.id AS invocation_id,
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


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", ID, primary_key=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("runs.id", name="fk_checkpoints_run_id_runs"), nullable=True),
        sa.Column("parent_id", ID, sa.ForeignKey("checkpoints.id", name="fk_checkpoints_parent_id_checkpoints"),
                  nullable=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("base_model", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_checkpoints_run_id", "checkpoints", ["run_id"])
    op.create_table(
        "episodes",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("runs.id", name="fk_episodes_run_id_runs"), nullable=False),
        sa.Column("env", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("sample_index", sa.Integer, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("gold_answers", JSON, nullable=False),
        sa.Column("evidence", JSON, nullable=False),
        sa.Column("category", sa.String(64), nullable=True),
        sa.Column("prediction", sa.Text, nullable=True),
        sa.Column("reward", sa.Float, nullable=True),
        sa.Column("f1", sa.Float, nullable=True),
        sa.Column("em", sa.Float, nullable=True),
        sa.Column("sub_em", sa.Float, nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("stop_reason", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("n_chunks", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.UniqueConstraint("run_id", "task_id", "sample_index", name="uq_episodes_run_id_task_id_sample_index"),
    )
    op.create_index("ix_episodes_run_id", "episodes", ["run_id"])
    op.create_table(
        "invocations",
        sa.Column("id", ID, primary_key=True),
        sa.Column("episode_id", ID, sa.ForeignKey("episodes.id", name="fk_invocations_episode_id_episodes"),
                  nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("policy_version", ID,
                  sa.ForeignKey("checkpoints.id", name="fk_invocations_policy_version_checkpoints"), nullable=True),
        sa.Column("prompt_ids", BLOB, nullable=False),
        sa.Column("output_ids", BLOB, nullable=False),
        sa.Column("output_logprobs", BLOB, nullable=False),
        sa.Column("prompt_text", sa.Text, nullable=False),
        sa.Column("output_text", sa.Text, nullable=False),
        sa.Column("memory_before", sa.Text, nullable=False),
        sa.Column("memory_after", sa.Text, nullable=False),
        sa.Column("chunk_text", sa.Text, nullable=True),
        sa.Column("chunk_index", sa.Integer, nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("finish_reason", sa.String(16), nullable=False),
        sa.Column("temperature", sa.Float, nullable=False),
        sa.Column("latency_s", sa.Float, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("episode_id", "step", name="uq_invocations_episode_id_step"),
    )
    op.create_index("ix_invocations_policy_version", "invocations", ["policy_version"])
    op.create_table(
        "teacher_scores",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("runs.id", name="fk_teacher_scores_run_id_runs"), nullable=True),
        sa.Column("invocation_id", ID,
                  sa.ForeignKey("invocations.id", name="fk_teacher_scores_invocation_id_invocations"), nullable=False),
        sa.Column("teacher", sa.String(512), nullable=False),
        sa.Column("context", sa.String(32), nullable=False),
        sa.Column("n_tokens", sa.Integer, nullable=False),
        sa.Column("token_logprobs", BLOB, nullable=False),
        sa.Column("reverse_kl", BLOB, nullable=False),
        sa.Column("entropy", BLOB, nullable=False),
        sa.Column("mean_logprob", sa.Float, nullable=True),
        sa.Column("mean_reverse_kl", sa.Float, nullable=True),
        sa.Column("mean_entropy", sa.Float, nullable=True),
        sa.Column("topk_path", sa.Text, nullable=True),
        sa.Column("topk_key", sa.String(255), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("invocation_id", "teacher", "context", name="uq_teacher_scores_invocation_id_teacher_context"),
    )
    op.create_index("ix_teacher_scores_run_id", "teacher_scores", ["run_id"])
    op.create_table(
        "train_steps",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("runs.id", name="fk_train_steps_run_id_runs"), nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("loss", sa.Float, nullable=False),
        sa.Column("kd_loss", sa.Float, nullable=False),
        sa.Column("rl_loss", sa.Float, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("lr", sa.Float, nullable=False),
        sa.Column("seconds", sa.Float, nullable=False),
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("run_id", "step", name="uq_train_steps_run_id_step"),
    )
    op.create_table(
        "eval_results",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("runs.id", name="fk_eval_results_run_id_runs"), nullable=False),
        sa.Column("checkpoint_id", ID,
                  sa.ForeignKey("checkpoints.id", name="fk_eval_results_checkpoint_id_checkpoints"), nullable=True),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("env", sa.String(64), nullable=False),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("n_episodes", sa.Integer, nullable=False),
        *[sa.Column(name, sa.Float, nullable=False) for name in
          ("f1", "em", "sub_em", "f1_lo", "f1_hi", "em_lo", "em_hi", "sub_em_lo", "sub_em_hi")],
        sa.Column("metrics", JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_eval_results_run_id", "eval_results", ["run_id"])
    op.execute(INVOCATION_HISTORY)
    op.execute(EPISODE_SUMMARY)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS episode_summary")
    op.execute("DROP VIEW IF EXISTS invocation_history")
    for table in ("eval_results", "train_steps", "teacher_scores", "invocations", "episodes", "checkpoints", "runs"):
        op.drop_table(table)
