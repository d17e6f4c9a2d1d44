"""The ``events`` memory policy (MemPrism views, as text): the event record and its normalisation, the synthetic
extractor, the strict event-line and view-request parsers, the composer's exact text, the policy driven by a
scripted backend (exact prompts and stored rows), oracle rollouts that pick the views covering the evidence,
replay and scoring like overwrite's, exact resume after a kill, and SFT / the train loop on events runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import KilledBackend, canonical_calls, register_policy, stored_calls

from agentmem.agent.events import (
    Event,
    EventFormatError,
    ViewRequest,
    compose,
    extract_events,
    extract_sentence,
    format_event,
    parse_event,
    parse_record,
    parse_view,
)
from agentmem.agent.events_memory import (
    EventsPolicy,
    EventsState,
    gold_events,
    oracle_view,
)
from agentmem.agent.loop import AgentLoop, ListSink
from agentmem.agent.prompts import render
from agentmem.agent.registry import memory_policy
from agentmem.backends.scripted import ScriptedBackend
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import (
    AgentConfig,
    DistillConfig,
    Oversize,
    RolloutConfig,
    ScoreConfig,
    SftConfig,
    TrainConfig,
)
from agentmem.errors import AgentError
from agentmem.jobs.rollout import build_env, run_rollout
from agentmem.jobs.score import run_score
from agentmem.jobs.sft import run_sft
from agentmem.jobs.train import run_train
from agentmem.records import Episode, EpisodeStatus, Fact, Task, TeacherContext
from agentmem.replay import rebuild_aligned
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer
from agentmem.training.scoring import LoadedModel
from agentmem.training.selection import select
from envs import load_env
from envs.synthetic import _TEMPLATES
from store import repository as repo

SYNTH = {"context_tokens": 120, "distractors": 1, "hops": 1}


def events_config(recorder: str = "model", **options) -> AgentConfig:
    return AgentConfig(memory_policy="events", memory_options={"recorder": recorder, **options}, memory_tokens=64,
                       answer_max_new_tokens=8, max_batch=4, seed=1)


# --- events and their normalisation ----------------------------------------------------------------------


def test_an_event_is_normalised_on_construction():
    e = Event("  Kobi \n Dora ", "Works-for  now", " Dorutek. ", None, 2)
    assert (e.entity, e.attribute, e.value, e.time, e.source, e.when) == ("Kobi Dora", "works_for_now", "Dorutek",
                                                                         None, 2, 2)
    assert Event("a", "b", "c", 7, 2).when == 7
    assert Event("Kobi", "x", "y", None, 0).identity == Event("KOBI", "X", "Y.", None, 3).identity
    with pytest.raises(EventFormatError, match="^event entity is empty$"):
        Event(" . ", "a", "b", None, 0)
    with pytest.raises(EventFormatError, match=r"^event source must be a whole number >= 0, got -1$"):
        Event("a", "b", "c", None, -1)


# --- the synthetic extractor -----------------------------------------------------------------------------


def test_extractor_is_exact_on_known_chunks():
    chunks = [
        "The busy market opened at dusk. Kobi works for Dorutek. Lodi is the mentor",
        "of Gasu. Dorutek is headquartered in Lomaport. A quiet river was busy every summer. Fuva",
        "port is a city in Lizaland. Gasu was born in Reziport. Kobi works for Dorutek.",
        "The library was repaired after the rain.",
    ]
    assert extract_events(chunks) == (
        Event("Kobi", "employer", "Dorutek", None, 0),
        Event("Gasu", "mentor", "Lodi", None, 1),  # read whole at the chunk where it ends
        Event("Dorutek", "headquarters", "Lomaport", None, 1),
        Event("Fuvaport", "country", "Lizaland", None, 2),  # a word cut at a chunk end
        Event("Gasu", "birthplace", "Reziport", None, 2),
    )  # the repeated fact is kept once, filler gives nothing
    assert extract_sentence("The small bakery was busy in the morning.", 0) is None
    assert extract_sentence("Kobi works for dorutek.", 0) is None  # names are capitalised words


def test_extractor_parses_every_fact_template_of_the_generator():
    for template in _TEMPLATES:
        for text in template.facts:
            event = extract_sentence(text.format("Abe", "Bod"), 4)
            assert event is not None and event.source == 4 and event.time is None
            assert {event.entity, event.value} == {"Abe", "Bod"}


@pytest.mark.parametrize("chunk_tokens", [8, 48])
@pytest.mark.parametrize("level", [1, 3, 4])
def test_extractor_finds_every_fact_of_generated_tasks(chunk_tokens, level):
    """Every fact sentence of the task (evidence and distractors) and nothing else, each at the chunk where it
    ends: at 8 tokens a chunk, sentences and words are cut across chunks."""
    tok = tiny_tokenizer()
    env = load_env("synthetic", seed=3, chunk_tokens=chunk_tokens, level=level,
                   count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]))
    for task in env.tasks(5):
        events = extract_events(task.chunks)
        hops, distractors = {1: (1, 1), 3: (2, 3), 4: (3, 4)}[level]
        assert len(events) == hops * (1 + distractors)
        gold = gold_events(task)
        assert len(gold) == hops and set(gold) <= set(events)
        assert [e.source for e in gold] == [f.chunk for f in task.facts]


# --- the event-line parser ----------------------------------------------------------------------------------


def test_event_lines_parse_exactly():
    assert parse_event("EVENT Kobi | Works for | Dorutek | 12", 3) == Event("Kobi", "works_for", "Dorutek", 12, 3)
    assert parse_event("  EVENT New  York |born_in|  Alice. | -  ", 0) == Event("New York", "born_in", "Alice",
                                                                                  None, 0)
    event = Event("Kobi", "employer", "Dorutek", None, 1)
    assert format_event(event) == "EVENT Kobi | employer | Dorutek | -"
    assert parse_event(format_event(event), 1) == event


@pytest.mark.parametrize(("line", "message"), [
    ("", "an event line starts with 'EVENT', got ''"),
    ("Kobi | employer | Dorutek | -", "an event line starts with 'EVENT', got 'Kobi'"),
    ("event Kobi | employer | Dorutek | -", "an event line starts with 'EVENT', got 'event'"),
    ("EVENT Kobi | employer | Dorutek", "an event line has 4 fields separated by '|' (entity | attribute | value "
                                        "| time), got 3"),
    ("EVENT Kobi | employer | Dorutek | - | x", "an event line has 4 fields separated by '|' (entity | "
                                                "attribute | value | time), got 5"),
    ("EVENT  | employer | Dorutek | -", "event entity is empty"),
    ("EVENT Kobi | employer | . | -", "event value is empty"),
    ("EVENT Kobi | works for! | Dorutek | -", "event attribute 'works for!' is not a name of letters, digits and "
                                              "'_' starting with a letter"),
    ("EVENT Kobi | 2nd | Dorutek | -", "event attribute '2nd' is not a name of letters, digits and '_' starting "
                                       "with a letter"),
    ("EVENT Kobi | employer | Dorutek | yesterday", "event time must be a whole number >= 0 or '-', got "
                                                    "'yesterday'"),
    ("EVENT Kobi | employer | Dorutek | -3", "event time must be a whole number >= 0 or '-', got '-3'"),
])
def test_malformed_event_lines_are_rejected_with_a_clear_message(line, message):
    with pytest.raises(EventFormatError) as err:
        parse_event(line, 0)
    assert str(err.value) == message


def test_a_record_output_keeps_good_lines_and_counts_the_rest():
    text = "EVENT Kobi | employer | Dorutek | -\n\nNONE\nKobi likes tea\nEVENT Lodi | mentor of | Gasu | 4\nEVENT x"
    recorded = parse_record(text, 2)
    assert recorded.events == (Event("Kobi", "employer", "Dorutek", None, 2), Event("Lodi", "mentor_of", "Gasu", 4, 2))
    assert recorded.errors == ("an event line starts with 'EVENT', got 'Kobi'",
                               "an event line has 4 fields separated by '|' (entity | attribute | value | time), "
                               "got 1")
    assert parse_record("NONE", 0).events == () and parse_record("NONE", 0).errors == ()


# --- the view-request parser ------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("VIEW state entity=Kobi", ViewRequest("state", entity="Kobi")),
    (" VIEW timeline entity=Alice from=2 to=5 \n", ViewRequest("timeline", entity="Alice", start=2, end=5)),
    ("VIEW timeline", ViewRequest("timeline")),
    ("VIEW timeline attribute=Born-in to=3", ViewRequest("timeline", attribute="born_in", end=3)),
    ('VIEW chain entity="New  York" depth=2 from=1', ViewRequest("chain", entity="New York", start=1, depth=2)),
    ("VIEW chain entity=Kobi", ViewRequest("chain", entity="Kobi", depth=3)),
    ("VIEW state entity=Kobi.", ViewRequest("state", entity="Kobi")),
    ("VIEW state to=4 attribute=employer entity=Kobi", ViewRequest("state", entity="Kobi", attribute="employer",
                                                                   end=4)),
])
def test_view_requests_parse_exactly(text, want):
    parsed = parse_view(text)
    assert parsed == want
    assert parse_view(parsed.line()) == parsed


def test_the_canonical_request_line():
    assert ViewRequest("chain", entity="New York", start=1, depth=2).line() == 'VIEW chain entity="New York" from=1 ' \
                                                                              'depth=2'
    assert parse_view("VIEW state to=4 entity=Kobi").line() == "VIEW state entity=Kobi to=4"


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty view request: write one line 'VIEW state|timeline|chain key=value ...'"),
    ("VIEW state entity=Kobi\nVIEW timeline", "a view request is one line, got 2 lines"),
    ("SHOW state entity=Kobi", "a view request starts with 'VIEW', got 'SHOW'"),
    ("VIEW", "VIEW needs a view type: state, timeline, chain"),
    ("VIEW table entity=Kobi", "unknown view type 'table': use state, timeline, chain"),
    ("VIEW state Kobi", "argument 'Kobi' is not key=value"),
    ("VIEW timeline =Kobi", "argument '=Kobi' is not key=value"),
    ("VIEW state who=Kobi", "unknown argument 'who': use entity, attribute, from, to, depth"),
    ("VIEW state entity=Kobi entity=Lodi", "argument 'entity' given twice"),
    ('VIEW state entity="New York', "argument 'entity=\"New' has an unclosed quote"),
    ("VIEW state entity=", "argument 'entity' is empty"),
    ("VIEW state entity=.", "argument 'entity' is empty"),
    ("VIEW state attribute=employer", "a state view needs entity=NAME"),
    ("VIEW chain depth=2", "a chain view needs entity=NAME"),
    ("VIEW timeline from=two", "from must be a whole number >= 0, got 'two'"),
    ("VIEW timeline to=-1", "to must be a whole number >= 0, got '-1'"),
    ("VIEW timeline from=5 to=2", "from=5 is after to=2"),
    ("VIEW timeline depth=2", "depth applies to chain views only"),
    ("VIEW chain entity=Kobi depth=9", "depth must be 1 to 5, got 9"),
    ("VIEW chain entity=Kobi attribute=employer", "attribute applies to state and timeline views only"),
    ("VIEW state entity=Kobi attribute=a!", "event attribute 'a!' is not a name of letters, digits and '_' starting "
                                            "with a letter"),
])
def test_malformed_view_requests_are_rejected_with_a_clear_message(text, message):
    with pytest.raises(EventFormatError) as err:
        parse_view(text)
    assert str(err.value) == message


# --- the composer -------------------------------------------------------------------------------------------

EVENTS = (
    Event("Kobi", "employer", "Dorutek", None, 0),
    Event("Dorutek", "headquarters", "Lomaport", None, 1),
    Event("Kobi", "mentor", "Lodi", None, 1),
    Event("Lomaport", "country", "Lizaland", 9, 2),
    Event("Kobi", "employer", "Zetacorp", 4, 2),
    Event("Lodi", "birthplace", "Fuvaport", None, 3),
    Event("Lizaland", "neighbour", "Kobi", None, 3),  # a cycle back to the start
)


@pytest.mark.parametrize(("request_line", "text"), [
    ("VIEW state entity=kobi",
     "VIEW state entity=kobi\nemployer: Zetacorp (t=4)\nmentor: Lodi (t=1)"),
    ("VIEW state entity=Kobi to=3",  # the state as of t=3: the later employer is out of range
     "VIEW state entity=Kobi to=3\nemployer: Dorutek (t=0)\nmentor: Lodi (t=1)"),
    ("VIEW state entity=Kobi attribute=mentor", "VIEW state entity=Kobi attribute=mentor\nmentor: Lodi (t=1)"),
    ("VIEW state entity=Nobody", "VIEW state entity=Nobody\n(no matching events)"),
    ("VIEW timeline",
     "VIEW timeline\nt=0: Kobi | employer | Dorutek\nt=1: Dorutek | headquarters | Lomaport\nt=1: Kobi | mentor | Lodi\n"
     "t=3: Lodi | birthplace | Fuvaport\nt=3: Lizaland | neighbour | Kobi\nt=4: Kobi | employer | Zetacorp\n"
     "t=9: Lomaport | country | Lizaland"),
    ("VIEW timeline entity=Kobi from=1 to=5",
     "VIEW timeline entity=Kobi from=1 to=5\nt=1: Kobi | mentor | Lodi\nt=4: Kobi | employer | Zetacorp"),
    ("VIEW timeline attribute=employer", "VIEW timeline attribute=employer\nt=0: Kobi | employer | Dorutek\n"
                                         "t=4: Kobi | employer | Zetacorp"),
    ("VIEW timeline from=10", "VIEW timeline from=10\n(no matching events)"),
    ("VIEW chain entity=Kobi depth=1",
     "VIEW chain entity=Kobi depth=1\nKobi --employer--> Dorutek (t=0)\nKobi --mentor--> Lodi (t=1)\n"
     "Kobi --employer--> Zetacorp (t=4)"),
    ("VIEW chain entity=Kobi",
     "VIEW chain entity=Kobi depth=3\nKobi --employer--> Dorutek (t=0)\nKobi --mentor--> Lodi (t=1)\n"
     "Kobi --employer--> Zetacorp (t=4)\nDorutek --headquarters--> Lomaport (t=1)\n"
     "Lodi --birthplace--> Fuvaport (t=3)\nLomaport --country--> Lizaland (t=9)"),
    ("VIEW chain entity=Dorutek depth=5",  # the cycle: Kobi's events are listed, Dorutek is not expanded again
     "VIEW chain entity=Dorutek depth=5\nDorutek --headquarters--> Lomaport (t=1)\nLomaport --country--> Lizaland "
     "(t=9)\nLizaland --neighbour--> Kobi (t=3)\nKobi --employer--> Dorutek (t=0)\nKobi --mentor--> Lodi (t=1)\n"
     "Kobi --employer--> Zetacorp (t=4)\nLodi --birthplace--> Fuvaport (t=3)"),
    ("VIEW chain entity=Kobi depth=2 to=2",
     "VIEW chain entity=Kobi to=2 depth=2\nKobi --employer--> Dorutek (t=0)\nKobi --mentor--> Lodi (t=1)\n"
     "Dorutek --headquarters--> Lomaport (t=1)"),
])
def test_composer_gives_exact_text(request_line, text):
    assert compose(EVENTS, parse_view(request_line)) == text


# --- the policy, driven by a scripted backend ------------------------------------------------------------

QUESTION = "In which city is the company that Kobi works for headquartered?"
TASK = Task(task_id="t1", env="synthetic", question=QUESTION, answers=["Lomaport"],
            chunks=["The market opened at dusk. Kobi works for Dorutek.", "Dorutek is headquartered in Lomaport.",
                    "The river was busy."],
            evidence=["Kobi works for Dorutek.", "Dorutek is headquartered in Lomaport."], evidence_chunks=[0, 1],
            facts=[Fact(text="Kobi works for Dorutek.", chunk=0),
                   Fact(text="Dorutek is headquartered in Lomaport.", chunk=1)])
RECORD_USER = (
    f"Question: {QUESTION}\n\nSection {{n}} of 3 of the text:\n{{chunk}}\n\n"
    "Write each fact of this section as an event, one per line:\nEVENT entity | attribute | value | time\n"
    "The attribute is a short lowercase name (employer, birthplace, mentor); the time is a number the text gives, "
    "or - when it gives none. Write NONE if the section states no fact."
)
VIEW_USER = (
    f"Question: {QUESTION}\n\nYour event memory holds {{count}} events about: {{entities}}.\n"
    "Attributes: {attributes}.\n\n"
    "Choose the view of your memory that answers the question. Reply with one line, one of:\n"
    "VIEW state entity=NAME [attribute=ATTR] [from=T] [to=T]\n"
    "VIEW timeline [entity=NAME] [attribute=ATTR] [from=T] [to=T]\n"
    "VIEW chain entity=NAME [depth=D] [from=T] [to=T]\n"
    "state: the latest value of each attribute of one entity; timeline: events in time order; chain: relations "
    "followed from one entity for D steps (default 3)."
)
ANSWER_USER = (f"Question: {QUESTION}\n\nYour memory view:\n{{view}}\n\n"
               "Answer the question from this view. Reply with the short answer only.")


def scripted(tok, view: str = "VIEW chain entity=Kobi depth=2"):
    def reply(prompt):
        text = tok.decode(prompt)
        if "Section 1 of 3" in text:
            return "EVENT Kobi | employer | Dorutek | -\nKobi likes tea"
        if "Section 2 of 3" in text:
            return "EVENT Dorutek | headquarters | Lomaport | 7"
        if "Section 3 of 3" in text:
            return "NONE"
        if "Choose the view" in text:
            return view
        return "Lomaport"
    return reply


def run_one(config: AgentConfig, reply, task: Task = TASK):
    tok = tiny_tokenizer()
    backend = ScriptedBackend(tok, reply)
    loop = AgentLoop(backend, config, lambda p, t: load_env("synthetic", seed=0, chunk_tokens=48,
                                                              count_tokens=len).score(p, t))
    sink = ListSink()
    episode = Episode(run_id="r", env="synthetic", task_id=task.task_id, question=task.question,
                      gold_answers=task.answers)
    loop.run([loop.start(episode, task)], sink)
    return backend, sink


def test_model_recorder_episode_has_exact_prompts_and_rows():
    tok = tiny_tokenizer()
    backend, sink = run_one(events_config("model", view_tokens=200), scripted(tok))
    view = ("VIEW chain entity=Kobi depth=2\nKobi --employer--> Dorutek (t=0)\n"
            "Dorutek --headquarters--> Lomaport (t=7)")
    users = [*(RECORD_USER.format(n=i + 1, chunk=c) for i, c in enumerate(TASK.chunks)),
             VIEW_USER.format(count=2, entities="Kobi, Dorutek", attributes="employer, headquarters"),
             ANSWER_USER.format(view=view)]
    assert backend.seen_prompts == [render(tok, u).ids for u in users]
    calls = sink.all_invocations
    assert [c.kind for c in calls] == ["event_record"] * 3 + ["event_view", "answer"]
    assert [c.step for c in calls] == [0, 1, 2, 3, 4]
    assert [c.chunk_index for c in calls] == [0, 1, 2, None, None]
    assert [c.chunk_text for c in calls] == [*TASK.chunks, None, None]
    assert {c.memory_policy for c in calls} == {"events"}
    assert [c.prompt_ids.tolist() for c in calls] == backend.seen_prompts
    e1 = "EVENT Kobi | employer | Dorutek | -"
    e2 = "EVENT Dorutek | headquarters | Lomaport | 7"
    dropped = "(malformed event lines dropped: 1)"
    assert [c.memory_after for c in calls] == [
        f"{e1}\n{dropped}", f"{e1}\n{e2}\n{dropped}", f"{e1}\n{e2}\n{dropped}", f"{e1}\n{e2}\n{dropped}\n\n{view}",
        f"{e1}\n{e2}\n{dropped}\n\n{view}"]
    assert calls[0].memory_before == ""
    assert all(b.memory_before == a.memory_after for a, b in zip(calls, calls[1:], strict=False))
    (episode,) = sink.finished
    assert episode.status is EpisodeStatus.answered and episode.prediction == "Lomaport" and episode.f1 == 1.0


def test_a_malformed_view_request_gives_an_error_view_and_the_episode_goes_on():
    tok = tiny_tokenizer()
    backend, sink = run_one(events_config("model"), scripted(tok, view="SHOW me Kobi"))
    error = "VIEW ERROR: a view request starts with 'VIEW', got 'SHOW'"
    assert backend.seen_prompts[-1] == render(tok, ANSWER_USER.format(view=error)).ids
    assert sink.all_invocations[3].memory_after.endswith(f"\n\n{error}")
    assert sink.finished[0].status is EpisodeStatus.answered


def test_rules_recorder_reads_every_chunk_without_a_call():
    tok = tiny_tokenizer()
    backend, sink = run_one(events_config("rules", view_tokens=200), scripted(tok, "VIEW state entity=Dorutek"))
    users = [VIEW_USER.format(count=2, entities="Kobi, Dorutek", attributes="employer, headquarters"),
             ANSWER_USER.format(view="VIEW state entity=Dorutek\nheadquarters: Lomaport (t=1)")]
    assert backend.seen_prompts == [render(tok, u).ids for u in users]
    calls = sink.all_invocations
    assert [c.kind for c in calls] == ["event_view", "answer"]
    assert calls[0].memory_before == "EVENT Kobi | employer | Dorutek | -\nEVENT Dorutek | headquarters | Lomaport | -"
    assert sink.finished[0].status is EpisodeStatus.answered  # every chunk was read, by the rules


def test_a_view_over_its_budget_is_cut_at_whole_lines():
    tok = tiny_tokenizer()
    view = compose(EVENTS, parse_view("VIEW timeline"))
    lines = view.split("\n")
    kept = "\n".join([*lines[:3], "(5 more lines cut)"])
    budget = len(tok.encode(kept, add_special_tokens=False))
    policy = memory_policy(tok, events_config(view_tokens=budget))
    assert policy.cut(view) == kept
    assert memory_policy(tok, events_config(view_tokens=10_000)).cut(view) == view
    assert memory_policy(tok, events_config(view_tokens=1)).cut(view) == f"{lines[0]}\n(7 more lines cut)"  # the request stays


KNOWN = "; known: recorder, view_tokens, record_tokens"


@pytest.mark.parametrize(("options", "message"), [
    ({"recorder": "regex"}, "memory policy 'events': bad --memory-option (recorder: Input should be 'model' or "
                            "'rules')" + KNOWN),
    ({"recoder": "rules"}, "memory policy 'events': bad --memory-option (recoder: unknown option)"
                           + KNOWN),
    ({"view_tokens": 0}, "memory policy 'events': bad --memory-option (view_tokens: Input should be greater than or "
                         "equal to 1)" + KNOWN),
    ({"record_tokens": "many"}, "memory policy 'events': bad --memory-option (record_tokens: Input should be a valid "
                                "integer)" + KNOWN),
])
def test_options_are_validated_by_name(options, message):
    config = AgentConfig(memory_policy="events", memory_options=options)
    with pytest.raises(AgentError) as err:
        memory_policy(tiny_tokenizer(), config)
    assert str(err.value) == message


def test_defaults_and_options_from_config():
    tok = tiny_tokenizer()
    policy = memory_policy(tok, AgentConfig(memory_policy="events", memory_tokens=40, answer_max_new_tokens=9))
    assert isinstance(policy, EventsPolicy)
    assert (policy.recorder, policy.view_tokens, policy.record_tokens, policy.answer_max_new_tokens) == (
        "model", 40, 40, 9)
    policy = memory_policy(tok, events_config("rules", view_tokens=99, record_tokens=7))
    assert (policy.recorder, policy.view_tokens, policy.record_tokens) == ("rules", 99, 7)
    assert policy.initial_state(TASK) == EventsState(extract_events(TASK.chunks), 3)


# --- stored rollouts ----------------------------------------------------------------------------------------


def synthetic_reply(tok):
    def reply(prompt):
        text = tok.decode(prompt)
        if "Write each fact" in text:
            return f"EVENT Kobi | seen | n{len(prompt) % 7} | -\nbad line"
        if "Choose the view" in text:
            return "VIEW timeline entity=Kobi" if len(prompt) % 2 else "VIEW nothing"
        return "Oslo"
    return reply


def rollout_config(recorder="model", **kw) -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                         agent=events_config(recorder), **kw)


def canonical(episodes, invs):
    return canonical_calls(episodes, invs, "memory_policy", "prompt_text", "output_ids", "chunk_index",
                           "memory_before", "memory_after")


def test_rollout_stores_the_events_calls(store):
    tok = tiny_tokenizer()
    policy = register_policy(store, "/models/tiny", "tiny")
    result = run_rollout(store, rollout_config(), backend=ScriptedBackend(tok, synthetic_reply(tok)), policy=policy)
    episodes, invs = stored_calls(store, result.run_id)
    tasks = {t.task_id: t for t in build_env(rollout_config(), tok).tasks(3)}
    assert len(episodes) == 6 and all(e.status is EpisodeStatus.answered for e in episodes)
    for ep in episodes:
        calls = sorted((i for i in invs if i.episode_id == ep.id), key=lambda i: i.step)
        n = len(tasks[ep.task_id].chunks)
        assert [c.kind for c in calls] == ["event_record"] * n + ["event_view", "answer"]
        assert [c.chunk_index for c in calls] == [*range(n), None, None]
        assert {c.memory_policy for c in calls} == {"events"}
        assert f"(malformed event lines dropped: {n})" in calls[-1].memory_before
    with store.session() as s:
        views = list(repo.stream_invocations(s, run_ids=[result.run_id], kinds=["event_view"]))
    assert len(views) == 6



@pytest.mark.parametrize("calls_before_kill", [2, 5])
def test_killed_rollout_resumes_with_the_same_rows(sqlite_store, calls_before_kill):
    tok = tiny_tokenizer()
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    whole = run_rollout(sqlite_store, rollout_config(), backend=ScriptedBackend(tok, synthetic_reply(tok)),
                        policy=policy)
    want = canonical(*stored_calls(sqlite_store, whole.run_id))
    killed = KilledBackend(tok, synthetic_reply(tok))
    killed.left = calls_before_kill
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, rollout_config(), backend=killed, policy=policy)
    with sqlite_store.session() as s:
        run_id = next(r.run.id for r in repo.list_runs(s) if r.run.id != whole.run_id)
    _, partial = stored_calls(sqlite_store, run_id)
    assert 0 < len(partial) < len(want)
    result = run_rollout(sqlite_store, None, backend=ScriptedBackend(tok, synthetic_reply(tok)), policy=policy,
                         resume=run_id)
    assert result.resumed_episodes > 0
    episodes, invs = stored_calls(sqlite_store, run_id)
    assert all(e.status is EpisodeStatus.answered for e in episodes)
    assert canonical(episodes, invs) == want
    kept = {i.id: i for i in invs}
    assert all(kept[old.id].output_ids.tolist() == old.output_ids.tolist() for old in partial)


# --- the oracle ---------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_folder(tmp_path) -> str:
    return save_tiny(tmp_path / "tiny")


def oracle_config(folder: str, level: int, recorder: str, episodes: int = 3) -> RolloutConfig:
    return RolloutConfig(model=folder, policy="oracle", env_knobs={"level": level}, chunk_tokens=48, episodes=episodes,
                         agent=AgentConfig(memory_policy="events", memory_options={"recorder": recorder},
                                           memory_tokens=160, answer_max_new_tokens=16))


@pytest.mark.parametrize("recorder", ["rules", "model"])
@pytest.mark.parametrize(("level", "kind"), [(1, "state"), (3, "chain")])
def test_oracle_rollout_picks_the_views_that_cover_the_evidence(sqlite_store, tiny_folder, recorder, level, kind):
    tok = tiny_tokenizer()
    config = oracle_config(tiny_folder, level, recorder)
    result = run_rollout(sqlite_store, config)
    episodes, invs = stored_calls(sqlite_store, result.run_id)
    tasks = {t.task_id: t for t in build_env(config, tok).tasks(config.episodes)}
    assert all(e.f1 == 1.0 and e.status is EpisodeStatus.answered for e in episodes)
    for ep in episodes:
        task = tasks[ep.task_id]
        calls = sorted((i for i in invs if i.episode_id == ep.id), key=lambda i: i.step)
        assert all(c.role == "oracle" and c.output_logprobs is None for c in calls)
        view, answer = calls[-2:]
        subject = gold_events(task)[0].entity if level == 1 else None
        request = oracle_view(task)
        assert request.kind == kind
        if kind == "state":
            assert request == ViewRequest("state", entity=subject)
        else:
            first = extract_sentence(task.evidence[0], 0)
            assert request == ViewRequest("chain", entity=first.entity, depth=2)
        assert view.kind == "event_view" and view.output_text == request.line()
        shown = answer.memory_before.split("\n\n")[-1]  # the composed view
        assert shown.startswith(request.line() + "\n") and task.answers[0] in shown
        assert answer.output_text == task.answers[0]
        if recorder == "model":
            records = calls[:-2]
            assert [c.chunk_index for c in records] == list(range(len(task.chunks)))
            for c in records:
                gold = [format_event(e) for e in gold_events(task) if e.source == c.chunk_index]
                assert c.output_text == ("\n".join(gold) or "NONE")
        else:
            assert len(calls) == 2


def test_oracle_view_falls_back_to_the_timeline_without_parsable_evidence():
    task = TASK.model_copy(update={"evidence": ["On day 3 Bob moved to Oslo."]})
    assert oracle_view(task) == ViewRequest("timeline")
    assert oracle_view(TASK.model_copy(update={"evidence": TASK.evidence[1:]})) == ViewRequest("state",
                                                                                               entity="Dorutek")


# --- training on events runs ----------------------------------------------------------------------------------


def test_sft_on_an_oracle_events_run_trains_the_view_calls(sqlite_store, tiny_folder, tmp_path):
    """``rollout --policy oracle --memory events --memory-option recorder=rules`` then ``agentmem sft`` on it:
    the selected calls are the view and answer calls, and the loss is finite and goes down."""
    result = run_rollout(sqlite_store, oracle_config(tiny_folder, 3, "rules", episodes=2))
    selection = select(sqlite_store, [result.run_id])
    assert [i.kind for i in selection.invocations] == ["event_view", "answer"] * 2
    sft = run_sft(sqlite_store, SftConfig(run_ids=[result.run_id], student=tiny_folder, out=str(tmp_path / "ckpt"), optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=64)))
    losses = [h.loss for h in sft.history]
    assert all(math.isfinite(x) for x in losses) and losses[1] < losses[0]
    assert sft.history[0].metrics["actions"] == sum(i.output_tokens for i in selection.invocations)
    views = select(sqlite_store, [result.run_id], kinds=["event_view"]).invocations  # `agentmem sft --kinds event_view`
    config = SftConfig(run_ids=[result.run_id], student=tiny_folder, kinds="event_view", out=str(tmp_path / "ckpt"), optim=dict(steps=1), batch=dict(invocations_per_step=64))
    assert config.kinds == ["event_view"] and [i.kind for i in views] == ["event_view"] * 2
    only_views = run_sft(sqlite_store, config)
    assert only_views.history[0].metrics["actions"] == sum(i.output_tokens for i in views)


def test_the_train_loop_accepts_an_events_rollout(sqlite_store, tiny_folder, tmp_path):
    config = TrainConfig(
        rounds=1,
        rollout=RolloutConfig(env_knobs=SYNTH, episodes=2, group_size=2, chunk_tokens=48,
                              agent=AgentConfig(memory_policy="events", memory_options={"recorder": "rules"},
                                                memory_tokens=16, answer_max_new_tokens=4, max_batch=4)),
        distill=DistillConfig(student=tiny_folder, out=str(tmp_path / "ckpt"), teacher=dict(model=tiny_folder, context=TeacherContext.privileged), loss=dict(rl_weight=1.0), optim=dict(steps=1, lr=1e-3), batch=dict(invocations_per_step=8, oversize=Oversize.skip)),
    )
    _, (round_one,) = run_train(sqlite_store, config)
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[round_one.rollout_run_id]))
        (step,) = repo.list_train_steps(s, round_one.distill_run_id)
    assert sorted({i.kind for i in invs}) == ["answer", "event_view"]
    assert {i.policy_version for i in invs} == {round_one.policy.id}
    assert step.metrics["actions"] > 0 and math.isfinite(step.loss)


# --- replay and scoring, as overwrite's ---------------------------------------------------------------------


def direct_logprobs(model, context_ids, output_ids) -> np.ndarray:
    ids = torch.tensor(np.concatenate([context_ids, output_ids]), dtype=torch.long)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
    c = len(context_ids)
    return logp[c - 1 : -1].gather(-1, torch.tensor(output_ids, dtype=torch.long)[:, None])[:, 0].numpy()


def test_an_events_episode_replays_and_scores_like_overwrites(sqlite_store):
    tok = tiny_tokenizer()
    model = tiny_llama(seed=1)
    config = RolloutConfig(model="tiny", episodes=1, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_policy="events", memory_options={"recorder": "model"},
                                             memory_tokens=10, answer_max_new_tokens=5, seed=5))
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(model, tok), policy=policy)
    _, invs = stored_calls(sqlite_store, result.run_id)
    assert {i.kind for i in invs} == {"event_record", "event_view", "answer"}
    for inv in invs:
        seq = rebuild_aligned(inv)
        assert seq.input_ids.tolist() == inv.prompt_ids.tolist() + inv.output_ids.tolist()
        assert seq.action_ids.tolist() == inv.output_ids.tolist()
        np.testing.assert_allclose(seq.sampler_logprobs, inv.output_logprobs)
    score = run_score(sqlite_store, ScoreConfig(run_ids=[result.run_id], context=TeacherContext.aligned,
                                                row_tokens=4096),
                      teacher=LoadedModel(model, tok, "tiny-teacher"), student=LoadedModel(model, tok, "tiny-student"))
    assert score.scored == len(invs)
    with sqlite_store.session() as s:
        got = repo.get_teacher_scores(s, [i.id for i in invs], "tiny-teacher", TeacherContext.aligned)
    for inv in invs:
        expected = direct_logprobs(model, inv.prompt_ids, inv.output_ids)
        np.testing.assert_allclose(got[inv.id].token_logprobs, expected, atol=1e-4)
        np.testing.assert_allclose(inv.output_logprobs, expected, atol=1e-3)  # the sampler's own log-probs
