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

Shared prefixes (``shared_prefix=True``): the sequences of one ``Sequence.group`` (the G samples of a task
at one step) share their longest common prefix of token ids (and positions), computed on the ids only.
The prefix is cut so that it stays strictly inside every member's prompt: it ends before the position
that predicts the first action, so it holds no action and every suffix keeps at least one prompt token.
A group is then one packing unit: the prefix placed once as a block, followed by each member's suffix
block at its original positions (``P .. len-1``); ``Row.prefix_block`` tells each suffix block which prefix
block it also attends to. A unit counts the prefix once against the budget; a group too large for a row
is split into consecutive sub-groups that fit, each with its own copy of the prefix; a group of one, or
whose members share nothing, falls back to ordinary segments. Without ``shared_prefix`` (or with no
group in a row) the rows are exactly those of the segments layout.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from agentmem.errors import ReplayError
from agentmem.replay.rebuild import Sequence

OverBudget = Literal["error", "skip", "left"]


@dataclass(frozen=True)
class Row:
    """One packed row. Token arrays have the row's real length (no padding); ``cu_seqlens`` is
    ``[0, l1, l1+l2, ...]`` over the row's blocks; ``action_ids`` / ``sampler_logprobs`` are the blocks'
    actions concatenated in row order, one per True in ``action_mask``.

    Segments layout (``prefix_block`` None): every block is one whole invocation. Shared-prefix layout:
    ``prefix_block[b]`` is the index of the shared-prefix block that block ``b`` attends to before itself (it
    always comes earlier in the row), -1 for a block of its own. A prefix block holds no invocation and no
    action; ``invocation_ids`` names the other blocks in row order (``invocation_blocks``)::

        prefix [p0 p1 p2] + suffixes [a3 a4] [b3 b4 b5] + segment [c0 c1]
        input_ids    [p0 p1 p2 a3 a4 b3 b4 b5 c0 c1]
        position_ids [0  1  2  3  4  3  4  5  0  1]
        cu_seqlens   [0, 3, 5, 8, 10];  prefix_block [-1, 0, 0, -1];  invocation_ids ("a", "b", "c")
    """

    input_ids: np.ndarray  # int32 [n]
    position_ids: np.ndarray  # int32 [n]
    cu_seqlens: np.ndarray  # int32 [blocks + 1]
    action_mask: np.ndarray  # bool [n]
    invocation_ids: tuple[str, ...]
    action_ids: np.ndarray  # int32 [actions]
    sampler_logprobs: np.ndarray  # float32 [actions]
    prefix_block: np.ndarray | None = None  # int32 [blocks]: the prefix block each block also sees, or -1

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_lens(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    @property
    def invocation_blocks(self) -> np.ndarray:
        """Indices of the blocks that hold an invocation (all but shared prefixes), in row order."""
        blocks = np.arange(len(self.cu_seqlens) - 1)
        if self.prefix_block is None:
            return blocks
        return blocks[~np.isin(blocks, self.prefix_block)]


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
    shared_tokens: int = 0  # prompt tokens placed once for a group instead of once per call

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


def shareable_prefix(seqs: list[Sequence]) -> int:
    """Length of the longest common prefix of ``seqs`` (token ids and positions), cut to end before the
    position predicting each member's first action (so it holds no action and every member keeps at least
    one prompt token after it). Token ids only: no text is ever compared."""
    limit = min(int(np.argmax(s.action_mask)) if s.num_actions else len(s) - 1 for s in seqs)
    first = seqs[0]
    same: np.ndarray = np.ones(limit, bool)
    for s in seqs[1:]:
        same &= s.input_ids[:limit] == first.input_ids[:limit]
        same &= s.position_ids[:limit] == first.position_ids[:limit]
    return int(np.argmin(same)) if not same.all() else limit


@dataclass(frozen=True)
class _Unit:
    """What best-fit places: one sequence (``prefix`` 0) or a group sharing its first ``prefix`` tokens."""

    members: tuple[int, ...]  # indices into the packed sequences, arrival order
    prefix: int
    size: int  # tokens in the row: the prefix once plus every member's remainder


def _units(seqs: list[Sequence], row_tokens: int, shared_prefix: bool) -> list[_Unit]:
    if not shared_prefix:
        return [_Unit((i,), 0, len(s)) for i, s in enumerate(seqs)]
    groups: dict[Hashable, list[int]] = {}
    units = []
    for i, s in enumerate(seqs):
        if s.group is None:
            units.append(_Unit((i,), 0, len(s)))
        else:
            groups.setdefault(s.group, []).append(i)
    for members in groups.values():
        units.extend(_group_units(seqs, members, row_tokens))
    return sorted(units, key=lambda u: u.members[0])


def _group_units(seqs: list[Sequence], members: list[int], row_tokens: int) -> list[_Unit]:
    """The group as consecutive sub-groups that fit a row, each sharing its own longest prefix."""
    prefix = shareable_prefix([seqs[i] for i in members]) if len(members) > 1 else 0
    if prefix == 0:
        return [_Unit((i,), 0, len(seqs[i])) for i in members]
    chunks: list[list[int]] = [[]]
    size = prefix
    for i in members:
        if chunks[-1] and size + len(seqs[i]) - prefix > row_tokens:
            chunks.append([])
            size = prefix
        chunks[-1].append(i)
        size += len(seqs[i]) - prefix
    units: list[_Unit] = []
    for chunk in chunks:
        own = shareable_prefix([seqs[i] for i in chunk]) if len(chunk) > 1 else 0
        if own == 0:
            units.extend(_Unit((i,), 0, len(seqs[i])) for i in chunk)
        else:
            units.append(_Unit(tuple(chunk), own, own + sum(len(seqs[i]) - own for i in chunk)))
    return units


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


def _shared_row(seqs: list[Sequence], units: list[_Unit]) -> Row:
    """The row of ``units`` in the shared-prefix layout: a group's prefix block, then its suffix blocks."""
    ids: list[np.ndarray] = []
    pos: list[np.ndarray] = []
    mask: list[np.ndarray] = []
    lens: list[int] = []
    prefixes: list[int] = []
    for u in units:
        first = seqs[u.members[0]]
        if u.prefix:
            prefix_block = len(lens)
            ids.append(first.input_ids[: u.prefix])
            pos.append(first.position_ids[: u.prefix])
            mask.append(np.zeros(u.prefix, bool))
            lens.append(u.prefix)
            prefixes.append(-1)
        for i in u.members:
            s = seqs[i]
            ids.append(s.input_ids[u.prefix :])
            pos.append(s.position_ids[u.prefix :])
            mask.append(s.action_mask[u.prefix :])
            lens.append(len(s) - u.prefix)
            prefixes.append(prefix_block if u.prefix else -1)
    members = [seqs[i] for u in units for i in u.members]
    return Row(
        input_ids=np.concatenate(ids).astype(np.int32),
        position_ids=np.concatenate(pos).astype(np.int32),
        cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
        action_mask=np.concatenate(mask),
        invocation_ids=tuple(s.invocation_id for s in members),
        action_ids=np.concatenate([s.action_ids for s in members]).astype(np.int32),
        sampler_logprobs=np.concatenate([s.sampler_logprobs for s in members]).astype(np.float32),
        prefix_block=np.asarray(prefixes, np.int32),
    )


def pack(
    sequences: Iterable[Sequence],
    row_tokens: int,
    *,
    over_budget: OverBudget = "error",
    shared_prefix: bool = False,
) -> tuple[list[Row], PackingStats]:
    """Best-fit decreasing of ``sequences`` into rows of at most ``row_tokens`` tokens (``over_budget``,
    ``shared_prefix``: see the module docstring)."""
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

    units = _units(seqs, row_tokens, shared_prefix)
    members: list[list[int]] = []  # unit indices per row
    free: list[tuple[int, int]] = []  # (tokens left, row index), sorted: best fit = first entry that fits
    for k in sorted(range(len(units)), key=lambda k: (-units[k].size, k)):
        n = units[k].size
        at = bisect.bisect_left(free, (n, -1))
        if at < len(free):
            left, row = free.pop(at)
        else:
            left, row = row_tokens, len(members)
            members.append([])
        members[row].append(k)
        bisect.insort(free, (left - n, row))

    rows = []
    for m in members:
        placed = [units[k] for k in sorted(m)]
        if any(u.prefix for u in placed):
            rows.append(_shared_row(seqs, placed))
        else:
            rows.append(_row([seqs[u.members[0]] for u in placed]))
    shared = sum(u.prefix * (len(u.members) - 1) for u in units)
    stats = PackingStats(
        rows=len(rows),
        sequences=len(seqs),
        tokens=sum(len(s) for s in seqs) - shared,
        row_tokens=row_tokens,
        truncated_sequences=truncated_seqs,
        truncated_tokens=truncated,
        skipped_ids=tuple(skipped),
        skipped_tokens=skipped_tokens,
        shared_tokens=shared,
    )
    return rows, stats
