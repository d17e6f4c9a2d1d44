"""Pack rebuilt sequences into row batches and run a model over them, returning logits at the action
positions only, per invocation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedModel

from agentmem.replay import PackingStats, Row, pack
from agentmem.replay import Sequence as Rebuilt
from agentmem.training.collate import PackedBatch, collate_rows
from agentmem.training.packed_attention import Path, action_logits


@dataclass(frozen=True)
class RowBatches:
    batches: list[list[Row]]
    stats: PackingStats


def row_batches(sequences: Sequence[Rebuilt], row_tokens: int, rows_per_batch: int = 1,
                truncate: Literal["error", "left"] = "error") -> RowBatches:
    rows, stats = pack(sequences, row_tokens, truncate=truncate)
    return RowBatches([rows[i : i + rows_per_batch] for i in range(0, len(rows), rows_per_batch)], stats)


def split_actions(batch: PackedBatch, values: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Split a tensor with one leading entry per action into per-invocation slices."""
    return zip(batch.invocation_ids, torch.split(values, list(batch.action_counts)), strict=True)


def invocation_action_logits(model: PreTrainedModel, batch: PackedBatch, vocab: int,
                             path: Path = "fast") -> torch.Tensor:
    """Logits ``[A, vocab]`` at the batch's action positions, in ``batch.action_ids`` order, cut to the
    tokenizer's vocabulary (drops rows of an embedding padded past it)."""
    return action_logits(model, batch, path)[:, :vocab]


def collate(rows: list[Row], pad_id: int, device: torch.device) -> PackedBatch:
    return collate_rows(rows, pad_id).to(device)
