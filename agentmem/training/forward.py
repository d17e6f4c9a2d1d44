"""The one pack -> collate -> forward path shared by scoring, distillation and every teacher.

``plan`` packs rebuilt sequences into batches of rows (``replay.pack``: whole sequences, positions
restarting per segment, over-budget handling named explicitly; with ``Packing.shared_prefix`` the
calls of one ``Sequence.group`` share their common prompt prefix, placed and computed once); a
``PackedModel`` collates rows onto its device and returns logits at the action positions only, per
invocation, cut to the tokenizer's vocabulary. Scoring, the online teacher, the frozen anchor reference
and the student's training forward all go through ``PackedModel.action_logits``, so a packed row means
the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentmem.config import AttentionPath, Packing
from agentmem.replay import OverBudget, PackingStats, Row, pack
from agentmem.replay import Sequence as Rebuilt
from agentmem.runtime import CPU, Runtime
from agentmem.training.collate import PackedBatch, collate_rows
from agentmem.training.lora import base_model
from agentmem.training.packed_attention import action_logits
from agentmem.training.vocab import vocab_size


@dataclass(frozen=True)
class RowBatches:
    """Packed rows grouped ``rows_per_batch`` at a time (one forward pass each), and the packing stats."""

    batches: list[list[Row]]
    stats: PackingStats

    @property
    def rows(self) -> list[Row]:
        return [r for b in self.batches for r in b]


def plan(sequences: Sequence[Rebuilt], row_tokens: int, rows_per_batch: int = 1,
         over_budget: OverBudget = "error", packing: Packing = Packing.segments) -> RowBatches:
    rows, stats = pack(sequences, row_tokens, over_budget=over_budget,
                       shared_prefix=Packing(packing) is Packing.shared_prefix)
    return RowBatches([rows[i : i + rows_per_batch] for i in range(0, len(rows), rows_per_batch)], stats)


def split_actions(batch: PackedBatch, values: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Split a tensor with one leading entry per action into per-invocation slices."""
    return zip(batch.invocation_ids, torch.split(values, list(batch.action_counts)), strict=True)


@dataclass(frozen=True)
class PackedModel:
    """A causal LM with what it takes to run packed rows: its vocabulary (logits are cut to it, dropping
    rows of an embedding padded past the tokenizer), its pad id, the attention path and the device every
    batch is moved to."""

    model: PreTrainedModel
    vocab: int
    pad_id: int
    path: AttentionPath = AttentionPath.fast
    device: str = "cpu"

    @classmethod
    def create(cls, model: PreTrainedModel | torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
               path: AttentionPath | str = AttentionPath.fast, runtime: Runtime = CPU) -> PackedModel:
        """``model``: a transformers model, or one wrapped with LoRA adapters (peft), of which the packed
        forward runs the transformers model inside: the adapters are injected into it, so they apply."""
        model = base_model(model)
        return cls(model, vocab_size(model, tokenizer), tokenizer.pad_token_id or 0, AttentionPath(path),
                   runtime.device)

    def collate(self, rows: Sequence[Row]) -> PackedBatch:
        return collate_rows(rows, self.pad_id).to(self.device)

    def action_logits(self, batch: PackedBatch) -> torch.Tensor:
        """Float32 logits ``[A, vocab]`` at the batch's actions, in ``batch.action_ids`` order (gradient as
        the caller's mode allows)."""
        return action_logits(self.model, batch, self.path)[:, : self.vocab].float()

    def logits_by_invocation(self, batches: Sequence[Sequence[Row]]) -> dict[str, torch.Tensor]:
        """Without gradient: ``{invocation id: [O, vocab]}`` float32 logits, one forward pass per batch."""
        out: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            for rows in batches:
                batch = self.collate(rows)
                out.update((k, v.clone()) for k, v in split_actions(batch, self.action_logits(batch)))
        return out
