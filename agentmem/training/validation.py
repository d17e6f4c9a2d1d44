"""First-token end-of-sequence mass: how much a model wants to stop before writing anything, per call kind.

A teacher that puts much probability on end-of-sequence as the first token teaches a student to stop at
once (the collapse ``docs/learning.md`` describes); ``agentmem.jobs.teacher_check`` refuses such a teacher
before any distillation uses it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch


def first_token_eos(model: torch.nn.Module, prompts: Sequence[tuple[str, Sequence[int]]], eos_id: int,
                    device: str | torch.device = "cpu", max_per_kind: int | None = 64) -> dict[str, float]:
    """Mean ``p(eos | prompt)`` at temperature 1 per kind, over (kind, prompt ids) pairs, each prompt run
    alone (positions from 0, as it was sampled). ``max_per_kind``: at most this many prompts of a kind, evenly
    spaced over its list (a forward pass per prompt is the cost: 64 keep a teacher check of 64 episodes to a
    fifth of its calls); None takes every one."""
    by_kind: dict[str, list[Sequence[int]]] = defaultdict(list)
    for kind, ids in prompts:
        by_kind[kind].append(ids)
    per: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for kind, all_ids in by_kind.items():
            n = len(all_ids)
            keep = range(n) if max_per_kind is None or n <= max_per_kind else \
                sorted({round(i * (n - 1) / (max_per_kind - 1)) for i in range(max_per_kind)})
            for i in keep:
                x = torch.tensor([list(all_ids[i])], dtype=torch.long, device=device)
                logits = model(input_ids=x, logits_to_keep=1).logits[0, -1].float()
                per[kind].append(float(torch.softmax(logits, dim=-1)[eos_id]))
    return {k: sum(v) / len(v) for k, v in sorted(per.items())}
