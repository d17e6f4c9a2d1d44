"""Packed forward passes in which attention never crosses a segment boundary.

Two paths give the logits each invocation would get alone (DESIGN.md, points 2-4):

- ``reference``: the padded ``[B, T]`` batch with a 4-D block-diagonal causal *float* mask
  (0 = attend, ``finfo(dtype).min`` = blocked; eager attention adds it, SDPA accepts it) and
  ``use_cache=False``. It is exact on any attention implementation but computes every ``T x T`` pair.
- ``fast``: the real tokens flattened into one ``[1, N]`` row (no padding at all) and the boundaries passed
  as the flash-attention varlen kwargs ``cu_seq_lens_q/k`` and ``max_length_q/k``, which transformers
  forwards untouched from ``model(...)`` to the attention function. The attention implementation is
  swapped for the duration of the call (``default_kernel``; ``attention_kernel`` overrides it):
  ``flash_attention_2`` (varlen kernel) on CUDA when ``flash_attn`` is installed, else ``agentmem_flex``
  on CUDA (compiled FlexAttention with a ``BlockMask`` of the row's blocks: ``flex_attention.py``), and
  on CPU ``agentmem_segments``, registered here, which runs causal SDPA per segment. No path spends
  compute on cross-segment pairs. Custom names have no mask function, so transformers builds no mask
  for them.

Shared prefixes (``Row.prefix_block``, the shared-prefix packing): a suffix block attends to its prefix block
and to its own earlier tokens, never to a sibling. ``reference`` adds the prefix to the 4-D mask. ``fast``
passes a ``BlockLayout`` (block bounds and each block's prefix) as the ``agentmem_layout`` kwarg to
``agentmem_blocks``, registered here: causal SDPA per prefix or plain block, and per suffix queries =
its tokens, keys = prefix + its tokens with the causal diagonal offset by the prefix length. On CUDA with
flash-attn and a half dtype, ``agentmem_blocks_flash`` makes it one varlen call instead (keys gathered per
block; flash-attn's causal mask is bottom-right aligned, which is the offset): written, not yet run here.
FlexAttention takes the same ``BlockLayout`` (on CUDA without flash-attn).
The prefix's hidden states are computed once and read by every suffix, so autograd sums the suffixes'
gradients through it, which is the exact gradient of the per-call computation.

Why not position ids alone: transformers infers packing from restarting ``position_ids`` only when no 2-D
mask and no cache are given; ``use_cache`` defaults to True, and then segments silently attend to each
other (``tests/agentmem/training/test_packed_attention.py`` shows it).

Logits are taken from the base model's hidden states through the output head at the rows needed only
(``action_logits``): the full-vocabulary projection is never materialised at prompt positions. Models
whose head does more than ``lm_head(hidden)`` (logit soft-capping, scaling) are not supported here.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel

from agentmem.training.collate import PackedBatch
from agentmem.training.flex_attention import FLEX_ATTENTION, check_packed_row, flex_block_attention

SEGMENT_ATTENTION = "agentmem_segments"
BLOCK_ATTENTION = "agentmem_blocks"
BLOCK_FLASH_ATTENTION = "agentmem_blocks_flash"
# On CPU a forward over a few thousand tokens runs slower per token than over about a thousand (the
# activations leave the caches): the fast path runs a row as consecutive groups of whole segments.
CPU_GROUP_TOKENS = 1024
Path = Literal["fast", "reference"]
# The fast path's kernel family: per-segment (per-block) SDPA, compiled FlexAttention, or flash-attn varlen.
Kernel = Literal["sdpa", "flex", "flash"]
KERNELS: tuple[Kernel, ...] = ("sdpa", "flex", "flash")
_KERNEL: ContextVar[Kernel | None] = ContextVar("agentmem_attention_kernel", default=None)


def segment_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal SDPA on each segment of a packed ``[1, heads, N, dim]`` row; returns ``[1, N, heads, dim]``."""
    if cu_seq_lens_q is None or query.shape[0] != 1 or attention_mask is not None:
        raise ValueError(f"{SEGMENT_ATTENTION} needs one packed row, no mask, and cu_seq_lens_q boundaries")
    if cu_seq_lens_k is not None and not torch.equal(cu_seq_lens_q, cu_seq_lens_k):
        raise ValueError(f"{SEGMENT_ATTENTION} needs the same boundaries for queries and keys (no cache)")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    bounds = cu_seq_lens_q.tolist()
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout, is_causal=True, scale=scaling
        )
        for s, e in zip(bounds[:-1], bounds[1:], strict=False)
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def default_kernel(device: torch.device, dtype: torch.dtype, shared: bool = False) -> Kernel:
    """CUDA: flash-attn varlen where installed (shared prefixes: in fp16/bf16 only), else FlexAttention.
    CPU: per-segment SDPA, faster there than compiled FlexAttention, which has no CPU backward either
    (docs/benchmarks.md, the packing section)."""
    if device.type != "cuda":
        return "sdpa"
    if importlib.util.find_spec("flash_attn") is not None and (not shared or dtype in (torch.float16,
                                                                                       torch.bfloat16)):
        return "flash"
    return "flex"


@contextlib.contextmanager
def attention_kernel(kernel: Kernel) -> Iterator[None]:
    """Every fast-path forward in the block uses ``kernel`` instead of the default (benchmarks and checks
    compare them on the same rows)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown attention kernel {kernel!r}: use one of {', '.join(KERNELS)}")
    token = _KERNEL.set(kernel)
    try:
        yield
    finally:
        _KERNEL.reset(token)


def chosen_kernel(device: torch.device, dtype: torch.dtype, shared: bool = False) -> Kernel:
    """The kernel set by ``attention_kernel``, else ``default_kernel``."""
    return _KERNEL.get() or default_kernel(device, dtype, shared)


def fast_attention_implementation(device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    """The attention implementation of rows without shared prefixes (``chosen_kernel``)."""
    return {"flash": "flash_attention_2", "flex": FLEX_ATTENTION, "sdpa": SEGMENT_ATTENTION}[
        chosen_kernel(device, dtype)]


@dataclass(frozen=True)
class BlockLayout:
    """The blocks of one packed ``[1, N]`` forward: block ``b`` is tokens ``bounds[b]:bounds[b + 1]``; it
    attends causally to itself and, when ``prefix_block[b] >= 0``, fully to the earlier block ``prefix_block[b]``
    (its shared prefix)."""

    bounds: tuple[int, ...]
    prefix_block: tuple[int, ...]

    def keys(self, b: int) -> tuple[int, int, int, int]:
        """(prefix start, prefix end, own start, own end) of block ``b``'s keys; an empty prefix when none."""
        s, e, c = self.bounds[b], self.bounds[b + 1], self.prefix_block[b]
        cs, ce = (self.bounds[c], self.bounds[c + 1]) if c >= 0 else (s, s)
        return cs, ce, s, e

    @cached_property
    def varlen(self) -> tuple[list[int], list[int], int, int]:
        """For a varlen kernel: key token indices (each block's prefix, then itself), ``cu_seqlens_k``,
        and the longest query and key blocks."""
        index: list[int] = []
        cu_k, longest_q, longest_k = [0], 0, 0
        for b in range(len(self.prefix_block)):
            cs, ce, s, e = self.keys(b)
            index.extend(range(cs, ce))
            index.extend(range(s, e))
            cu_k.append(len(index))
            longest_q, longest_k = max(longest_q, e - s), max(longest_k, ce - cs + e - s)
        return index, cu_k, longest_q, longest_k


def block_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    agentmem_layout: BlockLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA per block of a packed ``[1, heads, N, dim]`` row (``BlockLayout``); returns ``[1, N, heads, dim]``."""
    agentmem_layout = check_packed_row(BLOCK_ATTENTION, agentmem_layout, query, attention_mask)
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    outputs = []
    for b in range(len(agentmem_layout.prefix_block)):
        cs, ce, s, e = agentmem_layout.keys(b)
        q = query[:, :, s:e]
        if ce == cs:
            outputs.append(F.scaled_dot_product_attention(q, key[:, :, s:e], value[:, :, s:e], dropout_p=dropout,
                                                          is_causal=True, scale=scaling))
            continue
        k = torch.cat([key[:, :, cs:ce], key[:, :, s:e]], dim=2)
        v = torch.cat([value[:, :, cs:ce], value[:, :, s:e]], dim=2)
        visible = torch.ones(e - s, k.shape[2], dtype=torch.bool, device=q.device).tril(ce - cs)
        outputs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout, scale=scaling))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def block_flash_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    agentmem_layout: BlockLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The ``BlockLayout`` as one flash-attn varlen call (CUDA, fp16/bf16): the queries are the row's
    tokens in block order, each block's keys are gathered as (its prefix, itself), and flash-attn's causal
    mask, aligned bottom-right when keys outnumber queries, lets a suffix see its whole prefix."""
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]  # CUDA-only, optional

    agentmem_layout = check_packed_row(BLOCK_FLASH_ATTENTION, agentmem_layout, query, attention_mask)
    index, cu_k, longest_q, longest_k = agentmem_layout.varlen
    device = query.device
    gather = torch.tensor(index, dtype=torch.long, device=device)
    cu_q = torch.tensor(agentmem_layout.bounds, dtype=torch.int32, device=device)
    q = query[0].transpose(0, 1)  # [N, heads, dim]
    k = key[0].transpose(0, 1).index_select(0, gather)  # [K, kv heads, dim]: flash-attn handles GQA itself
    v = value[0].transpose(0, 1).index_select(0, gather)
    out = flash_attn_varlen_func(q, k, v, cu_q, torch.tensor(cu_k, dtype=torch.int32, device=device), longest_q,
                                 longest_k, dropout_p=dropout, softmax_scale=scaling, causal=True)
    return out[None], None


def shared_attention_implementation(device: torch.device, dtype: torch.dtype) -> str:
    """The attention implementation of rows with shared prefixes (``chosen_kernel``)."""
    return {"flash": BLOCK_FLASH_ATTENTION, "flex": FLEX_ATTENTION, "sdpa": BLOCK_ATTENTION}[
        chosen_kernel(device, dtype, shared=True)]


_CUSTOM = {SEGMENT_ATTENTION: segment_sdpa_attention, BLOCK_ATTENTION: block_sdpa_attention,
           BLOCK_FLASH_ATTENTION: block_flash_attention, FLEX_ATTENTION: flex_block_attention}


@contextlib.contextmanager
def attention_implementation(model: PreTrainedModel, name: str) -> Iterator[None]:
    """Swap the model's attention implementation for the block; every submodule reads the shared config."""
    if name in _CUSTOM:
        AttentionInterface.register(name, _CUSTOM[name])
    previous = model.config._attn_implementation
    model.config._attn_implementation = name
    try:
        yield
    finally:
        model.config._attn_implementation = previous


def block_causal_mask(batch: PackedBatch, dtype: torch.dtype) -> torch.Tensor:
    """``[B, 1, T, T]`` additive mask: 0 where query i may see key j (j <= i, and j in i's segment or in the
    shared prefix that i's segment continues), else min."""
    seg = batch.segment_ids
    width = seg.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=seg.device).tril()
    same = seg[:, :, None] == seg[:, None, :]
    if batch.prefix_blocks is not None:
        prefix = torch.where(seg >= 0, batch.prefix_blocks[seg.clamp(min=0)], -1)
        same |= (prefix[:, :, None] == seg[:, None, :]) & (prefix[:, :, None] >= 0)
    allowed = same & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=seg.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


def packed_hidden(model: PreTrainedModel, batch: PackedBatch, path: Path = "fast") -> torch.Tensor:
    """Final hidden states ``[N, hidden]`` of the real tokens, row-major (the ``cu_seqlens`` layout)."""
    base = model.get_decoder()
    if path == "reference":
        out = base(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            attention_mask=block_causal_mask(batch, model.dtype),
            use_cache=False,
        )
        return out.last_hidden_state[batch.token_mask]
    if path != "fast":
        raise ValueError(f"unknown path {path!r}: use 'fast' or 'reference'")
    if batch.prefix_blocks is not None:
        return _shared_prefix_hidden(model, batch)
    cu = batch.cu_seqlens
    pos = batch.position_ids[batch.token_mask]
    groups = segment_groups(cu, CPU_GROUP_TOKENS if cu.device.type == "cpu" else None)
    embeds = _group_embeddings(base, batch, cu.tolist(), groups)
    parts = []
    name = fast_attention_implementation(cu.device, model.dtype)
    with attention_implementation(model, name):
        for (lo, hi), embedded in zip(groups, embeds, strict=True):
            start = int(cu[lo])
            sub = (cu[lo : hi + 1] - start).to(torch.int32)
            if name == FLEX_ATTENTION:
                bounds: dict = {"agentmem_layout": BlockLayout(tuple(sub.tolist()), (-1,) * (hi - lo))}
            else:
                longest = int((sub[1:] - sub[:-1]).max())
                bounds = {"cu_seq_lens_q": sub, "cu_seq_lens_k": sub, "max_length_q": longest,
                          "max_length_k": longest}
            out = base(inputs_embeds=embedded[None], position_ids=pos[start : start + len(embedded)][None],
                       use_cache=False, **bounds)
            parts.append(out.last_hidden_state[0])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _group_embeddings(base: torch.nn.Module, batch: PackedBatch, bounds: list[int],
                      groups: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """The input embeddings of the real tokens, looked up once for the whole row and split by group: an
    embedding's backward makes a dense ``[vocab, hidden]`` gradient per call, so one lookup per group would
    fill and add that (113 MB for the default model) once per group."""
    embedded = base.get_input_embeddings()(batch.input_ids[batch.token_mask])
    return embedded.split([bounds[hi] - bounds[lo] for lo, hi in groups])


def _shared_prefix_hidden(model: PreTrainedModel, batch: PackedBatch) -> torch.Tensor:
    """The fast path for rows with shared prefixes: forward passes over consecutive blocks, never
    separating a prefix from its suffixes, each with its ``BlockLayout``."""
    base = model.get_decoder()
    cu = batch.cu_seqlens
    if batch.prefix_blocks is None:
        raise ValueError("the shared-prefix path needs a batch with prefix blocks (Packing.shared_prefix)")
    bounds, prefixes = cu.tolist(), batch.prefix_blocks.tolist()
    pos = batch.position_ids[batch.token_mask]
    parts = []
    name = shared_attention_implementation(cu.device, model.dtype)
    limit = CPU_GROUP_TOKENS if cu.device.type == "cpu" else None
    groups = segment_groups(cu, limit, [c < 0 for c in prefixes])
    with attention_implementation(model, name):
        for (lo, hi), embedded in zip(groups, _group_embeddings(base, batch, bounds, groups), strict=True):
            start, end = bounds[lo], bounds[hi]
            layout = BlockLayout(tuple(b - start for b in bounds[lo : hi + 1]),
                                 tuple(c - lo if c >= 0 else -1 for c in prefixes[lo:hi]))
            out = base(inputs_embeds=embedded[None], position_ids=pos[start:end][None], use_cache=False,
                       agentmem_layout=layout)
            parts.append(out.last_hidden_state[0])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def segment_groups(cu_seqlens: torch.Tensor, max_tokens: int | None,
                   breakable: list[bool] | None = None) -> list[tuple[int, int]]:
    """Consecutive segment ranges ``[lo, hi)`` of at most ``max_tokens`` tokens (a longer segment alone);
    one range for everything when ``max_tokens`` is None. Attention never crosses a segment, so running
    the groups as separate forward passes gives the same hidden states. ``breakable[k]`` False: a range
    may not start at segment ``k`` (a suffix stays with its shared prefix, which may then exceed the limit)."""
    bounds = cu_seqlens.tolist()
    n = len(bounds) - 1
    if max_tokens is None:
        return [(0, n)]
    groups, lo = [], 0
    for hi in range(1, n + 1):
        if bounds[hi] - bounds[lo] > max_tokens and hi - 1 > lo and (breakable is None or breakable[hi - 1]):
            groups.append((lo, hi - 1))
            lo = hi - 1
    groups.append((lo, n))
    return groups


def packed_logits(model: PreTrainedModel, batch: PackedBatch, path: Path = "fast",
                  mixed_precision: bool = False) -> torch.Tensor:
    """Logits ``[N, vocab]`` at every real token, row-major. For tests and small batches: prefer
    ``action_logits``, which projects only the action positions."""
    return _head(model, _hidden(model, batch, path, mixed_precision))


def action_logits(model: PreTrainedModel, batch: PackedBatch, path: Path = "fast",
                  mixed_precision: bool = False) -> torch.Tensor:
    """Logits ``[A, vocab]`` at the action positions only, in the order of ``batch.action_ids``.

    ``mixed_precision``: the decoder runs under ``torch.autocast`` in bfloat16 (its matmuls and attention;
    weights, gradients and the optimiser stay in the weights' dtype) and the output head runs in the weights'
    dtype on the hidden states cast back to it, so the logits, and every loss over them, keep float32's
    resolution where the decoder's rounding is all that changes."""
    hidden = _hidden(model, batch, path, mixed_precision)
    return _head(model, hidden[batch.action_mask[batch.token_mask]])


def _hidden(model: PreTrainedModel, batch: PackedBatch, path: Path, mixed_precision: bool) -> torch.Tensor:
    with torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=mixed_precision):
        return packed_hidden(model, batch, path)


def _head(model: PreTrainedModel, hidden: torch.Tensor) -> torch.Tensor:
    head = model.get_output_embeddings()
    return head(hidden.to(head.weight.dtype))
