"""The ``log`` memory policy (PRO-LONG): the query language, exact prompts and stored rows per condition,
reads never logged, the search budget, the oracle, replay and teacher scoring, resumption after a kill."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from helpers import SYNTH, KilledBackend, register_policy

from agentmem.agent.log_memory import LogOptions, LogPolicy
from agentmem.agent.log_query import (
    Done,
    Entry,
    ParseError,
    Query,
    keyword_query,
    keyword_words,
    parse_query,
    search,
)
from agentmem.agent.prompts import render
from agentmem.agent.registry import memory_policy
from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, RolloutConfig, ScoreConfig, SftConfig
from agentmem.errors import AgentError
from agentmem.jobs.rollout import run_rollout
from agentmem.jobs.score import run_score
from agentmem.jobs.sft import run_sft
from agentmem.records import EpisodeStatus, Fact, Task
from agentmem.replay import rebuild_aligned
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer
from agentmem.training.scoring import LoadedModel
from agentmem.training.selection import select
from envs import load_env
from store import repository as repo
from store.repository import memory_log

CHUNKS = ["An old market drew visitors at dusk.", "Vode works for Katidyne.",
          "An old festival drew visitors after the rain.", "Zufi works for Lizatek. The market grew every summer."]
QUESTION = "Which company does Vode work for?"

# ---- the query language -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [
    ("DONE", Done()),
    ("  DONE \n", Done()),
    ("SEARCH regex /works for/ LIMIT 2", Query("regex", 2, pattern="works for")),
    ("SEARCH regex /zantek/i", Query("regex", 3, pattern="zantek", ignore_case=True)),
    (r"SEARCH regex /a\/b\d+/i LIMIT 20", Query("regex", 20, pattern=r"a/b\d+", ignore_case=True)),
    ("SEARCH keywords Bob mentor", Query("keywords", 3, keywords=("Bob", "mentor"))),
    ("SEARCH   keywords  Bob  LIMIT  1", Query("keywords", 1, keywords=("Bob",))),
    ("SEARCH keywords limit Ölberg_2 LIMIT 5", Query("keywords", 5, keywords=("limit", "Ölberg_2"))),
])
def test_valid_queries_parse_exactly(text, want):
    assert parse_query(text) == want


@pytest.mark.parametrize(("text", "message"), [
    ("", "column 1: expected SEARCH or DONE, got end of query"),
    ("search keywords bob", "column 1: expected SEARCH or DONE, got 'search'"),
    ("DONE now", "column 6: expected end of query after DONE, got 'now'"),
    ("SEARCH", "column 7: expected regex or keywords, got end of query"),
    ("SEARCH regexp /a/", "column 8: expected regex or keywords, got 'regexp'"),
    ("SEARCH regex works", "column 14: expected '/' to open the pattern, got 'works'"),
    ("SEARCH regex /works", "column 14: unterminated pattern: expected a closing '/' for the '/' opened here"),
    ("SEARCH regex //", "column 15: expected a pattern between the slashes, got an empty one"),
    ("SEARCH regex /a(b/", "column 16: invalid regular expression: missing ), unterminated subpattern"),
    (r"SEARCH regex /\/\/[/", "column 19: invalid regular expression: unterminated character set"),
    ("SEARCH regex /a/x", "column 17: expected the flag 'i', a space or end of query after the closing '/', "
                          "got 'x'"),
    ("SEARCH keywords", "column 16: expected at least one keyword, got end of query"),
    ("SEARCH keywords LIMIT 2", "column 17: expected at least one keyword, got 'LIMIT'"),
    ("SEARCH keywords Vode's boss", "column 17: expected a keyword (letters, digits or _), got \"Vode's\""),
    ("SEARCH keywords a LIMIT", "column 24: expected a number from 1 to 20 after LIMIT, got end of query"),
    ("SEARCH keywords a LIMIT 0", "column 25: expected a number from 1 to 20 after LIMIT, got '0'"),
    ("SEARCH keywords a LIMIT 21", "column 25: expected a number from 1 to 20 after LIMIT, got '21'"),
    ("SEARCH regex /a/ TOP 2", "column 18: expected LIMIT or end of query, got 'TOP'"),
    ("SEARCH regex /a/ LIMIT 2 please", "column 26: expected end of query, got 'please'"),
    ("SEARCH keywords a\nLIMIT 2", "column 18: a query is one line of space-separated tokens; found a line break"),
    ("SEARCH keywords " + " ".join(f"w{i}" for i in range(17)),
     "column 71: at most 16 keywords; this one is keyword 17"),
    ("SEARCH regex /" + "a" * 201 + "/", "column 15: a pattern is at most 200 characters, got 201"),
])
def test_malformed_queries_are_parse_errors_with_a_clear_message(text, message):
    with pytest.raises(ParseError) as err:
        parse_query(text)
    assert str(err.value) == message
    assert err.value.column == int(message.split(":")[0].split()[1])


LOG = [Entry(0, "chunk", "Bob works for Zantek."), Entry(1, "note", "Bob: Zantek"),
       Entry(2, "chunk", "Zantek is headquartered in Oslo. Bob likes Oslo."), Entry(3, "note", "")]


def test_search_order_is_deterministic():
    assert search(LOG, parse_query("SEARCH regex /zantek/i LIMIT 20")) == LOG[:3]
    assert search(LOG, parse_query("SEARCH regex /Zantek/ LIMIT 2")) == LOG[:2]
    assert search(LOG, parse_query("SEARCH regex /^$/")) == [LOG[3]]
    # keywords: most distinct keywords first, ties in log order; whole words, any case
    assert search(LOG[::-1], parse_query("SEARCH keywords oslo bob headquartered")) == [LOG[2], LOG[0], LOG[1]]
    assert search(LOG, parse_query("SEARCH keywords zan")) == []
    assert keyword_words("Bob works for Zantek. bob LIMIT") == ["Bob", "works", "for", "Zantek"]
    assert keyword_query(["Bob", "works"], 2) == "SEARCH keywords Bob works LIMIT 2"


# ---- options -----------------------------------------------------------------------------------------


def agent(**options) -> AgentConfig:
    return AgentConfig(memory_policy="log", memory_tokens=16, answer_max_new_tokens=8, max_batch=4, seed=1,
                       memory_options=options)


@pytest.mark.parametrize(("options", "message"), [
    ({"conditon": "full-log"}, "conditon: unknown option"),
    ({"condition": "window"}, "condition: Input should be 'full-log', 'windowed-log' or 'in-prompt'"),
    ({"condition": "windowed-log"}, "option 'window' is required with condition=windowed-log and only there"),
    ({"window": 3}, "option 'window' is required with condition=windowed-log and only there"),
    ({"condition": "windowed-log", "window": 0}, "window: Input should be greater than or equal to 1"),
    ({"searches": "3"}, "searches: Input should be a valid integer"),
    ({"read_tokens": True}, "read_tokens: Input should be a valid integer"),
    ({"condition": "in-prompt", "searches": 2}, "option 'searches' does not apply to condition=in-prompt"),
])
def test_options_are_checked_and_errors_name_the_option(options, message):
    with pytest.raises(AgentError, match=r"^memory policy 'log': bad --memory-option \(.*" + re.escape(message)
                       + r".*\); known: condition, window, searches, read_tokens, query_tokens$"):
        memory_policy(tiny_tokenizer(), agent(**options))


def test_the_registry_builds_it_and_it_declares_its_kinds_and_the_oracle():
    policy = memory_policy(tiny_tokenizer(), agent(condition="windowed-log", window=4, searches=0))
    assert isinstance(policy, LogPolicy)
    assert policy.options == LogOptions(condition="windowed-log", window=4, searches=0)
    assert (policy.kinds, policy.oracle, policy.wants_logprobs, policy.replayable) == (
        ("log_note", "log_search", "answer"), True, False, False)


# ---- episodes through the rollout, with exact prompts and rows ------------------------------------------


def reply(tok, searches=("SEARCH keywords works for LIMIT 2", "SEARCH regex /[/")):
    """Notes ``n<seq>``; the i-th search call writes ``searches[i]`` (``DONE`` after them); answers Katidyne."""
    def respond(prompt):
        text = tok.decode(prompt)
        if m := re.search(r"log entry (\d+)\)", text):
            return f"n{m.group(1)}"
        if "Searches left:" in text:
            made = text.count("\n> ")  # the searches shown so far
            return searches[made] if made < len(searches) else "DONE"
        return "Katidyne"
    return respond


def rollout(store, agent_config, backend=None, **kw):
    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=kw.pop("episodes", 1), chunk_tokens=48, env_knobs=SYNTH,
                           agent=agent_config)
    policy = register_policy(store, "/models/tiny", "tiny")
    return run_rollout(store, config, backend=backend or ScriptedBackend(tok, reply(tok)), policy=policy, **kw)


def stored(store, run_id):
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
        invs = sorted(repo.stream_invocations(s, run_ids=[run_id]), key=lambda i: (i.episode_id, i.step))
        logs = {e.id: memory_log.episode_log(s, e.id) for e in episodes}
    return episodes, invs, logs


def user(text):
    return render(tiny_tokenizer(), text)


def note_prompt(seq, chunk):
    return user(f"Question: {QUESTION}\n\nNew section of the text (log entry {seq}):\n{chunk}\n\nThis section is "
                "kept word for word in your log. Write a short note of what in it may help answer the question; "
                "the note is added to the log too. Write only the note.")


def search_prompt(left, reads, window=""):
    return user(f"Question: {QUESTION}\n\nYour log has 8 entries: the sections of the text and your notes{window}. "
                "Search it with one query on one line:\nSEARCH regex /PATTERN/ LIMIT N\n"
                "SEARCH keywords WORD WORD ... LIMIT N\n"
                f"or write DONE to answer now. Searches left: {left}.\n\nYour searches so far:\n{reads}")


def answer_prompt(reads):
    return user(f"Question: {QUESTION}\n\nYour searches of the log:\n{reads}\n\n"
                "Answer the question from what you found. Reply with the short answer only.")


def expected_log(episode_id, invs):
    notes = [i for i in invs if i.kind == "log_note"]
    return [(episode_id, 2 * k + j, src, text, notes[k].id)
            for k, chunk in enumerate(CHUNKS) for j, (src, text) in enumerate([("chunk", chunk), ("note", f"n{2 * k}")])]


def rows(log):
    return [(e.episode_id, e.seq, e.source, e.text, e.invocation_id) for e in log]


def check_prompts(invs, prompts):
    assert [i.prompt_ids.tolist() for i in invs] == [p.ids for p in prompts]
    assert [i.prompt_text for i in invs] == [p.text for p in prompts]


def test_full_log_prompts_and_rows(store):
    result = rollout(store, agent(condition="full-log", searches=2))
    (ep,), invs, logs = stored(store, result.run_id)
    assert [c for c in CHUNKS] == load_env("synthetic", seed=0, chunk_tokens=48, count_tokens=lambda s: len(
        tiny_tokenizer()(s, add_special_tokens=False)["input_ids"]), **SYNTH).tasks(1)[0].chunks
    assert ep.status is EpisodeStatus.answered and ep.prediction == "Katidyne" and ep.f1 == 1.0
    assert [i.kind for i in invs] == ["log_note"] * 4 + ["log_search"] * 2 + ["answer"]
    assert {i.memory_policy for i in invs} == {"log"}
    assert [i.chunk_index for i in invs] == [0, 1, 2, 3, None, None, None]
    first = "> SEARCH keywords works for LIMIT 2\n[2] chunk: Vode works for Katidyne.\n" \
            "[6] chunk: Zufi works for Lizatek. The market grew every summer."
    bad = "> SEARCH regex /[/\nerror: column 15: invalid regular expression: unterminated character set"
    check_prompts(invs, [*(note_prompt(2 * k, c) for k, c in enumerate(CHUNKS)), search_prompt(2, "(none)"),
                         search_prompt(1, first), answer_prompt(f"{first}\n{bad}")])
    notes = "[1] note: n0\n[3] note: n2\n[5] note: n4\n[7] note: n6"
    assert [i.memory_after for i in invs] == [
        "[1] note: n0", "[1] note: n0\n[3] note: n2", "[1] note: n0\n[3] note: n2\n[5] note: n4", notes,
        f"{notes}\n{first}", f"{notes}\n{first}\n{bad}", f"{notes}\n{first}\n{bad}"]
    # every chunk and note, verbatim; the reads (searches) are never logged
    assert rows(logs[ep.id]) == expected_log(ep.id, invs)
    searched = {i.id for i in invs if i.kind != "log_note"}
    assert not {e.invocation_id for e in logs[ep.id]} & searched


def test_windowed_log_searches_only_the_last_entries(store):
    searches = ("SEARCH keywords works for LIMIT 5",)
    tok = tiny_tokenizer()
    result = rollout(store, agent(condition="windowed-log", window=3, searches=1),
                     backend=ScriptedBackend(tok, reply(tok, searches)))
    (ep,), invs, logs = stored(store, result.run_id)
    assert [i.kind for i in invs] == ["log_note"] * 4 + ["log_search", "answer"]
    found = "> SEARCH keywords works for LIMIT 5\n[6] chunk: Zufi works for Lizatek. The market grew every summer."
    check_prompts(invs[4:], [search_prompt(1, "(none)", "; searches see the last 3"), answer_prompt(found)])
    assert rows(logs[ep.id]) == expected_log(ep.id, invs)  # the whole log is kept, only searches are windowed


def test_in_prompt_puts_the_newest_entries_that_fit_into_the_answer_prompt(store):
    tok = tiny_tokenizer()
    result = rollout(store, agent(condition="in-prompt", read_tokens=80))
    (ep,), invs, logs = stored(store, result.run_id)
    assert [i.kind for i in invs] == ["log_note"] * 4 + ["answer"]
    kept = ["[5] note: n4", "[6] chunk: Zufi works for Lizatek. The market grew every summer.", "[7] note: n6"]
    counts = [len(tok.encode(line, add_special_tokens=False)) for line in
              ["[4] chunk: An old festival drew visitors after the rain.", *kept]]
    assert sum(counts[1:]) <= 80 < sum(counts)  # the next older entry would not fit
    log = "\n".join(["(5 earlier entries not shown: over the read budget)", *kept])
    check_prompts(invs[4:], [user(f"Question: {QUESTION}\n\nYour log:\n{log}\n\n"
                                  "Answer the question from your log. Reply with the short answer only.")])
    assert rows(logs[ep.id]) == expected_log(ep.id, invs)


@pytest.mark.parametrize(("searches", "budget", "made"), [
    (("SEARCH keywords Vode",) * 9, 3, 3),  # never says DONE: the budget ends the searches
    (("SEARCH keywords Vode", "DONE"), 3, 2),  # DONE ends them early (the DONE call counts)
    (("SEARCH keywords Vode",), 0, 0),
])
def test_the_search_budget_is_enforced(sqlite_store, searches, budget, made):
    tok = tiny_tokenizer()
    result = rollout(sqlite_store, agent(searches=budget), backend=ScriptedBackend(tok, reply(tok, searches)),
                     episodes=2)
    episodes, invs, logs = stored(sqlite_store, result.run_id)
    assert all(e.status is EpisodeStatus.answered for e in episodes)
    for ep in episodes:
        kinds = [i.kind for i in invs if i.episode_id == ep.id]
        assert kinds[-1] == "answer" and kinds.count("log_search") == made
        assert len(logs[ep.id]) == 2 * kinds.count("log_note")


# ---- the oracle ----------------------------------------------------------------------------------------




def test_oracle_rollout_writes_the_facts_as_notes_and_queries_that_find_them(sqlite_store, tokenizer_folder):
    config = RolloutConfig(model=tokenizer_folder, policy="oracle", env_knobs={"level": 3}, chunk_tokens=48,
                           episodes=2, agent=AgentConfig(memory_policy="log", memory_tokens=64,
                                                         answer_max_new_tokens=32,
                                                         memory_options={"searches": 3, "query_tokens": 128}))
    result = run_rollout(sqlite_store, config)
    episodes, invs, logs = stored(sqlite_store, result.run_id)
    tok = tiny_tokenizer()
    tasks = {t.task_id: t for t in load_env("synthetic", seed=0, chunk_tokens=48, level=3, count_tokens=lambda s: len(
        tok(s, add_special_tokens=False)["input_ids"])).tasks(2)}
    assert len(episodes) == 2 and all(e.f1 == 1.0 and e.status is EpisodeStatus.answered for e in episodes)
    for ep in episodes:
        task, mine = tasks[ep.task_id], [i for i in invs if i.episode_id == ep.id]
        facts = [f.text for f in task.facts]
        assert len(facts) == 2 and all(i.role == "oracle" and i.output_logprobs is None for i in mine)
        notes = [i.output_text for i in mine if i.kind == "log_note"]
        assert notes == ["\n".join(f.text for f in task.facts if f.chunk == c) for c in range(len(task.chunks))]
        queries = [i for i in mine if i.kind == "log_search"]
        assert [q.output_text for q in queries] == [keyword_query(keyword_words(f), 2) for f in facts] + ["DONE"]
        for query, fact in zip(queries, facts, strict=False):  # each query finds its gold fact
            assert fact in query.memory_after.split(f"> {query.output_text}\n")[1]
        assert mine[-1].kind == "answer" and mine[-1].output_text == task.answers[0]
        assert [e.text for e in logs[ep.id] if e.source == "note"] == notes


def test_an_oracle_log_run_trains_by_sft(sqlite_store, tmp_path):
    folder = save_tiny(tmp_path / "tiny")
    config = RolloutConfig(model=folder, policy="oracle", env_knobs={"level": 1}, chunk_tokens=48, episodes=2,
                           agent=AgentConfig(memory_policy="log", memory_tokens=64, answer_max_new_tokens=32,
                                             memory_options={"searches": 2, "query_tokens": 128}))
    run_id = run_rollout(sqlite_store, config).run_id
    calls = select(sqlite_store, [run_id]).invocations
    assert {i.kind for i in calls} == {"log_note", "log_search", "answer"}
    result = run_sft(sqlite_store, SftConfig(run_ids=[run_id], student=folder, out=str(tmp_path / "ckpt"), optim=dict(steps=3, lr=1e-3), batch=dict(invocations_per_step=64)))
    losses = [h.loss for h in result.history]
    assert result.history[0].metrics["actions"] == sum(i.output_tokens for i in calls)  # notes, queries, answers
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_the_oracle_query_fits_its_call_and_stays_well_formed():
    tok = tiny_tokenizer()
    task = Task(task_id="t", env="synthetic", question=QUESTION, chunks=CHUNKS[:2], answers=["Katidyne"],
                facts=[Fact(text="Vode works for Katidyne.", chunk=1)])
    policy = memory_policy(tok, agent(searches=2, query_tokens=33).model_copy(update={"memory_tokens": 64}))
    state = policy.initial_state(task)
    for _ in task.chunks:
        call = policy.next_call(state, task)
        text = policy.oracle_text(call, task)
        assert text == ("Vode works for Katidyne." if call.chunk_index == 1 else "")
        state = policy.consume(state, call, tok.encode(text, add_special_tokens=False), text)
    call = policy.next_call(state, task)
    query = policy.oracle_text(call, task)
    assert len(tok.encode(query, add_special_tokens=False)) <= 32 < len(tok.encode(  # room for eos
        "SEARCH keywords Vode works for LIMIT 2", add_special_tokens=False))
    assert query == "SEARCH keywords Vode works LIMIT 2"
    assert parse_query(query) == Query("keywords", 2, keywords=("Vode", "works"))
    state = policy.consume(state, call, [], query)
    assert state.reads[0].result == "[2] chunk: Vode works for Katidyne.\n[3] note: Vode works for Katidyne."
    assert policy.oracle_text(policy.next_call(state, task), task) == "DONE"


# ---- replay, scoring and resumption -------------------------------------------------------------------


def test_log_calls_replay_and_score_like_overwrite(sqlite_store):
    tok = tiny_tokenizer()
    result = rollout(sqlite_store, agent(condition="full-log", searches=2), episodes=2)
    episodes, invs, _ = stored(sqlite_store, result.run_id)
    policy = memory_policy(tok, agent(condition="full-log", searches=2))
    tasks = {t.task_id: t for t in load_env("synthetic", seed=0, chunk_tokens=48, count_tokens=lambda s: len(
        tok(s, add_special_tokens=False)["input_ids"]), **SYNTH).tasks(2)}
    for ep in episodes:  # re-planning each stored call gives back its stored prompt ids, exactly
        mine, state = [i for i in invs if i.episode_id == ep.id], policy.initial_state(tasks[ep.task_id])
        for inv in mine:
            call = policy.next_call(state, tasks[ep.task_id])
            assert (call.kind, call.prompt.ids) == (inv.kind, inv.prompt_ids.tolist())
            state = policy.consume(state, call, inv.output_ids.tolist(), inv.output_text)
        assert state == policy.resume(tasks[ep.task_id], mine)
    for inv in invs:
        seq = rebuild_aligned(inv)
        assert seq.input_ids.tolist() == inv.prompt_ids.tolist() + inv.output_ids.tolist()
    model = tiny_llama(seed=1)
    scored = run_score(sqlite_store, ScoreConfig(run_ids=[result.run_id], row_tokens=4096),
                       teacher=LoadedModel(model, tok, "tiny-teacher"))
    assert scored.scored == len(invs) and {i.kind for i in invs} == {"log_note", "log_search", "answer"}
    with sqlite_store.session() as s:
        got = repo.get_teacher_scores(s, [i.id for i in invs], "tiny-teacher", "aligned")
    for inv in invs:  # packed scoring equals each call alone
        ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids, use_cache=False).logits[0].float(), -1)
        c = inv.prompt_tokens
        want = logp[c - 1 : -1].gather(-1, torch.tensor(inv.output_ids, dtype=torch.long)[:, None])[:, 0].numpy()
        np.testing.assert_allclose(got[inv.id].token_logprobs, want, atol=1e-4)


def canonical(store, run_id):
    episodes, invs, logs = stored(store, run_id)
    key = {e.id: (e.task_id, e.sample_index) for e in episodes}
    step = {i.id: i.step for i in invs}
    calls = sorted((key[i.episode_id], i.step, i.kind, i.prompt_text, i.output_ids.tolist(), i.memory_after)
                   for i in invs)
    log = sorted((key[e.episode_id], e.seq, e.source, e.text, step[e.invocation_id])
                 for entries in logs.values() for e in entries)
    return calls, log


@pytest.mark.parametrize("calls_before_kill", [2, 5, 6])
def test_a_killed_log_rollout_resumes_to_the_same_rows(store, calls_before_kill):
    tok = tiny_tokenizer()
    config = agent(condition="full-log", searches=2)
    whole = rollout(store, config, episodes=2)
    want = canonical(store, whole.run_id)
    killed = KilledBackend(tok, reply(tok))
    killed.left = calls_before_kill
    with pytest.raises(KeyboardInterrupt):
        rollout(store, config, backend=killed, episodes=2)
    with store.session() as s:
        run_id = next(r.run.id for r in repo.list_runs(s) if r.run.id != whole.run_id)
    partial_calls, partial_log = canonical(store, run_id)
    assert 0 < len(partial_calls) < len(want[0]) and len(partial_log) == 2 * sum(
        1 for c in partial_calls if c[2] == "log_note")
    result = rollout(store, config, backend=ScriptedBackend(tok, reply(tok)), episodes=2, resume=run_id)
    assert result.resumed_episodes > 0
    assert canonical(store, run_id) == want
