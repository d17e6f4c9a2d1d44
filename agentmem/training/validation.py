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
                    device: str | torch.device = "cpu") -> dict[str, float]:
    """Mean ``p(eos | prompt)`` at temperature 1 per kind, over (kind, prompt ids) pairs, each prompt run
    alone (positions from 0, as it was sampled)."""
    per: dict[str, list[float]] = defaultdict(list)
    with torch.no_grad():
        for kind, ids in prompts:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)
            logits = model(input_ids=x).logits[0, -1].float()
            per[kind].append(float(torch.softmax(logits, dim=-1)[eos_id]))
    return {k: sum(v) / len(v) for k, v in sorted(per.items())}
