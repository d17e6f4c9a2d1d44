"""Pack rebuilt sequences into rows of a fixed token budget (best-fit decreasing), without padding.

Invariants:
- a row holds whole sequences, at most ``row_tokens`` tokens in all; positions restart at 0 in every
  segment and ``cu_seqlens`` marks the boundaries, so a consumer can block attention across them;
- deterministic: sequences are placed longest first, ties by arrival order, each into the fullest row that
  still fits it (ties: the earliest row); inside a row, segments keep their arrival order;
- a sequence over the budget is handled as ``over_budget`` says: ``"error"`` (the default) raises naming
  it, its length and the budget; ``"skip"`` leaves it out and counts it (``PackingStats.skipped_ids``): the
  student side, which is never cut; ``"left"`` cuts prompt tokens from the left, never an action token or
  the prompt token that predicts the first action: the teacher side only, counted.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from agentmem.replay.errors import ReplayError
from agentmem.replay.rebuild import Sequence

OverBudget = Literal["error", "skip", "left"]


@dataclass(frozen=True)
class Row:
    """One packed row. Token arrays have the row's real length (no padding); ``cu_seqlens`` is
    ``[0, l1, l1+l2, ...]``; ``action_ids`` / ``sampler_logprobs`` are the segments' actions concatenated
    in row order, one per True in ``action_mask``."""

    input_ids: np.ndarray  # int32 [n]
    position_ids: np.ndarray  # int32 [n]
    cu_seqlens: np.ndarray  # int32 [segments + 1]
    action_mask: np.ndarray  # bool [n]
    invocation_ids: tuple[str, ...]
    action_ids: np.ndarray  # int32 [actions]
    sampler_logprobs: np.ndarray  # float32 [actions]

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_lens(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)


@dataclass(frozen=True)
class PackingStats:
    rows: int
    sequences: int
    tokens: int  # real tokens in all rows
    row_tokens: int
    truncated_sequences: int = 0
    truncated_tokens: int = 0
    skipped_ids: tuple[str, ...] = ()  # sequences over the budget left out (``over_budget="skip"``)
    skipped_tokens: int = 0

    @property
    def skipped_sequences(self) -> int:
        return len(self.skipped_ids)

    @property
    def fill(self) -> float:
        """Real tokens over the rows' capacity, ``tokens / (rows * row_tokens)``."""
        return self.tokens / (self.rows * self.row_tokens) if self.rows else 0.0


def truncate_left(seq: Sequence, budget: int) -> Sequence:
    """Cut prompt tokens from the left so ``seq`` fits ``budget``; positions restart at 0."""
    cut = len(seq) - budget
    if cut <= 0:
        return seq
    first_action = int(np.argmax(seq.action_mask)) if seq.num_actions else len(seq)
    if cut > first_action:
        raise ReplayError(
            f"invocation {seq.invocation_id}: its {seq.num_actions} action tokens plus the prompt token before "
            f"them ({len(seq) - first_action} tokens) exceed the row budget of {budget}"
        )
    return replace(
        seq,
        input_ids=seq.input_ids[cut:],
        position_ids=np.arange(budget, dtype=np.int32),
        action_mask=seq.action_mask[cut:],
        truncated_tokens=seq.truncated_tokens + cut,
    )


def _row(segments: list[Sequence]) -> Row:
    return Row(
        input_ids=np.concatenate([s.input_ids for s in segments]).astype(np.int32),
        position_ids=np.concatenate([s.position_ids for s in segments]).astype(np.int32),
        cu_seqlens=np.concatenate([[0], np.cumsum([len(s) for s in segments])]).astype(np.int32),
        action_mask=np.concatenate([s.action_mask for s in segments]),
        invocation_ids=tuple(s.invocation_id for s in segments),
        action_ids=np.concatenate([s.action_ids for s in segments]).astype(np.int32),
        sampler_logprobs=np.concatenate([s.sampler_logprobs for s in segments]).astype(np.float32),
    )


def pack(
    sequences: Iterable[Sequence],
    row_tokens: int,
    *,
    over_budget: OverBudget = "error",
) -> tuple[list[Row], PackingStats]:
    """Best-fit decreasing of ``sequences`` into rows of at most ``row_tokens`` tokens (``over_budget``: see
    the module docstring)."""
    if row_tokens <= 0:
        raise ReplayError(f"row_tokens must be positive, got {row_tokens}")
    if over_budget not in ("error", "skip", "left"):
        raise ReplayError(f"over_budget must be 'error', 'skip' or 'left', got {over_budget!r}")
    seqs: list[Sequence] = []
    skipped: list[str] = []
    truncated_seqs = truncated = skipped_tokens = 0
    for seq in sequences:
        if len(seq) > row_tokens and over_budget == "error":
            raise ReplayError(
                f"invocation {seq.invocation_id}: {len(seq)} tokens ({len(seq) - seq.num_actions} context + "
                f"{seq.num_actions} actions) exceed the row budget of {row_tokens}"
            )
        if len(seq) > row_tokens and over_budget == "skip":
            skipped.append(seq.invocation_id)
            skipped_tokens += len(seq)
            continue
        if len(seq) > row_tokens:
            truncated_seqs += 1
            truncated += len(seq) - row_tokens
            seq = truncate_left(seq, row_tokens)
        seqs.append(seq)

    members: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (tokens left, row index), sorted: best fit = first entry that fits
    for i in sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), i)):
        n = len(seqs[i])
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            left, row = free.pop(at)
        else:
            left, row = row_tokens, len(members)
            members.append([])
        members[row].append(i)
        bisect.insort(free, (left - n, row))

    rows = [_row([seqs[i] for i in sorted(m)]) for m in members]
    stats = PackingStats(
        rows=len(rows),
        sequences=len(seqs),
        tokens=sum(len(s) for s in seqs),
        row_tokens=row_tokens,
        truncated_sequences=truncated_seqs,
        truncated_tokens=truncated,
        skipped_ids=tuple(skipped),
        skipped_tokens=skipped_tokens,
    )
    return rows, stats
