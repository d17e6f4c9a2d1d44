"""QuALITY multiple choice over long articles, from either official layout, told apart line by line:

- QuALITY's own JSON lines (``QuALITY.v1.0.1.htmlstripped.dev``): ``{article_id, title, article,
  questions: [{question, options (4), gold_label (1-based), question_unique_id, difficult, ...}]}``;
- L-Eval's ``quality.jsonl``: ``{input (the article), instructions: [question with its options embedded
  as "(A) ..." ...], outputs: ["(B) ..." ...]}``.

A line of neither shape is an ``EnvError`` naming the line. A task's long context is its article, cut
into sentences (a line's first sentence starts a new line), so a chunk breaks between sentences unless
one alone is over the budget; every question of an article reads the same chunks. The question lists
the options one a line, ``(A) ...``, ``(B) ...``; the gold answer is ``"(<letter>) <option>"``.

Scoring is accuracy. ``parse_choice`` reads the option letter strictly: after an optional ``Answer:``
(any case), a leading ``(B)`` or ``B)`` (anything may follow), or the whole prediction ``B`` or ``B.``;
anything else (``b``, ``The answer is B``, the option's text alone) is wrong. ``score`` puts the
accuracy (1 or 0) in all three fields: ``f1 = em = sub_em = accuracy``.

Invariants: the file is fully checked when the environment is built; options are at least two, lettered
from A; a QuALITY question without ``gold_label`` (the test split's) is an error naming its line and
question; task ids are ``question_unique_id`` (QuALITY) or ``line<N>/q<k>`` (L-Eval, which has no
ids). QuALITY has no evidence annotations, so ``evidence``, ``evidence_chunks`` and ``facts`` are empty:
the oracle writes an empty memory and answers the gold option.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmem.records import Task
from envs.base import TaskSource
from envs.chunking import Chunk, Unit, pack
from envs.errors import EnvError
from envs.files import field, need_list, read_jsonl, where_line
from envs.metrics import Scores
from envs.types import CountTokens

LETTERS = string.ascii_uppercase
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ANSWER_PREFIX = re.compile(r"answer\s*:\s*", re.IGNORECASE)
_LEADING = re.compile(r"\(?([A-Z])\)")  # "(B)" or "B)" at the start
_ALONE = re.compile(r"([A-Z])\.?")  # "B" or "B." as the whole prediction
_OPTION_MARK = re.compile(r"\(([A-Z])\)")


@dataclass(frozen=True)
class _Question:
    qid: str
    article: int  # index into the articles
    question: str
    options: tuple[str, ...]
    gold: int  # 0-based
    metadata: dict[str, Any]


def parse_choice(prediction: str) -> str | None:
    """The option letter a prediction names, read strictly (see the module docstring), or None."""
    text = prediction.strip()
    prefix = _ANSWER_PREFIX.match(text)
    if prefix:
        text = text[prefix.end() :].strip()
    match = _LEADING.match(text) or _ALONE.fullmatch(text)
    return match.group(1) if match else None


def render_question(question: str, options: tuple[str, ...]) -> str:
    return "\n".join([question.strip(), *(f"({LETTERS[i]}) {o}" for i, o in enumerate(options))])


class QualityEnv(TaskSource):
    name = "quality"

    def __init__(self, *, data_path: str | Path, count_tokens: CountTokens, chunk_tokens: int, seed: int) -> None:
        super().__init__(count_tokens=count_tokens, chunk_tokens=chunk_tokens, seed=seed)
        self._articles: list[str] = []
        self._questions: list[_Question] = []
        path = Path(data_path)
        for number, record in read_jsonl(path):
            self._read_line(path, number, record)
        self._chunks: dict[int, list[Chunk]] = {}

    def score(self, prediction: str, task: Task) -> Scores:
        hit = float(parse_choice(prediction) == task.metadata["gold"])
        return Scores(f1=hit, em=hit, sub_em=hit)

    def _read_line(self, path: Path, number: int, record: Any) -> None:
        if isinstance(record, dict) and {"article", "questions"} <= record.keys():
            place = where_line(path, number, record, "article_id")
            questions = [
                _quality_question(q, f"{place} questions[{k}]") for k, q in enumerate(field(record, "questions", list, place))
            ]
            article = field(record, "article", str, place)
        elif isinstance(record, dict) and {"input", "instructions", "outputs"} <= record.keys():
            place = where_line(path, number, record, "source")
            instructions = need_list(record["instructions"], f"{place}: field 'instructions'")
            outputs = need_list(record["outputs"], f"{place}: field 'outputs'")
            if len(instructions) != len(outputs):
                raise EnvError(f"{place}: fields 'instructions' and 'outputs' differ in length "
                               f"({len(instructions)}, {len(outputs)})")
            questions = [
                _leval_question(i, o, f"line{number}/q{k}", f"{place} instructions[{k}]")
                for k, (i, o) in enumerate(zip(instructions, outputs, strict=True))
            ]
            article = field(record, "input", str, place)
        else:
            raise EnvError(f"{path}: line {number} is neither a QuALITY record (article, questions) nor an "
                           f"L-Eval record (input, instructions, outputs)")
        if not article.strip():
            raise EnvError(f"{place}: the article is empty")
        self._articles.append(article)
        self._questions += [_Question(**{**q, "article": len(self._articles) - 1}) for q in questions]

    def _article_chunks(self, a: int) -> list[Chunk]:
        if a not in self._chunks:
            units = []
            for line in self._articles[a].splitlines():
                sentences = [s for s in _SENTENCE_END.split(line.strip()) if s]
                units += [Unit(s, sep="\n" if k == 0 else " ") for k, s in enumerate(sentences)]
            self._chunks[a] = pack(units, self._count, self._chunk_tokens)
        return self._chunks[a]

    def _build(self, index: int) -> Task:
        q = self._questions[index]
        gold = LETTERS[q.gold]
        return Task(
            task_id=q.qid,
            env=self.name,
            question=render_question(q.question, q.options),
            chunks=[c.text for c in self._article_chunks(q.article)],
            answers=[f"({gold}) {q.options[q.gold]}"],
            metadata={**q.metadata, "gold": gold, "options": list(q.options)},
        )


def _quality_question(q: Any, place: str) -> dict[str, Any]:
    options = field(q, "options", list, place)
    if len(options) < 2 or not all(isinstance(o, str) and o.strip() for o in options):
        raise EnvError(f"{place}: field 'options' must be at least two non-empty strings")
    if "gold_label" not in q:
        raise EnvError(f"{place}: missing field 'gold_label' (QuALITY's test split has no labels)")
    label = field(q, "gold_label", int, place)
    if not 1 <= label <= len(options):
        raise EnvError(f"{place}: field 'gold_label' must be 1 to {len(options)}, got {label}")
    return {
        "qid": field(q, "question_unique_id", str, place),
        "question": field(q, "question", str, place),
        "options": tuple(o.strip() for o in options),
        "gold": label - 1,
        "metadata": {"format": "quality", **({"difficult": q["difficult"]} if "difficult" in q else {})},
    }


def _split_options(text: str) -> tuple[str, tuple[str, ...]]:
    """(question, options) of an L-Eval instruction: the first "(A)", the first "(B)" after it, and so on
    mark the options (so an option may mention "(A)" itself)."""
    marks: list[int] = []
    for letter in LETTERS:
        at = text.find(f"({letter})", marks[-1] + 3 if marks else 0)
        if at < 0:
            break
        marks.append(at)
    ends = [*marks[1:], len(text)] if marks else []
    options = tuple(" ".join(text[m + 3 : e].split()) for m, e in zip(marks, ends, strict=True))
    return (text[: marks[0]] if marks else text), options


def _leval_question(instruction: Any, output: Any, qid: str, place: str) -> dict[str, Any]:
    if not isinstance(instruction, str) or not isinstance(output, str):
        raise EnvError(f"{place}: instructions and outputs must be strings")
    question, options = _split_options(instruction)
    if len(options) < 2 or not all(options) or not question.strip():
        raise EnvError(f"{place}: the instruction must be a question then options (A), (B), ... in order")
    gold = _OPTION_MARK.match(output.strip())
    if gold is None or LETTERS.index(gold.group(1)) >= len(options):
        raise EnvError(f"{place}: output {output[:40]!r} does not start with one of its options' letters")
    return {
        "qid": qid,
        "question": question,
        "options": options,
        "gold": LETTERS.index(gold.group(1)),
        "metadata": {"format": "leval", "output": output},
    }
