"""Group-relative advantages (GRPO): each episode's final reward against the other samples of its task.

Pure numpy, no torch: an advantage is one number per episode, broadcast over that episode's action
tokens by the caller.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def group_advantages(
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> np.ndarray:
    """Reward minus the mean reward of its group -> float64 array ``[len(rewards)]``, input order kept.

    For episode ``i`` in group ``g`` (the episodes sampled for one task) of size ``n_g``::

        A_i = r_i - mean_g                      (normalize_std=False; Dr. GRPO)
        A_i = (r_i - mean_g) / (std_g + eps)    (normalize_std=True; GRPO)

    where ``std_g`` is the sample standard deviation (``ddof=1``, as TRL's ``torch.std``). A singleton
    group has advantage 0 (no baseline to compare with); a group of equal rewards has advantage 0 in
    both modes.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or len(group_ids) != r.shape[0]:
        raise ValueError(f"need one group id per reward, got {r.shape} rewards and {len(group_ids)} ids")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards must be finite")
    index: dict[Hashable, int] = {}
    group = np.array([index.setdefault(g, len(index)) for g in group_ids], dtype=np.int64)
    advantages = np.zeros_like(r)
    for g in range(len(index)):
        members = group == g
        if members.sum() < 2:
            continue
        centred = r[members] - r[members].mean()
        std = r[members].std(ddof=1)
        if normalize_std and std > 0:  # equal rewards: centred is already 0, and eps may be 0
            centred = centred / (std + eps)
        advantages[members] = centred
    return advantages
