"""The contract every environment keeps.

An environment is built once per job (``envs.load_env``) and then asked for tasks and for scores.

Invariants an implementation promises:
- ``tasks(n)`` is a pure function of the seed and knobs it was built with: the same call gives equal
  tasks, and ``tasks(k)`` is a prefix of ``tasks(n)`` for ``k <= n``; ``n=None`` means all tasks, and an
  ``n`` above the number available gives all of them;
- every chunk of every task satisfies ``count_tokens(chunk) <= chunk_tokens``;
- every task has a non-empty question, at least one non-empty gold answer, and ``evidence_chunks``
  that are valid, sorted, distinct indices into ``chunks``;
- ``score`` is a pure function of its arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from agentmem.records import Task
from envs.metrics import Scores

CountTokens = Callable[[str], int]


class Env(Protocol):
    name: str

    def tasks(self, n: int | None = None) -> list[Task]:
        """The first ``n`` tasks (all when None) of this environment's seeded order."""
        ...

    def score(self, prediction: str, task: Task) -> Scores:
        """F1, EM and substring EM of ``prediction`` against ``task.answers``."""
        ...
