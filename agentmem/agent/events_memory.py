"""The ``events`` memory policy (MemPrism's relational views, as text): record events, pick a view, answer.

The memory is a list of normalised events (``agentmem.agent.events``). An episode makes these calls, in order:
1. a recorder turns each chunk into events. With ``recorder=model`` (the default) that is one ``event_record``
   call per chunk (question, section, format): its output is event lines (or ``NONE``); a line that does not
   parse is dropped and counted (``EventsState.dropped``, shown in the memory text), never an error. With
   ``recorder=rules`` there is no call per chunk: the synthetic environment's exact extractor
   (``events.extract_events``) runs on every readable chunk in ``initial_state``, so the episode's first call
   is already the view call (every chunk is still read, by the rules, before any view is chosen);
2. one ``event_view`` call (question and a catalogue of the entities and attributes held; at most
   ``CATALOGUE_ENTITIES`` entities are listed) whose output is one view request line. The composer renders
   it over the events; a request that does not parse gives the view text ``VIEW ERROR: <message>`` and the
   episode goes on;
3. the final ``answer`` call with (question, view text), the view cut to ``view_tokens`` tokens at whole
   lines (the request line is always kept, and a cut view ends with ``(N more lines cut)``).

Options (``--memory-option KEY=VALUE``): ``recorder=model|rules`` (default ``model``; ``rules`` is the synthetic
extractor, for the synthetic environment only: on another environment it finds no events),
``view_tokens=N`` (default ``memory_tokens``), ``record_tokens=N`` (an ``event_record`` call's
``max_new_tokens``; default ``memory_tokens``). The view call's limit is ``VIEW_REQUEST_TOKENS``; the answer's
``answer_max_new_tokens``. ``prompt_layout`` does not apply: these prompts have one layout.

The oracle (``oracle_text``) writes, for ``event_record`` at chunk i, the gold events of the chunk: the task's
facts complete at chunk i, parsed by the synthetic extractor, one event line each (``NONE`` when there are
none; another environment's facts are free text the extractor cannot parse: ``NONE``); for ``event_view``,
the view that covers the gold evidence (``oracle_view``).

The state is a value; ``resume`` replays the stored calls (``memory.replay``), so a killed rollout resumes exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentmem.agent.events import (
    NO_EVENTS,
    Event,
    EventFormatError,
    ViewRequest,
    compose,
    extract_events,
    extract_sentence,
    format_event,
    key,
    merge,
    parse_record,
    parse_view,
    quote,
)
from agentmem.agent.memory import Call, MemoryPolicyBase, replay
from agentmem.agent.prompts import render
from agentmem.config import AgentConfig
from agentmem.errors import AgentError
from agentmem.records import Invocation, InvocationKind, Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

RECORD = "event_record"
VIEW = "event_view"
ANSWER = InvocationKind.answer.value
VIEW_REQUEST_TOKENS = 48
CATALOGUE_ENTITIES = 40

RECORD_PROMPT = (
    "Question: {question}\n\n"
    "Section {number} of {total} of the text:\n{chunk}\n\n"
    "Write each fact of this section as an event, one per line:\n"
    "EVENT entity | attribute | value | time\n"
    "The attribute is a short lowercase name (employer, birthplace, mentor); the time is a number the text "
    "gives, or - when it gives none. Write NONE if the section states no fact."
)

VIEW_PROMPT = (
    "Question: {question}\n\n"
    "Your event memory holds {count} events about: {entities}.\n"
    "Attributes: {attributes}.\n\n"
    "Choose the view of your memory that answers the question. Reply with one line, one of:\n"
    "VIEW state entity=NAME [attribute=ATTR] [from=T] [to=T]\n"
    "VIEW timeline [entity=NAME] [attribute=ATTR] [from=T] [to=T]\n"
    "VIEW chain entity=NAME [depth=D] [from=T] [to=T]\n"
    "state: the latest value of each attribute of one entity; timeline: events in time order; chain: "
    "relations followed from one entity for D steps (default 3)."
)

ANSWER_PROMPT = (
    "Question: {question}\n\n"
    "Your memory view:\n{view}\n\n"
    "Answer the question from this view. Reply with the short answer only."
)

NOTHING = "(none)"
VIEW_ERROR = "VIEW ERROR: {message}"


@dataclass(frozen=True)
class EventsState:
    """The events recorded so far, how many chunks were read, how many event lines were dropped, and the
    composed view text once the view call is consumed (None before)."""

    events: tuple[Event, ...] = ()
    chunks_read: int = 0
    dropped: int = 0
    view: str | None = None


class EventsOptions(BaseModel):
    """The policy's ``--memory-option`` values: ``recorder`` (``model``: a call per chunk writes its events;
    ``rules``: the synthetic generator's rules extract them, no call), and the view and record calls' token
    limits (default: ``memory_tokens``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recorder: Literal["model", "rules"] = "model"
    view_tokens: int | None = Field(None, ge=1, strict=True)
    record_tokens: int | None = Field(None, ge=1, strict=True)


class EventsPolicy(MemoryPolicyBase[EventsState]):
    """Events recorded per chunk (by a model call or the synthetic rules), one view, one answer."""

    name = "events"
    kinds = (RECORD, VIEW, ANSWER)
    Options = EventsOptions
    oracle = True

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: EventsOptions):
        self.tokenizer = tokenizer
        self.recorder = options.recorder
        self.view_tokens = options.view_tokens or config.memory_tokens
        self.record_tokens = options.record_tokens or config.memory_tokens
        self.answer_max_new_tokens = config.answer_max_new_tokens

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, config: AgentConfig, options: EventsOptions) -> EventsPolicy:
        return cls(tokenizer, config, options)

    # -- the MemoryPolicy contract ------------------------------------------------------------------------

    def initial_state(self, task: Task) -> EventsState:
        if self.recorder == "rules":
            return EventsState(extract_events(task.chunks), len(task.chunks))
        return EventsState()

    def next_call(self, state: EventsState, task: Task) -> Call:
        i = state.chunks_read
        if i < len(task.chunks):
            chunk = task.chunks[i]
            text = RECORD_PROMPT.format(question=task.question, number=i + 1, total=len(task.chunks), chunk=chunk)
            return Call(RECORD, render(self.tokenizer, text), self.record_tokens, chunk_text=chunk, chunk_index=i)
        if state.view is None:
            return Call(VIEW, render(self.tokenizer, view_prompt_text(task.question, state.events)),
                        VIEW_REQUEST_TOKENS)
        return Call(ANSWER, render(self.tokenizer, ANSWER_PROMPT.format(question=task.question, view=state.view)),
                    self.answer_max_new_tokens, final=True)

    def consume(self, state: EventsState, call: Call, output_ids: list[int], output_text: str) -> EventsState:
        if call.kind == RECORD:
            if call.chunk_index != state.chunks_read:
                raise AgentError(f"event_record call for chunk {call.chunk_index}, but chunk {state.chunks_read} "
                                 "is next")
            recorded = parse_record(output_text, state.chunks_read)
            return replace(state, events=merge(state.events, recorded.events), chunks_read=state.chunks_read + 1,
                           dropped=state.dropped + len(recorded.errors))
        if call.kind == VIEW:
            return replace(state, view=self.view_text(state.events, output_text))
        return state

    def memory_text(self, state: EventsState) -> str:
        lines = [format_event(e) for e in state.events]
        if state.dropped:
            lines.append(f"(malformed event lines dropped: {state.dropped})")
        if state.view is not None:
            lines += ["", state.view]
        return "\n".join(lines).strip()

    def resume(self, task: Task, stored: Sequence[Invocation]) -> EventsState:
        return replay(self, task, stored)

    # -- views and the oracle -----------------------------------------------------------------------------

    def view_text(self, events: Sequence[Event], request_text: str) -> str:
        """The view a request line gives over ``events``, cut to ``view_tokens`` tokens; an error view when
        the request does not parse."""
        try:
            request = parse_view(request_text)
        except EventFormatError as exc:
            return VIEW_ERROR.format(message=exc)
        return self.cut(compose(events, request))

    def cut(self, view: str) -> str:
        """``view`` whole when it fits ``view_tokens``; else its longest line prefix that fits with a last
        line ``(N more lines cut)``; the request line is always kept."""
        lines = view.split("\n")
        if self._tokens(view) <= self.view_tokens:
            return view
        for k in range(len(lines) - 1, 0, -1):
            text = "\n".join([*lines[:k], f"({len(lines) - k} more lines cut)"])
            if self._tokens(text) <= self.view_tokens or k == 1:
                return text
        return view  # a one-line view: nothing to cut at a line

    def oracle_text(self, call: Call, task: Task) -> str:
        if call.kind == RECORD:
            assert call.chunk_index is not None
            events = [e for e in gold_events(task) if e.source == call.chunk_index]
            return "\n".join(format_event(e) for e in events) or NO_EVENTS
        if call.kind == VIEW:
            return oracle_view(task).line()
        raise AgentError(f"memory policy 'events' makes no {call.kind!r} call the oracle could write")

    def _tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


def view_prompt_text(question: str, events: Sequence[Event]) -> str:
    """The view call's user message: the question and the catalogue of what the events are about."""
    entities: dict[str, str] = {}
    for event in events:
        entities.setdefault(key(event.entity), event.entity)
    names = [quote(n) for n in entities.values()]
    listed = ", ".join(names[:CATALOGUE_ENTITIES])
    if len(names) > CATALOGUE_ENTITIES:
        listed += f" and {len(names) - CATALOGUE_ENTITIES} more"
    attributes = ", ".join(sorted({e.attribute for e in events}))
    return VIEW_PROMPT.format(question=question, count=len(events), entities=listed or NOTHING,
                              attributes=attributes or NOTHING)


def gold_events(task: Task) -> list[Event]:
    """The events of the task's facts (each read at the fact's chunk), in reading order: those the synthetic
    extractor can parse."""
    return [e for f in task.facts if (e := extract_sentence(f.text, f.chunk)) is not None]


def oracle_view(task: Task) -> ViewRequest:
    """The view that covers the gold evidence (``task.evidence`` in chain order, parsed by the synthetic
    extractor): one event -> the ``state`` of its entity; events that link into a relation chain (each one's
    entity is the value before it) -> the ``chain`` from the first entity, as deep as the chain; events all
    about one entity -> its ``state``; otherwise, or when none parses (another environment), the whole
    ``timeline``."""
    events = [e for s in task.evidence if (e := extract_sentence(s, 0)) is not None]
    if not events:
        return ViewRequest("timeline")
    first = events[0].entity
    if len({key(e.entity) for e in events}) == 1:
        return ViewRequest("state", entity=first)
    if all(key(b.entity) == key(a.value) for a, b in zip(events, events[1:], strict=False)):
        return ViewRequest("chain", entity=first, depth=len(events))
    return ViewRequest("timeline")
