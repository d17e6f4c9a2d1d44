"""Teacher distributions rebuilt from ``agentmem score --topk`` shards, for distilling without loading the
teacher. The top-K log-probs are kept exactly; the remaining probability mass ``1 - sum(top-K)`` is spread
evenly over the other ``V - K`` tokens, so every divergence (reverse KL included) stays finite."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch
from safetensors.torch import load_file

from agentmem.records import TeacherContext
from store import repository as repo
from store.engine import Store


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


def shard_locations(store: Store, invocation_ids: Sequence[str], teacher: str,
                    context: TeacherContext) -> dict[str, tuple[str, str]]:
    """(shard path, key) per invocation; raises ValueError naming the first invocation without one."""
    with store.session() as s:
        scores = repo.get_teacher_scores(s, list(invocation_ids), teacher, context)
    for inv_id in invocation_ids:
        score = scores.get(inv_id)
        if score is None or not score.topk_path:
            raise ValueError(f"invocation {inv_id} has no top-K shard for teacher {teacher!r} under context "
                             f"{TeacherContext(context).value!r}: run `agentmem score --topk K` first")
    return {i: (scores[i].topk_path, scores[i].topk_key) for i in invocation_ids}


def teacher_logits_from_shards(locations: dict[str, tuple[str, str]], invocation_ids: Sequence[str],
                               vocab: int) -> dict[str, torch.Tensor]:
    out = {}
    for inv_id in invocation_ids:
        path, key = locations[inv_id]
        shard = _shard(path)
        out[inv_id] = dense_logprobs(shard[f"{key}.logprobs"], shard[f"{key}.indices"], vocab)
    return out
