"""HotpotQA (official JSON: ``_id, question, answer, type, level, supporting_facts, context``).

A task's long context is its own paragraphs (the supporting ones always) plus paragraphs of other
questions, to ``docs`` documents or ``context_tokens`` tokens, in a seeded shuffle (see
``envs.documents``). Units are sentences; a document's first sentence carries its title.

Invariants: the file is fully checked when the environment is built; ``evidence`` holds the supporting
sentences (supporting facts that point past a paragraph's end, a known quirk of the official files, are
skipped) and ``evidence_chunks`` the chunks that hold them; ``facts`` the same sentences (without the
title a document's first sentence carries in the chunk), in reading order, each with the last chunk
holding it; ``category`` is the question type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentmem.records import Fact, Task
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.documents import check_size_knobs, choose_documents
from envs.errors import EnvError
from envs.files import answer_text, field, need_list, read_json, where
from envs.metrics import Scores, score_answer
from envs.selection import take, task_rng
from envs.types import CountTokens


@dataclass(frozen=True)
class _Doc:
    title: str
    sentences: tuple[str, ...]

    def units(self) -> list[Unit]:
        first = Unit(f"{self.title}: {self.sentences[0].strip()}", sep="\n")
        return [first, *(Unit(s) for s in self.sentences[1:])]

    def text(self) -> str:
        return " ".join(u.text.strip() for u in self.units())


@dataclass(frozen=True)
class _Question:
    qid: str
    question: str
    answer: str
    qtype: str | None
    level: str | None
    docs: tuple[int, ...]  # indices into the corpus
    support: tuple[tuple[str, int], ...]


class HotpotQAEnv:
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
        self._count = count_tokens
        self._chunk_tokens = chunk_tokens
        self._seed = seed
        self._docs = docs
        self._context_tokens = context_tokens
        self._corpus: list[_Doc] = []
        self._questions = self._read(Path(data_path))
        self._doc_tokens: dict[int, int] = {}

    def tasks(self, n: int | None = None) -> list[Task]:
        return [self._build(i) for i in take(len(self._questions), n, self._seed)]

    def score(self, prediction: str, task: Task) -> Scores:
        return score_answer(prediction, task.answers)

    def _read(self, path: Path) -> list[_Question]:
        records = need_list(read_json(path), f"{path}: top level")
        known: dict[_Doc, int] = {}  # same title and text: one corpus entry
        questions = []
        for index, record in enumerate(records):
            place = where(path, index, record, "_id")
            doc_ids = []
            for j, entry in enumerate(field(record, "context", list, place)):
                doc = _parse_doc(entry, f"{place}: field 'context'[{j}]")
                if doc not in known:
                    known[doc] = len(self._corpus)
                    self._corpus.append(doc)
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
                _Question(
                    qid=field(record, "_id", str, place),
                    question=field(record, "question", str, place),
                    answer=answer_text(field(record, "answer", str, place), "answer", place),
                    qtype=record.get("type"),
                    level=record.get("level"),
                    docs=tuple(doc_ids),
                    support=tuple(support),
                )
            )
        return questions

    def _tokens(self, doc_id: int) -> int:
        if doc_id not in self._doc_tokens:
            self._doc_tokens[doc_id] = self._count(self._corpus[doc_id].text())
        return self._doc_tokens[doc_id]

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        gold_titles = {title for title, _ in q.support}
        order = choose_documents(
            task_rng(self._seed, index),
            required=[d for d in q.docs if self._corpus[d].title in gold_titles],
            own_optional=[d for d in q.docs if self._corpus[d].title not in gold_titles],
            corpus_size=len(self._corpus),
            key_of=lambda d: self._corpus[d].title,
            tokens_of=self._tokens,
            docs=self._docs,
            context_tokens=self._context_tokens,
        )
        units: list[Unit] = []
        where_sentence: dict[tuple[str, int], int] = {}
        for d in order:
            doc = self._corpus[d]
            for k, unit in enumerate(doc.units()):
                where_sentence[(doc.title, k)] = len(units)
                units.append(unit)
        chunks = pack(units, self._count, self._chunk_tokens)
        found = [(t, k) for t, k in q.support if (t, k) in where_sentence]
        by_title = {self._corpus[d].title: self._corpus[d] for d in order}
        read = {where_sentence[f]: by_title[f[0]].sentences[f[1]].strip() for f in found}
        facts = sorted((last_chunk_of(chunks, u), u, text) for u, text in read.items() if text)
        return Task(
            task_id=q.qid,
            env=self.name,
            question=q.question,
            chunks=[c.text for c in chunks],
            answers=[q.answer],
            evidence=[by_title[t].sentences[k].strip() for t, k in found],
            evidence_chunks=chunk_indices(chunks, {where_sentence[f] for f in found}),
            facts=[Fact(text=text, chunk=chunk) for chunk, _, text in facts],
            category=q.qtype,
            metadata={
                "level": q.level,
                "supporting_facts": [list(f) for f in q.support],
                "titles": [self._corpus[d].title for d in order],
            },
        )


def _parse_doc(entry: object, place: str) -> _Doc:
    if not (
        isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], str)
        and isinstance(entry[1], list)
        and entry[1]
        and all(isinstance(s, str) for s in entry[1])
    ):
        raise EnvError(f"{place} must be [title, [sentences]] with at least one sentence")
    return _Doc(entry[0], tuple(entry[1]))
