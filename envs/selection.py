"""Seeded randomness shared by the environments.

Invariants: every draw is a pure function of (seed, purpose, key) through numpy's ``default_rng`` with a
sequence seed, so a task's context does not depend on which other tasks were asked for, and ``take``
returns prefixes of one seeded order (``tasks(k)`` is a prefix of ``tasks(n)``).
"""

from __future__ import annotations

import numpy as np

from envs.errors import check_int

_ORDER, _TASK = 0, 1


def task_rng(seed: int, key: int) -> np.random.Generator:
    """The generator for building task ``key`` (its index in the source)."""
    return np.random.default_rng([seed, _TASK, key])


def take(count: int, n: int | None, seed: int) -> list[int]:
    """The first ``n`` (all when None) of a seeded permutation of ``range(count)``."""
    check_int("n", n, 0, optional=True)
    order = np.random.default_rng([seed, _ORDER]).permutation(count).tolist()
    return order if n is None else order[:n]
