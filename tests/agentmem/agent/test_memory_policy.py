"""The memory-policy seam: a second policy, written only here, runs through the unchanged library.

``NotesPolicy`` keeps a list of notes (one ``note`` call per chunk), then makes a ``search`` call over its
notes (routed to its own backend) before the final ``answer`` call. The loop drives it, the rollout job
stores its calls with their kinds and the policy's name, and a killed rollout resumes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from helpers import SYNTH, KilledBackend, canonical_calls, stored_calls

from agentmem.agent.loop import AgentConfig, AgentLoop, ListSink, memory_policy, register_memory_policy
from agentmem.agent.memory import Call, MemoryPolicyBase, replay
from agentmem.agent.prompts import render
from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import RolloutConfig
from agentmem.errors import AgentError
from agentmem.jobs.rollout import run_rollout
from agentmem.model_refs import ModelRef, register
from agentmem.records import Episode, EpisodeStatus
from agentmem.testing.tiny_models import tiny_tokenizer
from envs import load_env
from store import repository as repo

NOTES = AgentConfig(memory_policy="notes", memory_tokens=16, answer_max_new_tokens=8, max_batch=2, seed=1)


@dataclass(frozen=True)
class NotesState:
    notes: tuple[str, ...] = ()
    read: int = 0
    found: str | None = None


class NotesPolicy(MemoryPolicyBase[NotesState]):
    """One note per chunk, then a search over the notes, then the answer from what the search found."""

    name = "notes"
    kinds = ("note", "search", "answer")

    def __init__(self, tokenizer, config: AgentConfig):
        self.tokenizer, self.config = tokenizer, config

    @classmethod
    def build(cls, tokenizer, config, options):
        return cls(tokenizer, config)

    def initial_state(self, task):
        return NotesState()

    def next_call(self, state, task):
        if state.read < len(task.chunks):
            chunk = task.chunks[state.read]
            return Call("note", render(self.tokenizer, f"Question: {task.question}\nText: {chunk}\nWrite one note."),
                        self.config.memory_tokens, chunk_text=chunk, chunk_index=state.read)
        if state.found is None:
            notes = "\n".join(state.notes)
            return Call("search", render(self.tokenizer, f"Search for: {task.question}\nNotes:\n{notes}"), 8)
        return Call("answer", render(self.tokenizer, f"Question: {task.question}\nFound: {state.found}\nAnswer."),
                    self.config.answer_max_new_tokens, final=True)

    def consume(self, state, call, output_ids, output_text):
        text = output_text.strip()
        if call.kind == "note":
            if not text:
                raise AgentError(f"note call at chunk {call.chunk_index}: empty note")
            return replace(state, notes=(*state.notes, text), read=state.read + 1)
        if call.kind == "search":
            return replace(state, found=text)
        return state

    def memory_text(self, state):
        found = [] if state.found is None else [f"found: {state.found}"]
        return "\n".join([*state.notes, *found])

    def resume(self, task, stored):
        return replay(self, task, stored)


@pytest.fixture(autouse=True)
def notes_registered():
    register_memory_policy(NotesPolicy)


def tiny_env(tok, seed=0):
    return load_env("synthetic", seed=seed, chunk_tokens=48,
                    count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]), **SYNTH)


def respond(tok):
    def reply(prompt):
        text = tok.decode(prompt)
        if "Search for:" in text:
            return f"hit {len(prompt) % 11}"
        if "Answer." in text:
            return "Oslo"
        return f"n{len(prompt)}"
    return reply


def episodes_for(tasks):
    return [Episode(run_id="r", env="synthetic", task_id=t.task_id, question=t.question, gold_answers=t.answers)
            for t in tasks]


def check_episode_calls(calls, task):
    """Kinds, chunk order and the memory chain of one episode's calls (in step order)."""
    n = len(task.chunks)
    assert [c.step for c in calls] == list(range(n + 2))
    assert [c.kind for c in calls] == ["note"] * n + ["search", "answer"]
    assert {c.memory_policy for c in calls} == {"notes"}
    assert [c.chunk_index for c in calls] == [*range(n), None, None]
    assert calls[0].memory_before == ""
    for prev, cur in zip(calls, calls[1:], strict=False):
        assert cur.memory_before == prev.memory_after
    notes = [c.output_text.strip() for c in calls[:n]]
    assert calls[n - 1].memory_after == "\n".join(notes)
    assert calls[n].memory_after == "\n".join([*notes, f"found: {calls[n].output_text.strip()}"])
    assert calls[-1].memory_after == calls[-1].memory_before


def test_loop_drives_a_second_policy_and_routes_its_search_calls():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    tasks = env.tasks(3)
    main, search = ScriptedBackend(tok, respond(tok)), ScriptedBackend(tok, respond(tok))
    loop = AgentLoop({"*": main, "search": search}, NOTES, env.score)
    assert isinstance(loop.memory, NotesPolicy)
    sink = ListSink()
    loop.run([loop.start(e, t) for e, t in zip(episodes_for(tasks), tasks, strict=True)], sink)

    assert len(search.seen_prompts) == 3
    assert all("Search for:" in tok.decode(p) for p in search.seen_prompts)
    assert not any("Search for:" in tok.decode(p) for p in main.seen_prompts)
    assert sorted(map(tuple, main.seen_prompts + search.seen_prompts)) == \
        sorted(tuple(i.prompt_ids) for i in sink.all_invocations)
    by_task = {e.task_id: e for e in sink.finished}
    for t in tasks:
        ep = by_task[t.task_id]
        assert ep.status is EpisodeStatus.answered and ep.prediction == "Oslo"
        check_episode_calls(sorted((i for i in sink.all_invocations if i.episode_id == ep.id),
                                   key=lambda i: i.step), t)


def test_unrouted_kind_and_unknown_policy_are_agent_errors():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    (task,) = env.tasks(1)
    loop = AgentLoop({"note": ScriptedBackend(tok, respond(tok))}, NOTES, env.score)
    with pytest.raises(AgentError, match="no backend for call kind 'search'; routed kinds: note"):
        loop.run([loop.start(episodes_for([task])[0], task)], ListSink())
    with pytest.raises(AgentError, match=r"unknown memory policy 'nope'; registered: .*notes.*overwrite"):
        memory_policy(tok, NOTES.model_copy(update={"memory_policy": "nope"}))
    with pytest.raises(AgentError, match="is registered already"):
        register_memory_policy(type("NotesPolicy", (NotesPolicy,), {}))


def test_a_policy_refusing_an_output_fails_only_its_episode():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    tasks = env.tasks(2)
    bad = tasks[1].question

    def reply(prompt):
        text = tok.decode(prompt)
        return "" if bad in text and "Write one note" in text else respond(tok)(prompt)

    loop = AgentLoop(ScriptedBackend(tok, reply), NOTES, env.score)
    sink = ListSink()
    loop.run([loop.start(e, t) for e, t in zip(episodes_for(tasks), tasks, strict=True)], sink)
    by_task = {e.task_id: e for e in sink.finished}
    assert by_task[tasks[0].task_id].status is EpisodeStatus.answered
    failed = by_task[tasks[1].task_id]
    assert failed.status is EpisodeStatus.failed and failed.stop_reason == "memory policy error"
    assert failed.error == "AgentError: note call at chunk 0: empty note"
    assert not [i for i in sink.all_invocations if i.episode_id == failed.id]


def rollout_config() -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH, agent=NOTES)


def canonical(episodes, invs):
    return canonical_calls(episodes, invs, "memory_policy", "prompt_text", "output_ids", "memory_before",
                           "memory_after")


def test_rollout_stores_the_policy_and_its_call_kinds(sqlite_store):
    tok = tiny_tokenizer()
    policy = register(sqlite_store, ModelRef("tiny", "/models/tiny", "tiny"))
    result = run_rollout(sqlite_store, rollout_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy)
    episodes, invs = stored_calls(sqlite_store, result.run_id)
    tasks = {t.task_id: t for t in tiny_env(tok).tasks(3)}
    assert len(episodes) == 6 and all(e.status is EpisodeStatus.answered for e in episodes)
    for ep in episodes:
        check_episode_calls(sorted((i for i in invs if i.episode_id == ep.id), key=lambda i: i.step),
                            tasks[ep.task_id])
    with sqlite_store.session() as s:
        searches = list(repo.stream_invocations(s, run_ids=[result.run_id], kinds=["search"]))
    assert len(searches) == 6 and {i.kind for i in searches} == {"search"}



@pytest.mark.parametrize("calls_before_kill", [4, 9, 13])
def test_killed_rollout_resumes_exactly(sqlite_store, calls_before_kill):
    tok = tiny_tokenizer()
    policy = register(sqlite_store, ModelRef("tiny", "/models/tiny", "tiny"))
    whole = run_rollout(sqlite_store, rollout_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy)
    want = canonical(*stored_calls(sqlite_store, whole.run_id))

    killed = KilledBackend(tok, respond(tok))
    killed.left = calls_before_kill
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, rollout_config(), backend=killed, policy=policy)
    with sqlite_store.session() as s:
        run_id = next(r.run.id for r in repo.list_runs(s) if r.run.id != whole.run_id)
    _, partial = stored_calls(sqlite_store, run_id)
    assert 0 < len(partial) < len(want)
    result = run_rollout(sqlite_store, rollout_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy,
                         resume=run_id)
    assert result.resumed_episodes > 0
    episodes, invs = stored_calls(sqlite_store, run_id)
    assert all(e.status is EpisodeStatus.answered for e in episodes)
    assert canonical(episodes, invs) == want
    kept = {i.id: i for i in invs}
    for old in partial:
        assert kept[old.id].output_ids.tolist() == old.output_ids.tolist()
