"""The learning rate at a global step: linear warmup, then constant or cosine decay (pure, no torch).

``lr_at(step, ...)`` takes the 0-based global step. Warmup ramps linearly over the first ``warmup`` steps,
step ``s`` at ``lr * (s + 1) / (warmup + 1)`` (one warmup step runs at ``lr / 2``), and step ``warmup`` is
the first at ``lr``. After it, ``constant`` keeps ``lr``;
``cosine`` decays from ``lr`` (step ``warmup``) to ``lr * min_ratio`` at the last step ``total - 1``, and
stays there past the end (a job resumed with more steps). ``agentmem train`` runs one schedule over all its
rounds: round ``r``'s distill has ``schedule_offset = r * steps_per_round`` and ``schedule_steps = rounds
* steps_per_round``.
"""

from __future__ import annotations

import math

from agentmem.config import LrSchedule


def lr_at(step: int, lr: float, total: int, warmup: int = 0, schedule: LrSchedule | str = LrSchedule.constant,
          min_ratio: float = 0.1) -> float:
    if step < 0 or total < 1:
        raise ValueError(f"lr_at: step {step} must be >= 0 and total {total} >= 1")
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if LrSchedule(schedule) is LrSchedule.constant:
        return lr
    span = total - 1 - warmup
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup) / span)
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
