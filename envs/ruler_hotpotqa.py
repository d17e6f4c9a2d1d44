"""RULER-HotpotQA as MemAgent builds it, from an official HotpotQA file (``hotpot_dev_distractor_v1.json``).

MemAgent (``taskutils/memory_data/processing.py``, after RULER's ``qa.py``) makes each question's
context from the question's own paragraphs (its supporting paragraphs and its own distractors) plus
paragraphs drawn at random from the other questions of the file, up to ``docs`` documents, shuffled and
rendered as

    Document 1:
    <title>
    <sentences joined as the file has them>

    Document 2:
    ...

(``"Document {i}:\\n{title}\\n{''.join(sentences)}"`` joined by a blank line; HotpotQA's sentences
carry their own leading space). Its evaluation sets use 50, 100, 200, ... 6400 documents; 50 is about 7K
tokens. Here the draw and the shuffle are seeded per task (``envs.documents``; MemAgent shuffles with a
fixed ``random.Random(4)``), and paragraphs are told apart by title (MemAgent by title and text).

Invariants: the file is fully checked when the environment is built, and so is ``docs``: above the
number of distinct paragraph titles in the file, or below a question's number of supporting paragraphs,
is an ``EnvError`` that says how many there are; every task has exactly ``docs`` documents with distinct
titles, its supporting paragraphs always among them; the documents for ``docs=n`` are among those for
any larger ``docs`` (the draw is one seeded order cut at ``n``), so the context grows with ``docs``.
A chunk breaks a document only between its header (``Document i:`` and the title) and sentences, or
between sentences, unless one alone is over the budget. ``evidence``, ``evidence_chunks`` and ``facts``
are the supporting sentences, as in ``envs.hotpotqa``. ``score`` gives MemAgent's three metrics: F1 and
EM of HotpotQA's evaluation script (``envs.metrics.score_answer``) and MemAgent's substring EM
(``envs.metrics.memagent_sub_em``: either normalised answer inside the other).
"""

from __future__ import annotations

from pathlib import Path

from agentmem.records import Task
from envs.base import TaskSource
from envs.chunking import Unit
from envs.documents import choose_documents
from envs.errors import EnvError, check_int
from envs.files import where
from envs.hotpotqa import HotpotDoc, build_task, gold_docs, read_hotpotqa
from envs.metrics import Scores, best_scores, exact_match, f1_score, memagent_sub_em
from envs.selection import task_rng
from envs.types import CountTokens


class RulerHotpotQAEnv(TaskSource):
    name = "ruler_hotpotqa"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        docs: int = 50,
    ) -> None:
        check_int(f"{self.name}: knob docs", docs, 1)
        path = Path(data_path)
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._docs = docs
        self._corpus, self._questions = read_hotpotqa(path, keep=("level",))
        self._gold = [gold_docs(q, self._corpus) for q in self._questions]
        available = len({doc.title for doc in self._corpus})
        if docs > available:
            raise EnvError(f"{path}: knob docs={docs} is more than the {available} distinct paragraphs "
                           f"(by title) in the file")
        for index, gold in enumerate(self._gold):
            if len(gold) > docs:
                place = where(path, index, {"_id": self._questions[index].qid}, "_id")
                raise EnvError(f"{place}: knob docs={docs} is fewer than its {len(gold)} supporting paragraphs")

    def score(self, prediction: str, task: Task) -> Scores:
        return best_scores(prediction, task.answers, f1_score, exact_match, memagent_sub_em)

    def _build(self, index: int) -> Task:
        q, gold = self._questions[index], self._gold[index]
        order = choose_documents(
            task_rng(self._seed, index),
            required=gold,
            own_optional=[d for d in q.docs if d not in gold],
            corpus_size=len(self._corpus),
            key_of=lambda d: self._corpus[d].title,
            tokens_of=lambda d: 0,  # unused: the size is a number of documents
            docs=self._docs,
            context_tokens=None,
        )
        task = build_task(self.name, q, self._corpus, order, render_document, self._count, self._chunk_tokens)
        return task.model_copy(update={"metadata": {**task.metadata, "docs": len(order)}})


def render_document(position: int, doc: HotpotDoc) -> list[Unit]:
    """``Document {position + 1}:\\n{title}`` then the sentences, joined as MemAgent joins them (``''.join``:
    a sentence's own leading white space, as one space, separates it from the one before)."""
    header = Unit(f"Document {position + 1}:\n{doc.title}", sep="\n\n")
    first = Unit(doc.sentences[0], sep="\n")
    rest = [Unit(s, sep=" " if s[:1].isspace() else "") for s in doc.sentences[1:]]
    return [header, first, *rest]
