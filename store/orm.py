"""SQLAlchemy 2 ORM models: one declarative base, typed ``Mapped`` columns, a naming convention.

These models describe the schema for the repository functions; the schema itself is created and
changed only by the alembic migrations (which re-declare their tables instead of importing these).
A test checks that the migrated database and these models agree.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from store.types import Blob, JSONType, OrderedJSON, UTCDateTime

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, list[Any]: JSONType, bytes: Blob}


class RunRow(Base):
    __tablename__ = "runs"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(32))
    config: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(sa.String(32))
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(sa.Text)
    pid: Mapped[int | None]
    host: Mapped[str | None] = mapped_column(sa.String(255))
    heartbeat_at: Mapped[datetime | None]


class CheckpointRow(Base):
    __tablename__ = "checkpoints"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    parent_id: Mapped[str | None] = mapped_column(sa.ForeignKey("checkpoints.id"))
    step: Mapped[int]
    path: Mapped[str] = mapped_column(sa.Text)
    base_model: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime]


class EpisodeRow(Base):
    __tablename__ = "episodes"
    __table_args__ = (sa.UniqueConstraint("run_id", "task_id", "sample_index"), sa.Index(None, "run_id", "status"))
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    env: Mapped[str] = mapped_column(sa.String(64))
    task_id: Mapped[str] = mapped_column(sa.String(255))
    sample_index: Mapped[int]
    question: Mapped[str] = mapped_column(sa.Text)
    gold_answers: Mapped[list[Any]]
    evidence: Mapped[list[Any]]
    category: Mapped[str | None] = mapped_column(sa.String(64))
    prediction: Mapped[str | None] = mapped_column(sa.Text)
    reward: Mapped[float | None]
    f1: Mapped[float | None]
    em: Mapped[float | None]
    sub_em: Mapped[float | None]
    status: Mapped[str] = mapped_column(sa.String(32))
    stop_reason: Mapped[str | None] = mapped_column(sa.Text)
    error: Mapped[str | None] = mapped_column(sa.Text)
    n_chunks: Mapped[int]
    created_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    # leases (many rollout workers on one run): who may store this episode's calls, until when; claims so far
    lease_owner: Mapped[str | None] = mapped_column(sa.String(255))
    lease_expires_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(server_default="0")


class InvocationRow(Base):
    __tablename__ = "invocations"
    __table_args__ = (sa.UniqueConstraint("episode_id", "step"),)
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    episode_id: Mapped[str] = mapped_column(sa.ForeignKey("episodes.id"))
    step: Mapped[int]
    kind: Mapped[str] = mapped_column(sa.String(32))
    memory_policy: Mapped[str] = mapped_column(sa.String(64), server_default="overwrite")
    policy_version: Mapped[str | None] = mapped_column(sa.ForeignKey("checkpoints.id"), index=True)
    prompt_ids: Mapped[bytes]
    output_ids: Mapped[bytes]
    output_logprobs: Mapped[bytes | None]  # NULL: no sampler wrote the outputs (role 'oracle')
    role: Mapped[str] = mapped_column(sa.String(16), server_default="model")
    prompt_text: Mapped[str] = mapped_column(sa.Text)
    output_text: Mapped[str] = mapped_column(sa.Text)
    memory_before: Mapped[str] = mapped_column(sa.Text)
    memory_after: Mapped[str] = mapped_column(sa.Text)
    chunk_text: Mapped[str | None] = mapped_column(sa.Text)
    chunk_index: Mapped[int | None]
    prompt_tokens: Mapped[int]
    output_tokens: Mapped[int]
    finish_reason: Mapped[str] = mapped_column(sa.String(16))
    temperature: Mapped[float]
    latency_s: Mapped[float]
    created_at: Mapped[datetime]
    # which prompt sampled the outputs: 'aligned' (prompt_ids) or 'privileged' (privileged_ids + prompt_ids)
    sampled_context: Mapped[str] = mapped_column(sa.String(16), server_default="aligned")
    privileged_ids: Mapped[bytes | None]
    # ReOPD: the stored call a replay call branched from (its prompt_ids are that call's)
    parent_invocation_id: Mapped[str | None] = mapped_column(sa.ForeignKey("invocations.id"), index=True)


class MemoryLogRow(Base):
    """The ``log`` memory policy's episode log: one verbatim entry per row, in ``seq`` order."""

    __tablename__ = "memory_log"
    __table_args__ = (sa.UniqueConstraint("episode_id", "seq"),)
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    episode_id: Mapped[str] = mapped_column(sa.ForeignKey("episodes.id"))
    seq: Mapped[int]
    invocation_id: Mapped[str | None] = mapped_column(sa.ForeignKey("invocations.id"))
    source: Mapped[str] = mapped_column(sa.String(16))
    text: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[datetime]


class MemoryRow(Base):
    """A workflow memory a teacher (or the oracle) wrote from a successful episode, with its provenance."""

    __tablename__ = "memories"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    build_run_id: Mapped[str | None] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    source_run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"))
    source_episode_id: Mapped[str] = mapped_column(sa.ForeignKey("episodes.id"), index=True)
    source_invocation_ids: Mapped[list[Any]]
    writer: Mapped[str] = mapped_column(sa.String(512))
    env: Mapped[str] = mapped_column(sa.String(64))
    question: Mapped[str] = mapped_column(sa.Text)
    text: Mapped[str] = mapped_column(sa.Text)
    f1: Mapped[float | None]
    created_at: Mapped[datetime]


class TeacherScoreRow(Base):
    __tablename__ = "teacher_scores"
    __table_args__ = (sa.UniqueConstraint("invocation_id", "teacher", "context"),)
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    invocation_id: Mapped[str] = mapped_column(sa.ForeignKey("invocations.id"))
    teacher: Mapped[str] = mapped_column(sa.String(512))
    context: Mapped[str] = mapped_column(sa.String(32))
    n_tokens: Mapped[int]
    token_logprobs: Mapped[bytes]
    reverse_kl: Mapped[bytes]
    entropy: Mapped[bytes]
    mean_logprob: Mapped[float | None]
    mean_reverse_kl: Mapped[float | None]
    mean_entropy: Mapped[float | None]
    topk_path: Mapped[str | None] = mapped_column(sa.Text)
    topk_key: Mapped[str | None] = mapped_column(sa.String(255))
    temperature: Mapped[float] = mapped_column(server_default=sa.text("1.0"))
    created_at: Mapped[datetime]


class TrainStepRow(Base):
    __tablename__ = "train_steps"
    __table_args__ = (sa.UniqueConstraint("run_id", "step"),)
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"))
    step: Mapped[int]
    loss: Mapped[float]
    kd_loss: Mapped[float]
    rl_loss: Mapped[float]
    tokens: Mapped[int]
    lr: Mapped[float]
    seconds: Mapped[float]
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class EvalResultRow(Base):
    __tablename__ = "eval_results"
    id: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    run_id: Mapped[str] = mapped_column(sa.ForeignKey("runs.id"), index=True)
    checkpoint_id: Mapped[str | None] = mapped_column(sa.ForeignKey("checkpoints.id"))
    model: Mapped[str] = mapped_column(sa.Text)
    env: Mapped[str] = mapped_column(sa.String(64))
    step: Mapped[int | None]
    n_episodes: Mapped[int]
    f1: Mapped[float]
    em: Mapped[float]
    sub_em: Mapped[float]
    f1_lo: Mapped[float]
    f1_hi: Mapped[float]
    em_lo: Mapped[float]
    em_hi: Mapped[float]
    sub_em_lo: Mapped[float]
    sub_em_hi: Mapped[float]
    metrics: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]


class ServeCallRow(Base):
    """What a client sent with a call recorded by ``agentmem serve`` (one row per served invocation)."""

    __tablename__ = "serve_calls"
    invocation_id: Mapped[str] = mapped_column(sa.ForeignKey("invocations.id"), primary_key=True)
    messages: Mapped[list[Any] | None] = mapped_column(OrderedJSON)  # as sent: templates render key order
    tools: Mapped[list[Any] | None] = mapped_column(OrderedJSON)
    sampling: Mapped[dict[str, Any]]
    client: Mapped[dict[str, Any]]
    prompt_logprobs: Mapped[bytes | None]
    # False: ids tokenized locally from a provider's text (no sampled ids or log-probs): SFT data, not OPD's
    replayable: Mapped[bool] = mapped_column(server_default=sa.true())
    created_at: Mapped[datetime]
