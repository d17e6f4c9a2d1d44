"""``agentmem memories build``'s config: ``MemoriesConfig``."""

from __future__ import annotations

from pydantic import Field

from agentmem.config.base import Frozen
from agentmem.config.choices import BackendKind, DType

# the writer that needs no model: a deterministic template over the episode's calls
ORACLE_WRITER = "oracle"


class MemoriesConfig(Frozen):
    """Workflow memories written from a run's successful episodes (AMD, DuoMem): the source run, the success
    threshold and the writer."""

    run: str
    """Source run id: a teacher's (or the oracle's) rollout run."""
    min_f1: float = Field(1.0, ge=0, le=1)
    """Write from episodes with F1 >= this."""
    writer: str = ORACLE_WRITER
    """Who writes: 'oracle' (a deterministic template) or a model (folder, checkpoint id or 'default')."""
    backend: BackendKind = BackendKind.transformers
    """Generation backend of a model writer."""
    dtype: DType = DType.float32
    """Model writer weights dtype."""
    max_new_tokens: int = Field(128, ge=1)
    """Longest memory a model writer writes, in tokens."""
    batch: int = Field(8, ge=1)
    """Episodes a model writer writes for in one backend batch."""
