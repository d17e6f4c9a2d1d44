"""The ``log`` memory policy (PRO-LONG programmatic memory): an append-only episode log, read by searches.

Instead of rewriting a memory, the agent keeps everything:
- per chunk ``i``, one ``log_note`` call (question and chunk; ``max_new_tokens`` = ``memory_tokens``). The
  chunk, then the note (the call's output text, special tokens dropped, verbatim, even when empty) are
  appended to the log as entries ``2i`` (source ``chunk``) and ``2i + 1`` (source ``note``);
- then, in conditions ``full-log`` and ``windowed-log``, up to ``searches`` ``log_search`` calls. Each
  output is one query of ``agentmem.agent.log_query``'s language (or ``DONE``); its results, or the parse
  error, come back in the next prompt. Reads are never appended to the log. ``windowed-log`` searches only
  the last ``window`` entries;
- then the final ``answer`` call: the question and every search's results (``full-log``,
  ``windowed-log``), or the log itself, its newest entries first-fit within ``read_tokens`` tokens
  (``in-prompt``: no searches).
Results of one search are kept whole, best first, while they fit in ``read_tokens`` tokens (counted line by
line); a first result longer than that is cut to it.

The log is a pure function of the stored calls (``log_entries``), so the rollout writes each call's
entries to table ``memory_log`` in the transaction that stores the call, and a resumed episode's log equals
an uninterrupted one's. The oracle writes a note as the facts completed in its chunk, and a search as a
keyword query for the next gold fact (``DONE`` when none is left).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentmem.agent.log_query import (
    Done,
    Entry,
    ParseError,
    keyword_query,
    keyword_words,
    parse_query,
    search,
)
from agentmem.agent.memory import Call, MemoryPolicyBase, replay
from agentmem.agent.prompts import render
from agentmem.config import AgentConfig
from agentmem.errors import AgentError
from agentmem.records import Invocation, InvocationKind, LogEntry, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

NOTE = "log_note"
SEARCH = "log_search"
ANSWER = InvocationKind.answer.value

NOTE_PROMPT = (
    "Question: {question}\n\n"
    "New section of the text (log entry {seq}):\n{chunk}\n\n"
    "This section is kept word for word in your log. Write a short note of what in it may help answer the "
    "question; the note is added to the log too. Write only the note."
)
SEARCH_PROMPT = (
    "Question: {question}\n\n"
    "Your log has {n} entries: the sections of the text and your notes{window}. Search it with one query "
    "on one line:\n"
    "SEARCH regex /PATTERN/ LIMIT N\n"
    "SEARCH keywords WORD WORD ... LIMIT N\n"
    "or write DONE to answer now. Searches left: {left}.\n\n"
    "Your searches so far:\n{reads}"
)
ANSWER_SEARCHED = (
    "Question: {question}\n\n"
    "Your searches of the log:\n{reads}\n\n"
    "Answer the question from what you found. Reply with the short answer only."
)
ANSWER_IN_PROMPT = (
    "Question: {question}\n\n"
    "Your log:\n{log}\n\n"
    "Answer the question from your log. Reply with the short answer only."
)
NONE = "(none)"
_SEARCHES_LEFT = re.compile(r"Searches left: (\d+)\.")


class LogOptions(BaseModel):
    """The ``--memory-option`` values of the ``log`` policy: the condition, the search window (required with
    ``windowed-log`` and only there), how many searches (not with ``in-prompt``), and token limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    condition: Literal["full-log", "windowed-log", "in-prompt"] = "full-log"
    window: int | None = Field(None, ge=1, strict=True)
    searches: int = Field(3, ge=0, strict=True)
    read_tokens: int = Field(1024, ge=1, strict=True)
    query_tokens: int = Field(48, ge=1, strict=True)

    @model_validator(mode="after")
    def _condition(self) -> LogOptions:
        if (self.condition == "windowed-log") != (self.window is not None):
            raise ValueError("option 'window' is required with condition=windowed-log and only there")
        if self.condition == "in-prompt" and "searches" in self.model_fields_set:
            raise ValueError("option 'searches' does not apply to condition=in-prompt (it makes no searches)")
        return self


@dataclass(frozen=True)
class Read:
    """One search call: the query as written and what came back (results or an error text)."""

    query: str
    result: str


@dataclass(frozen=True)
class LogState:
    """The log, the chunks read, this question's searches and whether the agent said ``DONE``."""

    entries: tuple[Entry, ...] = ()
    chunks_read: int = 0
    reads: tuple[Read, ...] = ()
    done: bool = False


def chunk_seq(chunk_index: int) -> int:
    """The log position of chunk ``chunk_index``; its note follows at ``chunk_seq + 1``."""
    return 2 * chunk_index


class LogPolicy(MemoryPolicyBase[LogState]):
    """PRO-LONG's programmatic memory: see the module docstring."""

    name = "log"
    kinds = (NOTE, SEARCH, ANSWER)
    Options = LogOptions
    oracle = True

    def __init__(self, tokenizer: PreTrainedTokenizerBase, options: LogOptions, note_tokens: int,
                 answer_max_new_tokens: int):
        self.tokenizer = tokenizer
        self.options = options
        self.note_tokens = note_tokens
        self.answer_max_new_tokens = answer_max_new_tokens

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: LogOptions) -> LogPolicy:
        return cls(tokenizer, options, config.memory_tokens, config.answer_max_new_tokens)

    @property
    def searches(self) -> int:
        return 0 if self.options.condition == "in-prompt" else self.options.searches

    def initial_state(self, task: Task) -> LogState:
        return LogState()

    def next_call(self, state: LogState, task: Task) -> Call:
        i = state.chunks_read
        if i < len(task.chunks):
            text = NOTE_PROMPT.format(question=task.question, seq=chunk_seq(i), chunk=task.chunks[i])
            return Call(NOTE, render(self.tokenizer, text), self.note_tokens, chunk_text=task.chunks[i],
                        chunk_index=i)
        if not state.done and len(state.reads) < self.searches:
            window = "" if self.options.window is None else f"; searches see the last {self.options.window}"
            text = SEARCH_PROMPT.format(question=task.question, n=len(state.entries), window=window,
                                        left=self.searches - len(state.reads), reads=self._reads(state))
            return Call(SEARCH, render(self.tokenizer, text), self.options.query_tokens)
        if self.options.condition == "in-prompt":
            text = ANSWER_IN_PROMPT.format(question=task.question, log=self._in_prompt(state.entries))
        else:
            text = ANSWER_SEARCHED.format(question=task.question, reads=self._reads(state))
        return Call(ANSWER, render(self.tokenizer, text), self.answer_max_new_tokens, final=True)

    def consume(self, state: LogState, call: Call, output_ids: list[int], output_text: str) -> LogState:
        if call.kind == NOTE:
            if call.chunk_index != state.chunks_read or call.chunk_text is None:
                raise AgentError(f"log_note call for chunk {call.chunk_index}, but the log is at chunk "
                                 f"{state.chunks_read}")
            seq = chunk_seq(call.chunk_index)
            added = (Entry(seq, "chunk", call.chunk_text), Entry(seq + 1, "note", output_text))
            return replace(state, entries=state.entries + added, chunks_read=state.chunks_read + 1)
        if call.kind == SEARCH:
            query = output_text.strip()
            try:
                parsed = parse_query(query)
            except ParseError as exc:
                return replace(state, reads=(*state.reads, Read(query, f"error: {exc}")))
            if isinstance(parsed, Done):
                return replace(state, done=True)
            hits = search(self._searchable(state.entries), parsed)
            return replace(state, reads=(*state.reads, Read(query, self._results(hits))))
        return state

    def memory_text(self, state: LogState) -> str:
        """The notes (``[seq] note: text``) and the searches (``> query`` and results) so far; chunks are in
        each call's ``chunk_text``."""
        notes = [_line(e) for e in state.entries if e.source == "note"]
        reads = [f"> {r.query}\n{r.result}" for r in state.reads]
        return "\n".join(notes + reads + (["DONE"] if state.done else []))

    def resume(self, task: Task, stored: Sequence[Invocation]) -> LogState:
        return replay(self, task, stored)

    # -- the log, from stored calls ---------------------------------------------------------------------

    def log_entries(self, invocation: Invocation) -> list[LogEntry]:
        """The entries the stored call appended to its episode's log (none for searches and the answer)."""
        if invocation.kind != NOTE:
            return []
        if invocation.chunk_index is None or invocation.chunk_text is None:
            raise AgentError(f"invocation {invocation.id}: a log_note call without its chunk")
        seq = chunk_seq(invocation.chunk_index)
        common = {"episode_id": invocation.episode_id, "invocation_id": invocation.id,
                  "created_at": invocation.created_at}
        return [LogEntry(seq=seq, source="chunk", text=invocation.chunk_text, **common),
                LogEntry(seq=seq + 1, source="note", text=invocation.output_text, **common)]

    # -- the oracle -------------------------------------------------------------------------------------

    def oracle_text(self, call: Call, task: Task) -> str:
        """A note: the facts completed in its chunk, one a line, first-fit within the call's limit (room for
        eos); a search: a keyword query for the next gold fact (in ``task.facts`` order; its last words dropped
        while it is over the call's limit), ``DONE`` after."""
        if call.kind == NOTE and call.chunk_index is not None:
            kept: list[str] = []
            for fact in task.facts:
                text = fact.text.strip()
                if fact.chunk == call.chunk_index and text and \
                        self._tokens("\n".join([*kept, text])) <= call.max_new_tokens - 1:
                    kept.append(text)
            return "\n".join(kept)
        if call.kind == SEARCH:
            left = _SEARCHES_LEFT.search(call.prompt.text)
            if left is None:
                raise AgentError("a log_search prompt without its 'Searches left' line")
            n = self.searches - int(left.group(1))  # the searches made before this one
            facts = [f.text.strip() for f in task.facts if f.text.strip()]
            if n >= len(facts):
                return "DONE"
            words = keyword_words(facts[n])
            while len(words) > 1 and self._tokens(keyword_query(words, 2)) > call.max_new_tokens - 1:
                words = words[:-1]  # the query must fit the call's limit (with eos) to stay well formed
            return keyword_query(words, 2)
        raise AgentError(f"the oracle writes the log policy's {NOTE!r} and {SEARCH!r} calls, not {call.kind!r}")

    # -- rendering --------------------------------------------------------------------------------------

    def _searchable(self, entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
        window = self.options.window
        return entries if window is None else entries[-window:]

    def _tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    def _cut(self, text: str, budget: int) -> str:
        ids = self.tokenizer.encode(text, add_special_tokens=False)[:budget]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _fit(self, lines: list[str]) -> tuple[list[str], int]:
        """The first lines that fit in ``read_tokens`` (a first line over it is cut) and how many were left."""
        budget, kept, used = self.options.read_tokens, [], 0
        for line in lines:
            n = self._tokens(line)
            if used + n > budget:
                if not kept:
                    kept.append(self._cut(line, budget) + " ...(cut)")
                break
            kept.append(line)
            used += n
        return kept, len(lines) - len(kept)

    def _results(self, hits: list[Entry]) -> str:
        if not hits:
            return "(no entry matched)"
        kept, left = self._fit([_line(e) for e in hits])
        return "\n".join(kept + ([f"({left} more not shown: over the read budget)"] if left else []))

    def _reads(self, state: LogState) -> str:
        return "\n".join(f"> {r.query}\n{r.result}" for r in state.reads) or NONE

    def _in_prompt(self, entries: tuple[Entry, ...]) -> str:
        kept, left = self._fit([_line(e) for e in reversed(entries)])
        head = [f"({left} earlier entries not shown: over the read budget)"] if left else []
        return "\n".join(head + kept[::-1]) or NONE


def _line(entry: Entry) -> str:
    return f"[{entry.seq}] {entry.source}: {entry.text}"
