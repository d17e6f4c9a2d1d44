"""Memory policies: how an update call's output becomes the next memory.

The seam is ``MemoryPolicy.update``; ``OverwritePolicy`` (the default) makes the whole output of the last
update call the memory, cut to a token budget. Structured, hierarchical or retrieval-backed policies
plug in behind the same method.
"""

from __future__ import annotations

from typing import Protocol

from transformers import PreTrainedTokenizerBase


class MemoryPolicy(Protocol):
    name: str

    def update(self, memory_before: str, output_ids: list[int]) -> str:
        """The memory after an update call that produced ``output_ids``."""
        ...


class OverwritePolicy:
    """New memory = the update call's output (special tokens dropped), cut to ``memory_tokens`` tokens."""

    name = "overwrite"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, memory_tokens: int):
        if memory_tokens < 1:
            raise ValueError(f"memory_tokens must be >= 1, got {memory_tokens}")
        self.tokenizer = tokenizer
        self.memory_tokens = memory_tokens

    def update(self, memory_before: str, output_ids: list[int]) -> str:
        special = set(self.tokenizer.all_special_ids)
        kept = [t for t in output_ids if t not in special][: self.memory_tokens]
        return self.tokenizer.decode(kept, skip_special_tokens=True).strip()


MEMORY_POLICIES = {"overwrite": OverwritePolicy}
