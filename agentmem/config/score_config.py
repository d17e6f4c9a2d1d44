"""Teacher scoring of stored calls: ``ScoreConfig``."""

from __future__ import annotations

from pydantic import Field, model_validator

from agentmem.config.base import Frozen, Kinds, PackedPath, RowLayout
from agentmem.config.choices import AttentionPath, DType, Packing, TeacherTruncation
from agentmem.records import TeacherContext


class ScoreConfig(Frozen):
    """Teacher scoring of stored calls. ``temperature`` is the one temperature of both distributions in
    the stored divergence (the project's convention: KL(student_T || teacher_T), T = 1 by default, the
    same as distill's), stored with every score row."""

    run_ids: list[str] = Field(min_length=1)
    """Rollout run id(s) to score."""
    teacher: str = "default"
    """Teacher: model folder, checkpoint id or 'default'."""
    student: str | None = None
    """Student model; adds the per-token reverse KL KL(student_T || teacher_T) at --temperature."""
    context: TeacherContext = TeacherContext.aligned
    """Teacher context: aligned (the student's own state) | persistent (earlier calls concatenated as stored)
    | persistent_chat (the episode as one multi-turn chat) | privileged."""
    kinds: Kinds = None
    """Only these call kinds (e.g. memory_update, answer, or a memory policy's own kinds). Default: all."""
    row_tokens: int = Field(4096, ge=16)
    """Tokens per packed row (hard cap)."""
    rows_per_batch: int = Field(1, ge=1)
    """Packed rows per forward pass."""
    topk: int = Field(0, ge=0)
    """Also write the teacher's top-K log-probs to safetensors shards."""
    topk_dir: str = "agentmem_topk"
    """Folder for the top-K shards."""
    path: PackedPath = AttentionPath.fast
    # shared_prefix: the same scores (exact up to float round-off, tested), a group's prefix computed once
    packing: RowLayout = Packing.shared_prefix
    teacher_truncation: TeacherTruncation = TeacherTruncation.error
    """A teacher context longer than --row-tokens: error, or left (cut from the left; counted and shown)."""
    dtype: DType = DType.float32
    """Teacher/student weights dtype."""
    temperature: float = Field(1.0, gt=0)
    """Temperature of both distributions (stored per row)."""
    # context privileged: a JSONL of {task_id, answers, text} for episodes stored without privileged context
    privileged_file: str | None = None
    """With --context privileged: a JSONL of {"task_id", "answers", "text"} giving the privileged context of
    episodes stored without one (e.g. an `agentmem serve` run)."""

    @model_validator(mode="after")
    def _privileged_file(self) -> ScoreConfig:
        if self.privileged_file is not None and self.context is not TeacherContext.privileged:
            raise ValueError("--privileged-file is the privileged context's: give --context privileged")
        return self
