"""ReOPD (replayed-prefix distillation): which stored teacher call each episode branches from, and how much
of the student's own states a teacher pool covers. Pure functions of records and a seed: no torch, no store.

- ``branch_probabilities(n, kappa)``: ``p_t = kappa**t / sum_{s<n} kappa**s`` for the steps ``t = 0..n-1``
  of an episode of ``n`` calls (early steps favoured for ``kappa < 1``, uniform for ``kappa = 1``);
- ``draw_branch_steps(lengths, kappa, seed)``: one step per episode, each drawn from its own episode's
  probabilities by one generator seeded with ``seed`` and consumed in the order given, so the draws are a
  function of (lengths, kappa, seed) only;
- ``state_coverage(student, teacher, task_of)``: the share of the student's calls whose state (task, step,
  call kind, memory read) is one the teacher visited. A replayed call starts from a teacher state; this
  says how many of the states the student reaches on its own lie in that pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import numpy as np

from agentmem.errors import ReplayError
from agentmem.records import Invocation


def branch_probabilities(n: int, kappa: float) -> np.ndarray:
    """float64 ``[n]``: ``kappa**t`` normalised over the episode's ``n`` steps."""
    if n < 1:
        raise ReplayError(f"an episode to branch from needs at least one call, got {n}")
    if not kappa > 0:
        raise ReplayError(f"kappa must be > 0, got {kappa}")
    weights = np.power(float(kappa), np.arange(n, dtype=np.float64))
    return weights / weights.sum()


def draw_branch_steps(lengths: Seq[int], kappa: float, seed: int) -> list[int]:
    """One branch step per episode (``lengths[i]`` calls in episode ``i``), ``P(t) ∝ kappa**t``."""
    rng = np.random.default_rng(seed)
    return [int(rng.choice(n, p=branch_probabilities(n, kappa))) for n in lengths]


StateKey = tuple[str, int, str, str]


def state_key(task_id: str, inv: Invocation) -> StateKey:
    """A call's state: its task, step and kind, and the memory it read (surrounding space ignored)."""
    return task_id, inv.step, str(inv.kind), inv.memory_before.strip()


@dataclass(frozen=True)
class Coverage:
    """How many student calls start from a state of the teacher pool: in all, and per step
    (``by_step[t] = (matched, total)``); ``teacher_states`` is the pool's size (distinct states)."""

    matched: int
    total: int
    teacher_states: int
    by_step: dict[int, tuple[int, int]]

    @property
    def share(self) -> float:
        return self.matched / self.total

    @property
    def share_after_first(self) -> float | None:
        """The share over steps > 0 (step 0 reads the empty memory, which every pool holds for its tasks);
        None when the student has no later call."""
        matched = sum(m for t, (m, _) in self.by_step.items() if t > 0)
        total = sum(n for t, (_, n) in self.by_step.items() if t > 0)
        return matched / total if total else None


def state_coverage(student: Iterable[Invocation], teacher: Iterable[Invocation],
                   task_of: Mapping[str, str]) -> Coverage:
    """The share of ``student`` calls whose ``state_key`` is the key of some ``teacher`` call; ``task_of``
    maps the episode id of every call (both sides) to its task id."""
    pool = {state_key(task_of[inv.episode_id], inv) for inv in teacher}
    by_step: dict[int, list[int]] = {}
    for inv in student:
        counts = by_step.setdefault(inv.step, [0, 0])
        counts[0] += state_key(task_of[inv.episode_id], inv) in pool
        counts[1] += 1
    total = sum(n for _, n in by_step.values())
    if not total:
        raise ReplayError("no student calls to audit")
    return Coverage(sum(m for m, _ in by_step.values()), total, len(pool),
                    {t: (m, n) for t, (m, n) in sorted(by_step.items())})
