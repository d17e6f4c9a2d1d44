"""Teacher distributions rebuilt from ``agentmem score --topk`` shards, for distilling without loading the
teacher. The top-K log-probs are kept exactly; the remaining probability mass ``1 - sum(top-K)`` is spread
evenly over the other ``V - K`` tokens, so every divergence (reverse KL included) stays finite."""

from __future__ import annotations

from functools import lru_cache

import torch
from safetensors.torch import load_file


@lru_cache(maxsize=8)
def _shard(path: str) -> dict[str, torch.Tensor]:
    return load_file(path)


def dense_logprobs(values: torch.Tensor, indices: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[O, K]`` top-K log-probs and their token ids -> ``[O, vocab]`` log-probs (see module doc)."""
    k = values.shape[-1]
    values = values.float()
    rest = (1 - values.exp().sum(-1, keepdim=True)).clamp_min(1e-12) / max(vocab - k, 1)
    out = rest.log().expand(values.shape[0], vocab).clone()
    return out.scatter_(-1, indices.long(), values)


def read_topk(path: str, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[O, K]`` top-K log-probs and token ids of one invocation in one shard."""
    shard = _shard(path)
    return shard[f"{key}.logprobs"], shard[f"{key}.indices"]
