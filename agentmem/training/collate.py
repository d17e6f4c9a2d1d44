"""Collate packed rows (``agentmem.replay.Row``) into one batch of tensors.

Invariant: the real tokens of the batch, read row-major (``input_ids[token_mask]``), are the segments in
row order; ``cu_seqlens`` marks their boundaries in that flat layout (the flash-attention varlen layout),
and ``action_mask[token_mask]`` picks the actions in the order of ``action_ids``. A "segment" here is a
row's block (``Row.cu_seqlens``): a whole invocation, or in the shared-prefix layout a shared prefix or
one invocation's suffix; ``prefix_blocks`` says which prefix block each block also attends to.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np
import torch

from agentmem.replay import Row


@dataclass(frozen=True)
class PackedBatch:
    """Rows padded on the right to the longest row, plus the unpadded segment layout.

    Two rows, ``[a0 a1 a2 | b0 b1]`` (a: prompt 2 + 1 action, b: prompt 1 + 1 action) and ``[c0 c1 c2]``
    (prompt 2 + 1 action), ``pad_id=0``::

        input_ids        [[a0, a1, a2, b0, b1], [c0, c1, c2, 0, 0]]
        position_ids     [[0, 1, 2, 0, 1],      [0, 1, 2, 0, 1]]       # padding counts from 0 too
        token_mask       [[T, T, T, T, T],      [T, T, T, F, F]]
        action_mask      [[F, T, F, T, F],      [F, T, F, F, F]]
        segment_ids      [[0, 0, 0, 1, 1],      [2, 2, 2, -2, -2]]     # padding: -(row + 1)
        cu_seqlens       [0, 3, 5, 8]           # int32, over input_ids[token_mask]
        seq_lens         [3, 2, 3]
        max_seqlen       3
        action_ids       [a2, b1, c2]           # int64
        sampler_logprobs [...]                  # float32, one per action
        invocation_ids   ("a", "b", "c");  action_counts (1, 1, 1)
        prefix_blocks   None                   # segments layout

    Shared-prefix layout (``Row.prefix_block`` set in some row): ``prefix_blocks`` is int64 ``[S]``, the global
    index of the prefix block each block attends to before itself, or -1; prefix blocks hold no invocation,
    so ``invocation_ids`` / ``action_counts`` list the other blocks only, in row order.
    """

    input_ids: torch.Tensor  # int64 [B, T]
    position_ids: torch.Tensor  # int64 [B, T]
    token_mask: torch.Tensor  # bool [B, T]
    action_mask: torch.Tensor  # bool [B, T]
    segment_ids: torch.Tensor  # int64 [B, T]
    cu_seqlens: torch.Tensor  # int32 [S + 1]
    seq_lens: torch.Tensor  # int32 [S]
    max_seqlen: int
    action_ids: torch.Tensor  # int64 [A]
    sampler_logprobs: torch.Tensor  # float32 [A]
    invocation_ids: tuple[str, ...]
    action_counts: tuple[int, ...]
    prefix_blocks: torch.Tensor | None = None  # int64 [S]

    @property
    def num_tokens(self) -> int:
        return int(self.seq_lens.sum())

    def to(self, device: torch.device | str) -> PackedBatch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        return PackedBatch(**moved)


def collate_rows(rows: Seq[Row], pad_id: int) -> PackedBatch:
    if not rows:
        raise ValueError("collate_rows needs at least one row")
    width = max(len(r) for r in rows)
    shape = (len(rows), width)
    input_ids: np.ndarray = np.full(shape, pad_id, np.int64)
    position_ids = np.tile(np.arange(width, dtype=np.int64), (len(rows), 1))
    token_mask: np.ndarray = np.zeros(shape, bool)
    action_mask: np.ndarray = np.zeros(shape, bool)
    segment_ids: np.ndarray = np.zeros(shape, np.int64)
    first_segment = 0
    for b, row in enumerate(rows):
        n = len(row)
        input_ids[b, :n] = row.input_ids
        position_ids[b, :n] = row.position_ids
        position_ids[b, n:] -= n
        token_mask[b, :n] = True
        action_mask[b, :n] = row.action_mask
        segment_ids[b, :n] = first_segment + np.repeat(np.arange(len(row.seq_lens)), row.seq_lens)
        segment_ids[b, n:] = -(b + 1)
        first_segment += len(row.seq_lens)
    seq_lens = np.concatenate([r.seq_lens for r in rows]).astype(np.int32)
    action_counts = [  # per invocation block (a shared prefix holds none)
        int(n) for r in rows
        for n in np.add.reduceat(r.action_mask.astype(np.int64), r.cu_seqlens[:-1])[r.invocation_blocks]
    ]
    prefix_blocks = None
    if any(r.prefix_block is not None for r in rows):
        offsets = np.cumsum([0] + [len(r.seq_lens) for r in rows])[:-1]
        prefix_blocks = torch.from_numpy(np.concatenate([
            np.where(r.prefix_block >= 0, r.prefix_block + o, -1) if r.prefix_block is not None else np.full(len(r.seq_lens), -1)
            for r, o in zip(rows, offsets, strict=True)
        ]).astype(np.int64))
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        position_ids=torch.from_numpy(position_ids),
        token_mask=torch.from_numpy(token_mask),
        action_mask=torch.from_numpy(action_mask),
        segment_ids=torch.from_numpy(segment_ids),
        cu_seqlens=torch.from_numpy(np.concatenate([[0], np.cumsum(seq_lens)]).astype(np.int32)),
        seq_lens=torch.from_numpy(seq_lens),
        max_seqlen=int(seq_lens.max()),
        action_ids=torch.from_numpy(np.concatenate([r.action_ids for r in rows]).astype(np.int64)),
        sampler_logprobs=torch.from_numpy(np.concatenate([r.sampler_logprobs for r in rows])),
        invocation_ids=tuple(i for r in rows for i in r.invocation_ids),
        action_counts=tuple(action_counts),
        prefix_blocks=prefix_blocks,
    )
