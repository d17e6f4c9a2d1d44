"""SQuAD v1.1 (official JSON: ``{data: [{title, paragraphs: [{context, qas: [{id, question, answers}]}]}]}``).

A task's long context is its own paragraph plus other paragraphs of the corpus, to ``docs`` documents or
``context_tokens`` tokens, in a seeded shuffle (see ``envs.documents``). Paragraphs are prefixed with
their article title and cut into sentences (at ., ! or ? before white space), so a chunk breaks inside a
paragraph only between sentences unless one sentence is over the budget.

Invariants: the file is fully checked when the environment is built (a question without answers, as in
SQuAD 2.0's unanswerable ones, is an error); ``answers`` are all gold texts, first occurrence order,
without repeats; ``evidence`` is the question's paragraph and ``evidence_chunks`` the chunks of that
paragraph that contain a gold answer (all its chunks if a split cuts through every answer); ``facts`` is
the sentence of the paragraph (as cut above, without the title) holding the first answer's
``answer_start`` offset, through the sentence where that answer ends when a cut falls inside it, with the
last chunk holding it (no fact when the offset is missing or outside the paragraph).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agentmem.records import Fact, Task
from envs.base import TaskSource, TokensOnce
from envs.chunking import Unit, chunk_indices, last_chunk_of, pack
from envs.documents import check_size_knobs, choose_documents
from envs.errors import EnvError
from envs.files import answer_text, field, need_list, read_json, where
from envs.selection import task_rng
from envs.types import CountTokens

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class _Question:
    qid: str
    question: str
    answers: tuple[str, ...]
    paragraph: int  # index into the corpus
    answer_start: int | None  # the first answer's character offset in the paragraph, when the file has one


class SquadEnv(TaskSource):
    name = "squad"

    def __init__(
        self,
        *,
        data_path: str | Path,
        count_tokens: CountTokens,
        chunk_tokens: int,
        seed: int,
        docs: int = 10,
        context_tokens: int | None = None,
    ) -> None:
        check_size_knobs(self.name, docs, context_tokens)
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._docs = docs
        self._context_tokens = context_tokens
        self._paragraphs: list[tuple[str, str]] = []  # (title, context)
        self._questions = self._read(Path(data_path))
        self._count_paragraph = TokensOnce(count_tokens, self._text)

    def _read(self, path: Path) -> list[_Question]:
        top = read_json(path)
        articles = need_list(field(top, "data", list, f"{path}: top level"), f"{path}: field 'data'")
        questions = []
        for a, article in enumerate(articles):
            place = where(path, f"data[{a}]", article, "title")
            title = field(article, "title", str, place)
            for p, paragraph in enumerate(field(article, "paragraphs", list, place)):
                p_place = f"{place} paragraphs[{p}]"
                context = field(paragraph, "context", str, p_place)
                self._paragraphs.append((title.replace("_", " "), context))
                for k, qa in enumerate(field(paragraph, "qas", list, p_place)):
                    q_place = where(path, f"data[{a}] paragraphs[{p}] qas[{k}]", qa, "id")
                    golds = [
                        answer_text(field(ans, "text", str, f"{q_place} answers[{j}]"), "text", q_place)
                        for j, ans in enumerate(field(qa, "answers", list, q_place))
                    ]
                    if not golds:
                        raise EnvError(f"{q_place}: field 'answers' is empty")
                    start = qa["answers"][0].get("answer_start")
                    questions.append(
                        _Question(
                            qid=field(qa, "id", str, q_place),
                            question=field(qa, "question", str, q_place),
                            answers=tuple(dict.fromkeys(golds)),
                            paragraph=len(self._paragraphs) - 1,
                            answer_start=start if type(start) is int and 0 <= start < len(context) else None,
                        )
                    )
        return questions

    def _text(self, p: int) -> str:
        title, context = self._paragraphs[p]
        return f"{title}: {context}"

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        order = choose_documents(
            task_rng(self._seed, index),
            required=[q.paragraph],
            own_optional=[],
            corpus_size=len(self._paragraphs),
            key_of=lambda p: p,
            tokens_of=self._count_paragraph,
            docs=self._docs,
            context_tokens=self._context_tokens,
        )
        units: list[Unit] = []
        own: set[int] = set()
        facts: list[tuple[int, str]] = []  # (unit, text) of the sentence holding the answer
        for p in order:
            sentences = _SENTENCE_END.split(self._text(p))
            if p == q.paragraph:
                own = set(range(len(units), len(units) + len(sentences)))
                facts = [(len(units) + k, text) for k, text in self._answer_sentence(q)]
            units += [Unit(sentences[0], sep="\n"), *(Unit(s) for s in sentences[1:])]
        chunks = pack(units, self._count, self._chunk_tokens)
        own_chunks = chunk_indices(chunks, own)
        with_answer = [i for i in own_chunks if any(a in chunks[i].text for a in q.answers)]
        return Task(
            task_id=q.qid,
            env=self.name,
            question=q.question,
            chunks=[c.text for c in chunks],
            answers=list(q.answers),
            evidence=[self._paragraphs[q.paragraph][1]],
            evidence_chunks=with_answer or own_chunks,
            facts=[Fact(text=text, chunk=last_chunk_of(chunks, u)) for u, text in facts],
            metadata={"title": self._paragraphs[q.paragraph][0], "paragraphs": order},
        )

    def _answer_sentence(self, q: _Question) -> list[tuple[int, str]]:
        """[(index among the paragraph's sentences, text without the title)] of the sentence holding the
        first answer's offset, extended to the sentence where that answer ends (the splitter also cuts
        after abbreviations such as "John D."); the index is the last sentence's. Empty without an
        offset."""
        if q.answer_start is None:
            return []
        title, _ = self._paragraphs[q.paragraph]
        text, prefix = self._text(q.paragraph), len(title) + 2  # "title: " precedes the paragraph
        first = prefix + q.answer_start
        last = min(first + max(len(q.answers[0]), 1) - 1, len(text) - 1)
        ends = list(_SENTENCE_END.finditer(text))
        i, j = (sum(1 for m in ends if m.end() <= offset) for offset in (first, last))
        start = ends[i - 1].end() if i else 0
        stop = ends[j].start() if j < len(ends) else len(text)
        sentence = text[max(start, prefix) : stop].strip()
        return [(j, sentence)] if sentence else []
