"""Events and views (MemPrism's relational memory, as text): the record, its line formats and the composer.

Pure: no model, no tokenizer, no I/O. ``agentmem.agent.events_memory`` builds the ``events`` memory policy on it.

An ``Event`` is one normalised fact: (entity, attribute, value, time, source). Normalisation, done on
construction so every Event is normalised:
- ``entity`` and ``value``: runs of whitespace become one space, the ends are stripped, and one trailing
  period is dropped (``" Oslo. "`` -> ``"Oslo"``); case is kept for display, and entities are matched
  case-insensitively (``key``: ``str.casefold``); neither may be empty or hold ``|`` (the field separator);
- ``attribute``: lower-cased, with spaces and hyphens as ``_`` (``"Born in"`` -> ``"born_in"``); it must then
  be letters, digits and ``_``, starting with a letter;
- ``time``: a whole number >= 0 the text gives, or None when it gives none; ``source``: the index of the chunk
  the event was read in. ``when`` is the event's clock: ``time``, else ``source``. Views order and filter by
  ``when``.

Formats (strict: a malformed line raises ``EventFormatError`` with a message naming what is wrong):
- an event line: ``EVENT entity | attribute | value | time``, ``time`` a whole number or ``-`` (none), e.g.
  ``EVENT Kobi | employer | Dorutek | -``; a record call's output is event lines, one a line, or ``NONE``;
- a view request, one line: ``VIEW <type> key=value ...`` with ``type`` one of
  - ``state``: the latest value (by ``when``) of each attribute of one entity; needs ``entity``;
  - ``timeline``: the matching events in time order; every key optional;
  - ``chain``: relations followed from one entity for ``depth`` steps (1..5, default 3): step 1 is the
    entity's events, step k the events of the values reached at step k-1, each entity expanded once;
    needs ``entity``;
  keys: ``entity=NAME`` (a name with spaces in double quotes: ``entity="New York"``; normalised as an event's
  entity, so ``entity=Kobi.`` names Kobi), ``attribute=ATTR`` (normalised as an event's attribute)
  (state and timeline), ``from=T`` and ``to=T`` (the range of ``when``, inclusive; every type), ``depth=D``
  (chain); each key at most once, e.g. ``VIEW timeline entity=Alice from=2 to=5``.

The composer (``compose``) renders a view as text: the canonical request line, then one line per event
(``state``: ``attribute: value (t=when)`` in attribute order; ``timeline``: ``t=when: entity | attribute |
value``; ``chain``: ``entity --attribute--> value (t=when)``, breadth first), or ``(no matching events)``.
Events of equal ``when`` keep their stored order (reading order).

The synthetic environment's extractor (``extract_events``) parses the generator's fact sentences exactly
(``envs.synthetic``'s templates; filler sentences match none): ``X works for Y.`` -> (X, employer, Y),
``X is headquartered in Y.`` -> (X, headquarters, Y), ``X is a city in Y.`` -> (X, country, Y), ``Y is the
mentor of X.`` -> (X, mentor, Y), ``X was born in Y.`` -> (X, birthplace, Y); the text gives no time
(``time`` None), and ``source`` is the chunk where the sentence ends (a sentence cut across chunks is read
whole there, as ``Task.facts`` counts it; sentences are matched with whitespace ignored, since a chunk end
may cut a word).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from agentmem.errors import AgentError


class EventFormatError(AgentError):
    """An event line or a view request that does not follow its format; the message says what is wrong."""


_ATTRIBUTE = re.compile(r"[a-z][a-z0-9_]*")


def _text_field(name: str, raw: str) -> str:
    text = " ".join(str(raw).split())
    if text.endswith("."):
        text = text[:-1].rstrip()
    if not text:
        raise EventFormatError(f"event {name} is empty")
    if "|" in text:
        raise EventFormatError(f"event {name} {text!r} holds '|', the field separator")
    return text


def normalise_attribute(raw: str) -> str:
    attribute = "_".join(str(raw).lower().replace("-", " ").split())
    if not _ATTRIBUTE.fullmatch(attribute):
        raise EventFormatError(f"event attribute {raw!r} is not a name of letters, digits and '_' "
                               "starting with a letter")
    return attribute


def key(name: str) -> str:
    """How entities (and values) are matched: case-insensitively."""
    return name.casefold()


@dataclass(frozen=True)
class Event:
    """One normalised fact (module docstring); constructing one normalises it or raises ``EventFormatError``."""

    entity: str
    attribute: str
    value: str
    time: int | None
    source: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "entity", _text_field("entity", self.entity))
        object.__setattr__(self, "attribute", normalise_attribute(self.attribute))
        object.__setattr__(self, "value", _text_field("value", self.value))
        for name, number in (("time", self.time), ("source", self.source)):
            if number is None and name == "time":
                continue
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise EventFormatError(f"event {name} must be a whole number >= 0, got {number!r}")

    @property
    def when(self) -> int:
        """The event's clock: its time, or the chunk it was read in when the text gives no time."""
        return self.source if self.time is None else self.time

    @property
    def identity(self) -> tuple[str, str, str, int | None]:
        """Two events with the same identity are one fact read twice (``merge`` keeps the first)."""
        return key(self.entity), self.attribute, key(self.value), self.time


def merge(events: Sequence[Event], new: Iterable[Event]) -> tuple[Event, ...]:
    """``events`` then each of ``new`` whose identity is not there yet, in order."""
    seen = {e.identity for e in events}
    out = list(events)
    for event in new:
        if event.identity not in seen:
            seen.add(event.identity)
            out.append(event)
    return tuple(out)


# -- event lines ------------------------------------------------------------------------------------------

EVENT_PREFIX = "EVENT"
NO_EVENTS = "NONE"


def format_event(event: Event) -> str:
    """The event as its line: ``EVENT entity | attribute | value | time`` (``-`` for no time)."""
    time = "-" if event.time is None else str(event.time)
    return f"{EVENT_PREFIX} {event.entity} | {event.attribute} | {event.value} | {time}"


def parse_event(line: str, source: int) -> Event:
    """The event of one line read in chunk ``source``; ``EventFormatError`` names what is wrong."""
    text = line.strip()
    head, _, rest = text.partition(" ")
    if head != EVENT_PREFIX:
        raise EventFormatError(f"an event line starts with {EVENT_PREFIX!r}, got {head[:40]!r}")
    fields = [f.strip() for f in rest.split("|")]
    if len(fields) != 4:
        raise EventFormatError(f"an event line has 4 fields separated by '|' (entity | attribute | value | "
                               f"time), got {len(fields)}")
    entity, attribute, value, time = fields
    if time == "-":
        when = None
    elif time.isdigit() and time.isascii():
        when = int(time)
    else:
        raise EventFormatError(f"event time must be a whole number >= 0 or '-', got {time[:40]!r}")
    return Event(entity, attribute, value, when, source)


@dataclass(frozen=True)
class Recorded:
    """What a record call's output gave: its events and the error of each line that did not parse."""

    events: tuple[Event, ...]
    errors: tuple[str, ...]


def parse_record(text: str, source: int) -> Recorded:
    """The events of a record call's output (read in chunk ``source``). Blank lines and a ``NONE`` line are
    skipped; a line that does not parse is dropped and its error kept: never an exception."""
    events, errors = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped == NO_EVENTS:
            continue
        try:
            events.append(parse_event(stripped, source))
        except EventFormatError as exc:
            errors.append(str(exc))
    return Recorded(tuple(events), tuple(errors))


# -- view requests ------------------------------------------------------------------------------------------

VIEW_PREFIX = "VIEW"
VIEW_TYPES = ("state", "timeline", "chain")
VIEW_KEYS = ("entity", "attribute", "from", "to", "depth")
DEFAULT_DEPTH = 3
MAX_DEPTH = 5
_ARGUMENT = re.compile(r'([^\s=]*)=("[^"]*"|[^\s"]*)(?=\s|$)')


@dataclass(frozen=True)
class ViewRequest:
    """One parsed view request (module docstring). ``start``/``end`` are ``from``/``to``; ``depth`` is set
    for chain views only."""

    kind: str
    entity: str | None = None
    attribute: str | None = None
    start: int | None = None
    end: int | None = None
    depth: int | None = None

    def line(self) -> str:
        """The canonical request line: keys in the order entity, attribute, from, to, depth."""
        parts = [VIEW_PREFIX, self.kind]
        if self.entity is not None:
            parts.append(f"entity={quote(self.entity)}")
        if self.attribute is not None:
            parts.append(f"attribute={self.attribute}")
        if self.start is not None:
            parts.append(f"from={self.start}")
        if self.end is not None:
            parts.append(f"to={self.end}")
        if self.depth is not None:
            parts.append(f"depth={self.depth}")
        return " ".join(parts)


def quote(name: str) -> str:
    """A name as a view argument: in double quotes when it holds a space."""
    return f'"{name}"' if " " in name else name


def _whole(name: str, raw: str) -> int:
    if not (raw.isdigit() and raw.isascii()):
        raise EventFormatError(f"{name} must be a whole number >= 0, got {raw!r}")
    return int(raw)


def parse_view(text: str) -> ViewRequest:
    """The view request of a view call's output; ``EventFormatError`` names what is wrong."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        raise EventFormatError("empty view request: write one line 'VIEW state|timeline|chain key=value ...'")
    if len(lines) > 1:
        raise EventFormatError(f"a view request is one line, got {len(lines)} lines")
    head, _, rest = lines[0].strip().partition(" ")
    if head != VIEW_PREFIX:
        raise EventFormatError(f"a view request starts with {VIEW_PREFIX!r}, got {head[:40]!r}")
    kind, _, rest = rest.strip().partition(" ")
    if not kind:
        raise EventFormatError(f"VIEW needs a view type: {', '.join(VIEW_TYPES)}")
    if kind not in VIEW_TYPES:
        raise EventFormatError(f"unknown view type {kind[:40]!r}: use {', '.join(VIEW_TYPES)}")
    args = _arguments(rest.strip())
    if kind in ("state", "chain") and "entity" not in args:
        raise EventFormatError(f"a {kind} view needs entity=NAME")
    if "depth" in args and kind != "chain":
        raise EventFormatError("depth applies to chain views only")
    if "attribute" in args and kind == "chain":
        raise EventFormatError("attribute applies to state and timeline views only")
    start = _whole("from", args["from"]) if "from" in args else None
    end = _whole("to", args["to"]) if "to" in args else None
    if start is not None and end is not None and start > end:
        raise EventFormatError(f"from={start} is after to={end}")
    depth = None
    if kind == "chain":
        depth = _whole("depth", args["depth"]) if "depth" in args else DEFAULT_DEPTH
        if not 1 <= depth <= MAX_DEPTH:
            raise EventFormatError(f"depth must be 1 to {MAX_DEPTH}, got {depth}")
    attribute = normalise_attribute(args["attribute"]) if "attribute" in args else None
    entity = None
    if "entity" in args:  # normalised as an event's entity is, so ``entity=Kobi.`` names Kobi
        entity = " ".join(args["entity"].split()).removesuffix(".").rstrip()
        if not entity:
            raise EventFormatError("argument 'entity' is empty")
    return ViewRequest(kind, entity, attribute, start, end, depth)


def _arguments(rest: str) -> dict[str, str]:
    args: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        if rest[pos].isspace():
            pos += 1
            continue
        match = _ARGUMENT.match(rest, pos)
        if match is None or not match.group(1):
            token = rest[pos:].split()[0]
            if token.count('"') % 2 or ('="' in token and not token.endswith('"')):
                raise EventFormatError(f"argument {token[:40]!r} has an unclosed quote")
            raise EventFormatError(f"argument {token[:40]!r} is not key=value")
        name, raw = match.group(1), match.group(2)
        if name not in VIEW_KEYS:
            raise EventFormatError(f"unknown argument {name[:40]!r}: use {', '.join(VIEW_KEYS)}")
        if name in args:
            raise EventFormatError(f"argument {name!r} given twice")
        value = raw[1:-1] if raw.startswith('"') else raw
        if not value.strip():
            raise EventFormatError(f"argument {name!r} is empty")
        args[name] = value
        pos = match.end()
    return args


# -- the composer -----------------------------------------------------------------------------------------

NO_MATCH = "(no matching events)"


def compose(events: Sequence[Event], request: ViewRequest) -> str:
    """The view ``request`` over ``events`` as text (module docstring); a pure function of its arguments."""
    in_range = [e for e in _ordered(events)
                if (request.start is None or e.when >= request.start) and (request.end is None or e.when <= request.end)]
    if request.kind == "state":
        body = _state(in_range, request)
    elif request.kind == "timeline":
        body = [f"t={e.when}: {e.entity} | {e.attribute} | {e.value}" for e in in_range
                if _matches(e, request.entity, request.attribute)]
    else:
        body = _chain(in_range, request)
    return "\n".join([request.line(), *(body or [NO_MATCH])])


def _ordered(events: Sequence[Event]) -> list[Event]:
    return sorted(events, key=lambda e: e.when)  # stable: equal clocks keep reading order


def _matches(event: Event, entity: str | None, attribute: str | None) -> bool:
    return ((entity is None or key(event.entity) == key(entity))
            and (attribute is None or event.attribute == attribute))


def _state(events: list[Event], request: ViewRequest) -> list[str]:
    latest: dict[str, Event] = {}
    for event in events:
        if _matches(event, request.entity, request.attribute):
            latest[event.attribute] = event  # ordered by clock: the last one is the latest
    return [f"{a}: {e.value} (t={e.when})" for a, e in sorted(latest.items())]


def _chain(events: list[Event], request: ViewRequest) -> list[str]:
    assert request.entity is not None and request.depth is not None
    frontier, seen, lines = {key(request.entity)}, {key(request.entity)}, []
    for _ in range(request.depth):
        step = [e for e in events if key(e.entity) in frontier]
        lines += [f"{e.entity} --{e.attribute}--> {e.value} (t={e.when})" for e in step]
        frontier = {key(e.value) for e in step} - seen
        seen |= frontier
        if not frontier:
            break
    return lines


# -- the synthetic environment's extractor ----------------------------------------------------------------

_NAME = r"([A-Z][a-z]+)"
# (pattern, attribute, group of the entity, group of the value): one per fact template of envs.synthetic,
# matched with all whitespace removed (the chunker may cut a long sentence, even a word, at a chunk end)
SYNTHETIC_PATTERNS: tuple[tuple[re.Pattern[str], str, int, int], ...] = (
    (re.compile(rf"{_NAME}worksfor{_NAME}\."), "employer", 1, 2),
    (re.compile(rf"{_NAME}isheadquarteredin{_NAME}\."), "headquarters", 1, 2),
    (re.compile(rf"{_NAME}isacityin{_NAME}\."), "country", 1, 2),
    (re.compile(rf"{_NAME}isthementorof{_NAME}\."), "mentor", 2, 1),
    (re.compile(rf"{_NAME}wasbornin{_NAME}\."), "birthplace", 1, 2),
)
_SENTENCE_END = re.compile(r"(?<=\.)\s+")


def extract_sentence(sentence: str, source: int) -> Event | None:
    """The event of one synthetic fact sentence (None for any other sentence, e.g. filler)."""
    text = "".join(sentence.split())
    for pattern, attribute, entity, value in SYNTHETIC_PATTERNS:
        match = pattern.fullmatch(text)
        if match:
            return Event(match.group(entity), attribute, match.group(value), None, source)
    return None


def extract_events(chunks: Sequence[str]) -> tuple[Event, ...]:
    """Every synthetic fact stated in ``chunks``, in reading order, each with the chunk where its sentence
    ends; an unfinished sentence at a chunk's end is carried into the next chunk (exact: no model)."""
    events: list[Event] = []
    pending = ""
    for index, chunk in enumerate(chunks):
        text = f"{pending} {chunk}".strip() if pending else chunk.strip()
        sentences = _SENTENCE_END.split(text) if text else []
        pending = sentences.pop() if sentences and not sentences[-1].endswith(".") else ""
        events += [e for s in sentences if (e := extract_sentence(s, index)) is not None]
    return merge((), events)
