"""HotpotQA (official JSON: ``_id, question, answer, type, level, supporting_facts, context``).

A task's long context is its own paragraphs (the supporting ones always) plus paragraphs of other
questions, to ``docs`` documents or ``context_tokens`` tokens, in a seeded shuffle (see
``envs.documents``). Units are sentences; a document's first sentence carries its title.

Invariants: the file is fully checked when the environment is built; ``evidence`` holds the supporting
sentences (supporting facts that point past a paragraph's end, a known quirk of the official files, are
skipped) and ``evidence_chunks`` the chunks that hold them; ``facts`` the same sentences (without the
title a document's first sentence carries in the chunk), in reading order, each with the last chunk
holding it; ``category`` is the question type.

The reader (``read_hotpotqa``) and the task builder (``build_task``) are shared with the readers of the
same layout: ``envs.ruler_hotpotqa`` (MemAgent's RULER-HotpotQA) and ``envs.twowiki`` (2WikiMultihopQA).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.records import Fact, Task
from envs.base import TaskSource, TokensOnce
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.documents import check_size_knobs, choose_documents
from envs.errors import EnvError
from envs.files import answer_text, field, need_list, read_json, where
from envs.selection import task_rng
from envs.types import CountTokens


@dataclass(frozen=True)
class HotpotDoc:
    title: str
    sentences: tuple[str, ...]

    def units(self) -> list[Unit]:
        """HotpotQA's rendering: one unit a sentence, the first carrying the title."""
        first = Unit(f"{self.title}: {self.sentences[0].strip()}", sep="\n")
        return [first, *(Unit(s) for s in self.sentences[1:])]

    def text(self) -> str:
        return " ".join(u.text.strip() for u in self.units())


@dataclass(frozen=True)
class HotpotQuestion:
    qid: str
    question: str
    answer: str
    qtype: str | None
    docs: tuple[int, ...]  # indices into the corpus, in the record's order
    support: tuple[tuple[str, int], ...]
    extra: dict[str, Any]  # record fields kept for ``Task.metadata``


# how one document of a context becomes units: (its position in the context, the document) -> units,
# whose last ``len(doc.sentences)`` units are its sentences in order
RenderDoc = Callable[[int, HotpotDoc], list[Unit]]


class HotpotQAEnv(TaskSource):
    name = "hotpotqa"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        docs: int = 20,
        context_tokens: int | None = None,
    ) -> None:
        check_size_knobs(self.name, docs, context_tokens)
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._docs = docs
        self._context_tokens = context_tokens
        self._corpus, self._questions = read_hotpotqa(Path(data_path), keep=("level",))
        self._tokens = TokensOnce(count_tokens, lambda d: self._corpus[d].text())

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        gold = gold_docs(q, self._corpus)
        order = choose_documents(
            task_rng(self._seed, index),
            required=gold,
            own_optional=[d for d in q.docs if d not in gold],
            corpus_size=len(self._corpus),
            key_of=lambda d: self._corpus[d].title,
            tokens_of=self._tokens,
            docs=self._docs,
            context_tokens=self._context_tokens,
        )
        return build_task(self.name, q, self._corpus, order, lambda _, doc: doc.units(), self._count,
                          self._chunk_tokens)


def read_hotpotqa(
    path: Path, *, keep: Sequence[str] = (), need_type: bool = False
) -> tuple[list[HotpotDoc], list[HotpotQuestion]]:
    """The corpus (one entry per distinct (title, sentences)) and the questions of a file in HotpotQA's
    layout; ``keep`` names record fields copied (None when absent) into each question's ``extra``;
    ``need_type`` makes ``type`` a required string field."""
    records = need_list(read_json(path), f"{path}: top level")
    corpus: list[HotpotDoc] = []
    known: dict[HotpotDoc, int] = {}  # same title and text: one corpus entry
    questions = []
    for index, record in enumerate(records):
        place = where(path, index, record, "_id")
        doc_ids = []
        for j, entry in enumerate(field(record, "context", list, place)):
            doc = _parse_doc(entry, f"{place}: field 'context'[{j}]")
            if doc not in known:
                known[doc] = len(corpus)
                corpus.append(doc)
            doc_ids.append(known[doc])
        support = []
        for j, fact in enumerate(field(record, "supporting_facts", list, place)):
            if not (
                isinstance(fact, list)
                and len(fact) == 2
                and isinstance(fact[0], str)
                and isinstance(fact[1], int)
            ):
                raise EnvError(f"{place}: field 'supporting_facts'[{j}] must be [title, sentence index]")
            support.append((fact[0], fact[1]))
        questions.append(
            HotpotQuestion(
                qid=field(record, "_id", str, place),
                question=field(record, "question", str, place),
                answer=answer_text(field(record, "answer", str, place), "answer", place),
                qtype=field(record, "type", str, place) if need_type else record.get("type"),
                docs=tuple(doc_ids),
                support=tuple(support),
                extra={k: record.get(k) for k in keep},
            )
        )
    return corpus, questions


def gold_docs(q: HotpotQuestion, corpus: Sequence[HotpotDoc]) -> list[int]:
    """The question's own documents that a supporting fact names (by title), in the record's order."""
    titles = {title for title, _ in q.support}
    return [d for d in q.docs if corpus[d].title in titles]


def build_task(
    env: str,
    q: HotpotQuestion,
    corpus: Sequence[HotpotDoc],
    order: Sequence[int],
    render: RenderDoc,
    count: CountTokens,
    chunk_tokens: int,
) -> Task:
    """The task reading documents ``order`` of ``corpus``, each rendered by ``render``, packed into
    chunks; evidence and facts are the supporting sentences found in the context."""
    units: list[Unit] = []
    where_sentence: dict[tuple[str, int], int] = {}
    for position, d in enumerate(order):
        doc = corpus[d]
        rendered = render(position, doc)
        first = len(units) + len(rendered) - len(doc.sentences)
        for k in range(len(doc.sentences)):
            where_sentence[(doc.title, k)] = first + k
        units += rendered
    chunks = pack(units, count, chunk_tokens)
    found = [(t, k) for t, k in q.support if (t, k) in where_sentence]
    by_title = {corpus[d].title: corpus[d] for d in order}
    read = {where_sentence[f]: by_title[f[0]].sentences[f[1]].strip() for f in found}
    facts = sorted((last_chunk_of(chunks, u), u, text) for u, text in read.items() if text)
    return Task(
        task_id=q.qid,
        env=env,
        question=q.question,
        chunks=[c.text for c in chunks],
        answers=[q.answer],
        evidence=[by_title[t].sentences[k].strip() for t, k in found],
        evidence_chunks=chunk_indices(chunks, {where_sentence[f] for f in found}),
        facts=[Fact(text=text, chunk=chunk) for chunk, _, text in facts],
        category=q.qtype,
        metadata={
            **q.extra,
            "supporting_facts": [list(f) for f in q.support],
            "titles": [corpus[d].title for d in order],
        },
    )


def _parse_doc(entry: object, place: str) -> HotpotDoc:
    if not (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], list)
        and entry[1]
        and all(isinstance(s, str) for s in entry[1])
    ):
        raise EnvError(f"{place} must be [title, [sentences]] with at least one sentence")
    return HotpotDoc(entry[0], tuple(entry[1]))
