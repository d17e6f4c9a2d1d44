"""FlexAttention (``torch.nn.attention.flex_attention``) for packed rows: one fused kernel per layer.

A ``BlockLayout`` (the packed row's blocks and each block's shared prefix) becomes a ``BlockMask``: query
``q`` sees key ``k`` when ``k <= q`` in the same block, or when ``k`` lies in the prefix block of ``q``'s
block (a prefix comes earlier in the row, so every prefix key is before its suffix's queries). Plain
segment packing is the layout with no prefixes, so one mask covers both packings.

The row's ``N`` tokens are padded inside the attention call to a shape bucket (``bucket``: the next power
of two, at least 128), so the compiled kernel is built once per bucket and not once per row length;
padded queries and keys belong to no block, so every tile they fill is skipped and real tokens never
see them. The mask is built once per forward (cached on the layout) and read by
every layer.

FlexAttention has no backward on CPU (torch raises), so on CPU it serves inference only. Dropout is not
supported (it is 0 in every model this harness trains).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from agentmem.training.packed_attention import BlockLayout

FLEX_ATTENTION = "agentmem_flex"
TILE = 128  # flex_attention's default sparse block size; buckets are multiples of it


def bucket(n: int) -> int:
    """The padded length for ``n`` tokens: the next power of two, at least 128. Padding costs little: its
    tiles are fully masked, so the kernel skips them, and only q, k and v are copied to the bucket."""
    return max(TILE, 1 << max(n - 1, 1).bit_length())


@functools.lru_cache(maxsize=1)
def compiled_flex() -> Any:
    """``torch.compile(flex_attention)``, built on first use; the recompile limit is raised so every shape
    bucket of a run gets its own kernel instead of the unfused eager fallback."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the newer name, then the older one
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
            break
    return torch.compile(flex_attention, dynamic=False)


def token_blocks(layout: BlockLayout, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per padded token: its block (padding: -2) and its block's prefix block (-1: none, padding too)."""
    sizes = torch.tensor([e - s for s, e in zip(layout.bounds[:-1], layout.bounds[1:], strict=True)])
    pad = length - layout.bounds[-1]
    if pad < 0:
        raise ValueError(f"a padded length of {length} is shorter than the row's {layout.bounds[-1]} tokens")
    block = torch.repeat_interleave(torch.arange(len(sizes) + 1), torch.cat([sizes, torch.tensor([pad])]))
    prefix = torch.tensor([*layout.prefix_block, -1])[block]
    block[layout.bounds[-1] :] = -2
    return block.to(device=device, dtype=torch.int32), prefix.to(device=device, dtype=torch.int32)


def visibility(layout: BlockLayout, length: int, device: torch.device) -> Any:
    """The ``mask_mod`` of ``layout``: True where query ``q`` may see key ``k``. A padded query sees
    nothing (its output is discarded) and no query sees a padded key."""
    block, prefix = token_blocks(layout, length, device)

    def visible(b, h, q, k):
        own = (block[q] == block[k]) & (k <= q) & (block[q] >= 0)
        return own | (prefix[q] == block[k])

    return visible


def block_mask(layout: BlockLayout, length: int, device: torch.device) -> Any:
    """The ``BlockMask`` of ``layout`` over ``length`` (padded) tokens; compiled construction on CUDA, so the
    ``length x length`` mask is never materialised."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(visibility(layout, length, device), None, None, length, length, device=device,
                             BLOCK_SIZE=TILE, _compile=device.type == "cuda")


_MASKS: dict[tuple[BlockLayout, int, str], Any] = {}


def cached_block_mask(layout: BlockLayout, length: int, device: torch.device) -> Any:
    """``block_mask`` built once per forward: the last layout's mask is kept (every layer asks for it)."""
    key = (layout, length, str(device))
    if key not in _MASKS:
        _MASKS.clear()
        _MASKS[key] = block_mask(layout, length, device)
    return _MASKS[key]


def check_packed_row(kernel: str, layout: BlockLayout | None, query: torch.Tensor,
                     attention_mask: torch.Tensor | None) -> BlockLayout:
    """The call every block-layout kernel takes: one packed row, no attention mask, a ``BlockLayout`` (returned)."""
    if layout is None or query.shape[0] != 1 or attention_mask is not None:
        raise ValueError(f"{kernel} needs one packed row, no mask, and a BlockLayout")
    return layout


def flex_block_attention(
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
    """Compiled FlexAttention over a packed ``[1, heads, N, dim]`` row with a ``BlockLayout``; returns
    ``[1, N, heads, dim]``."""
    agentmem_layout = check_packed_row(FLEX_ATTENTION, agentmem_layout, query, attention_mask)
    if dropout:
        raise ValueError(f"{FLEX_ATTENTION} has no attention dropout (got {dropout})")
    if query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad:
        raise NotImplementedError(f"{FLEX_ATTENTION}: FlexAttention has no backward on CPU; train with the "
                                  "per-segment SDPA kernel there")
    n = query.shape[2]
    length = bucket(n)
    mask = cached_block_mask(agentmem_layout, length, query.device)
    pad = (0, 0, 0, length - n)
    q, k, v = (torch.nn.functional.pad(t, pad) for t in (query, key, value))
    out = compiled_flex()(q, k, v, block_mask=mask, scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out[:, :, :n].transpose(1, 2).contiguous(), None
