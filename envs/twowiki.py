"""2WikiMultihopQA (official JSON list: ``_id, type, question, answer, context, supporting_facts,
evidences``; ``context`` is ``[[title, [sentences]]]`` and ``supporting_facts`` ``[[title, sent_id]]``,
the layout of HotpotQA, whose reader this module shares).

A task's long context is the question's own paragraphs (ten: the supporting ones and distractors) in
the file's order, read as in ``envs.hotpotqa``: one unit a sentence, a paragraph's first sentence
carrying its title. The seed orders the tasks only.

Invariants: the file is fully checked when the environment is built (``type`` is required: it is the
task's ``category``, one of comparison, inference, compositional, bridge_comparison in the official
files, so ``eval`` reports F1 per type); ``evidence`` holds the supporting sentences (those that point
past a paragraph's end are skipped), ``evidence_chunks`` the chunks holding them and ``facts`` the same
sentences in reading order, each with the last chunk holding it; ``metadata`` keeps the ``evidences``
triples. ``score`` is the official evaluation's (``2wikimultihop_evaluate``, HotpotQA's answer F1 and EM,
yes/no rule included; ``envs.metrics.score_answer``) plus substring EM.
"""

from __future__ import annotations

from pathlib import Path

from agentmem.records import Task
from envs.base import TaskSource
from envs.hotpotqa import build_task, read_hotpotqa
from envs.types import CountTokens


class TwoWikiEnv(TaskSource):
    name = "2wikimultihopqa"

    def __init__(self, *, data_path: str | Path, count_tokens: CountTokens, chunk_tokens: int, seed: int) -> None:
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._corpus, self._questions = read_hotpotqa(Path(data_path), keep=("evidences",), need_type=True)

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        return build_task(
            self.name, q, self._corpus, q.docs, lambda _, doc: doc.units(), self._count, self._chunk_tokens
        )
