"""Group-relative advantages: exact values on a hand-made batch of groups."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentmem.training.advantages import group_advantages

torch.set_num_threads(1)

# Interleaved as a batch would arrive: group "a" = (1.0, 0.0, 0.5), group ("b", 1) = (2.0, 4.0),
# group "c" a singleton, group 3 all equal.
REWARDS = [1.0, 2.0, 0.0, 7.0, 3.0, 0.5, 4.0, 3.0]
GROUPS = ["a", ("b", 1), "a", "c", 3, "a", ("b", 1), 3]


def test_mean_centred_by_hand() -> None:
    adv = group_advantages(REWARDS, GROUPS)
    assert adv.dtype == np.float64 and adv.shape == (8,)
    assert adv.tolist() == [0.5, -1.0, -0.5, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_std_normalised_by_hand() -> None:
    eps = 1e-6
    adv = group_advantages(REWARDS, GROUPS, normalize_std=True, eps=eps)
    std_a = math.sqrt((0.5**2 + 0.5**2 + 0.0) / 2)  # ddof=1: 0.5
    std_b = math.sqrt((1.0 + 1.0) / 1)  # ddof=1: sqrt(2)
    expected = [
        0.5 / (std_a + eps),
        -1 / (std_b + eps),
        -0.5 / (std_a + eps),
        0.0,
        0.0,
        0.0,
        1 / (std_b + eps),
        0.0,
    ]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12)


def test_std_matches_torch_std_as_trl_uses_it() -> None:
    rewards = torch.tensor([[0.2, 0.9, 0.4, 0.4], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    trl_style = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    adv = group_advantages(rewards.flatten().tolist(), [0] * 4 + [1] * 4, normalize_std=True, eps=1e-4)
    assert adv.tolist() == pytest.approx(trl_style.flatten().tolist(), abs=1e-12)


def test_zero_eps_with_equal_rewards_is_zero_not_nan() -> None:
    assert (
        group_advantages([2.0, 2.0, 5.0], ["g", "g", "h"], normalize_std=True, eps=0.0).tolist() == [0.0] * 3
    )


def test_bad_input_raises() -> None:
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], ["a"])
    with pytest.raises(ValueError):
        group_advantages([1.0, float("nan")], ["a", "a"])


def test_empty_batch() -> None:
    assert group_advantages([], []).shape == (0,)
