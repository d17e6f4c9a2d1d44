"""ReOPD's replay rollout: ``ReplayConfig``."""

from __future__ import annotations

from pydantic import Field

from agentmem.config.base import Frozen
from agentmem.config.choices import BackendKind, DType


class ReplayConfig(Frozen):
    """ReOPD's replay rollout (``agentmem rollout --replay-from RUN``): for every episode of the stored
    ``teacher_run`` one step ``t`` is drawn with probability ``kappa**t / sum_s kappa**s`` (seeded by
    ``seed``), and the student ``model`` samples that call ``group_size`` times from the teacher's stored
    prompt ids (which hold the teacher's memory), with the teacher run's token limits. No environment is
    stepped. Stored as a run of kind ``replay``; its calls carry no reward."""

    teacher_run: str
    model: str = "default"
    backend: BackendKind = BackendKind.transformers
    dtype: DType = DType.float32
    group_size: int = Field(1, ge=1)
    kappa: float = Field(0.6, gt=0)
    """ReOPD: decay of the branch-step distribution P(t) ∝ kappa^t (with --replay-from)."""
    seed: int = Field(0, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_batch: int = Field(8, ge=1)

