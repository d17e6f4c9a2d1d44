"""The agent loop and the rollout job: what is stored is exactly what the backend consumed and produced,
memory chains step to step, failures are data, and a killed rollout resumes without duplicates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import SYNTH

import agentmem.config
from agentmem.agent.loop import AgentConfig, AgentLoop, EpisodeState, ListSink
from agentmem.agent.overwrite import OverwriteState
from agentmem.agent.registry import memory_policy
from agentmem.backends.scripted import ScriptedBackend
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import RolloutConfig
from agentmem.errors import AgentError
from agentmem.jobs.rollout import run_rollout
from agentmem.model_refs import ModelRef, register
from agentmem.records import Episode, EpisodeStatus, InvocationKind, Task
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from envs import load_env
from store import repository as repo


def tiny_env(tok, chunk_tokens=48, seed=0):
    return load_env("synthetic", seed=seed, chunk_tokens=chunk_tokens,
                    count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]), **SYNTH)


def states_for(tasks):
    return [EpisodeState(Episode(run_id="r", env="synthetic", task_id=t.task_id, question=t.question,
                                 gold_answers=t.answers), t) for t in tasks]


def test_loop_stores_exact_prompts_and_chains_memory():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    tasks = env.tasks(3)

    def respond(prompt):
        return "Oslo" if "Reply with the short answer" in tok.decode(prompt) else f"note {len(prompt)}"

    backend = ScriptedBackend(tok, respond)
    sink = ListSink()
    AgentLoop(backend, AgentConfig(memory_tokens=16, max_batch=2), env.score, policy_version=None).run(
        states_for(tasks), sink)
    assert len(sink.finished) == 3
    assert [list(i.prompt_ids) for i in sink.all_invocations] == backend.seen_prompts
    for t in tasks:
        calls = sorted((i for i in sink.all_invocations if i.episode_id in
                        {e.id for e in sink.finished if e.task_id == t.task_id}), key=lambda i: i.step)
        assert [i.step for i in calls] == list(range(len(t.chunks) + 1))
        assert [i.kind for i in calls] == [InvocationKind.memory_update] * len(t.chunks) + [InvocationKind.answer]
        assert [i.kind for i in calls] == ["memory_update"] * len(t.chunks) + ["answer"]
        assert {i.memory_policy for i in calls} == {"overwrite"}
        assert [i.chunk_text for i in calls[:-1]] == t.chunks
        for prev, cur in zip(calls, calls[1:], strict=False):
            assert cur.memory_before == prev.memory_after
        assert calls[0].memory_before == ""
        assert calls[0].memory_after == f"note {len(calls[0].prompt_ids)}"
        assert calls[-1].prompt_text == tok.decode(calls[-1].prompt_ids)
    ep = sink.finished[0]
    assert ep.prediction == "Oslo" and ep.status is EpisodeStatus.answered and ep.stop_reason == "answered"


def test_failed_call_is_data_not_a_crash():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    tasks = env.tasks(2)
    bad = tasks[1].question

    def respond(prompt):
        if bad in tok.decode(prompt):
            raise RuntimeError("backend exploded")
        return "x"

    sink = ListSink()
    AgentLoop(ScriptedBackend(tok, respond), AgentConfig(), env.score).run(states_for(tasks), sink)
    by_task = {e.task_id: e for e in sink.finished}
    assert by_task[tasks[0].task_id].status is EpisodeStatus.answered
    failed = by_task[tasks[1].task_id]
    assert failed.status is EpisodeStatus.failed and failed.error == "RuntimeError: backend exploded"


def test_max_chunks_truncates():
    tok = tiny_tokenizer()
    env = tiny_env(tok, chunk_tokens=24)
    task = env.tasks(1)[0]
    assert len(task.chunks) > 1
    sink = ListSink()
    AgentLoop(ScriptedBackend(tok, lambda p: "m"), AgentConfig(max_chunks=1), env.score).run(states_for([task]), sink)
    (ep,) = sink.finished
    assert ep.status is EpisodeStatus.truncated
    assert ep.stop_reason == f"read 1 of {len(task.chunks)} chunks (--max-chunks)"
    assert len(sink.all_invocations) == 2


SYSTEM_TURN = ("<|im_start|>system\nYou are a careful reading agent. You read a long text in sections and keep a "
               "short memory.<|im_end|>\n")
REWRITE = ("Rewrite your memory. Keep every fact that may help answer the question, add the relevant facts from "
           "the new section, and drop the rest. Write only the new memory.<|im_end|>\n<|im_start|>assistant\n")


def test_overwrite_prompts_are_pinned():
    """Golden: the overwrite policy's prompts, byte for byte as they were before the memory-policy seam."""
    tok = tiny_tokenizer()
    policy = memory_policy(tok, AgentConfig(memory_tokens=16, answer_max_new_tokens=7, prompt_layout="memory-first"))
    task = Task(task_id="t", env="synthetic", question="Where does Bob live?",
                chunks=["Bob moved to Oslo in 2019.", "Alice works in Berlin."], answers=["Oslo"])
    first = policy.next_call(policy.initial_state(task), task)
    second = policy.next_call(OverwriteState("Bob lives in Oslo.", 1), task)
    answer = policy.next_call(OverwriteState("Bob lives in Oslo.", 2), task)
    assert first.prompt.text == (
        SYSTEM_TURN + "<|im_start|>user\nQuestion: Where does Bob live?\n\nYour memory so far:\n(empty)\n\n"
        "New section of the text:\nBob moved to Oslo in 2019.\n\n" + REWRITE)
    assert second.prompt.text == (
        SYSTEM_TURN + "<|im_start|>user\nQuestion: Where does Bob live?\n\nYour memory so far:\nBob lives in "
        "Oslo.\n\nNew section of the text:\nAlice works in Berlin.\n\n" + REWRITE)
    assert answer.prompt.text == (
        SYSTEM_TURN + "<|im_start|>user\nQuestion: Where does Bob live?\n\nYour memory:\nBob lives in Oslo.\n\n"
        "Answer the question from your memory. Reply with the short answer only.<|im_end|>\n"
        "<|im_start|>assistant\n")
    for call in (first, second, answer):
        assert call.prompt.ids == tok(call.prompt.text, add_special_tokens=False)["input_ids"]
    assert (first.kind, first.max_new_tokens, first.chunk_text, first.chunk_index, first.final) == \
        ("memory_update", 16, "Bob moved to Oslo in 2019.", 0, False)
    assert (second.kind, second.chunk_index) == ("memory_update", 1)
    assert (answer.kind, answer.max_new_tokens, answer.chunk_text, answer.chunk_index, answer.final) == \
        ("answer", 7, None, None, True)
    # the memory: the update output without special tokens, cut to memory_tokens, stripped
    out = tok.encode(" Bob lives in Oslo. Alice works in Berlin. The capital of France is Paris.",
                     add_special_tokens=False) + [tok.eos_token_id]
    after = policy.consume(OverwriteState(), first, out, tok.decode(out, skip_special_tokens=True))
    assert after == OverwriteState(tok.decode(out[:16]).strip(), 1)
    assert policy.consume(after, answer, out, "x") is after


def test_agent_config_is_the_shared_one():
    assert AgentConfig is agentmem.config.AgentConfig


def run_scripted(tasks, env, config=None):
    tok = tiny_tokenizer()

    def respond(prompt):
        return "Oslo" if "Reply with the short answer" in tok.decode(prompt) else f"note {sum(prompt) % 89}"

    loop = AgentLoop(ScriptedBackend(tok, respond), config or AgentConfig(memory_tokens=16, max_batch=2), env.score)
    sink = ListSink()
    loop.run(states_for(tasks), sink)
    return loop, sink


def episode_calls(sink, episode_id):
    return sorted((i for i in sink.all_invocations if i.episode_id == episode_id), key=lambda i: i.step)


def test_start_resumes_from_any_stored_prefix():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    (task,) = env.tasks(1)
    loop, sink = run_scripted([task], env)
    (ep,) = sink.finished
    calls = episode_calls(sink, ep.id)
    running = ep.model_copy(update={"status": EpisodeStatus.running, "prediction": None, "stop_reason": None})
    for k in range(1, len(calls)):
        state = loop.start(running, task, calls[:k])
        assert (state.next_step, state.calls, state.answered) == (k, k, None)
        assert loop.memory.memory_text(state.memory) == calls[k - 1].memory_after
        assert state.tokens == sum(c.prompt_tokens + c.output_tokens for c in calls[:k])
        rest = ListSink()
        loop.run([state], rest)
        assert [(c.step, c.prompt_text, c.memory_after) for c in rest.all_invocations] == \
            [(c.step, c.prompt_text, c.memory_after) for c in calls[k:]]
        assert rest.finished[0].prediction == ep.prediction


def test_a_stored_answer_is_scored_not_asked_again():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    (task,) = env.tasks(1)
    loop, sink = run_scripted([task], env)
    (ep,) = sink.finished
    running = ep.model_copy(update={"status": EpisodeStatus.running, "prediction": None})
    state = loop.start(running, task, episode_calls(sink, ep.id))
    assert state.answered is not None
    again = ListSink()
    loop.run([state], again)
    assert again.all_invocations == []
    (done,) = again.finished
    assert (done.status, done.prediction, done.f1) == (ep.status, ep.prediction, ep.f1)


def test_start_refuses_calls_the_policy_did_not_make():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    (task,) = env.tasks(1)
    loop, sink = run_scripted([task], env)
    (ep,) = sink.finished
    calls = episode_calls(sink, ep.id)
    with pytest.raises(AgentError, match="stored steps are not 0..1"):
        loop.start(ep, task, [calls[0], calls[2]])
    foreign = [calls[0].model_copy(update={"memory_policy": "notes"})]
    with pytest.raises(AgentError, match=f"invocation {calls[0].id} was made by memory policy 'notes'"):
        loop.start(ep, task, foreign)
    with pytest.raises(AgentError, match="stored step 0 is a 'answer' call"):
        loop.start(ep, task, [calls[-1].model_copy(update={"step": 0})])


def test_memory_must_match_the_config():
    tok = tiny_tokenizer()
    env = tiny_env(tok)
    with pytest.raises(AgentError, match="config.memory_policy is 'notes'"):
        AgentLoop(ScriptedBackend(tok, ["x"]), AgentConfig(memory_policy="notes"), env.score,
                  memory=memory_policy(tok, AgentConfig()))
    with pytest.raises(AgentError, match="unknown memory policy 'nope'; registered: .*overwrite"):
        AgentLoop(ScriptedBackend(tok, ["x"]), AgentConfig(memory_policy="nope"), env.score)


class RecordingBackend(TransformersBackend):
    """The real backend, remembering exactly the prompts it consumed."""

    def generate(self, prompts, params):
        self.seen = getattr(self, "seen", []) + [list(p) for p in prompts]
        return super().generate(prompts, params)


def tiny_rollout_config(**kw) -> RolloutConfig:
    agent = AgentConfig(memory_tokens=12, answer_max_new_tokens=6, temperature=0.8, top_p=0.9, max_batch=4, seed=3)
    return RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                         agent=agent, **kw)


def test_rollout_golden_prompts_and_logprobs(sqlite_store):
    tok = tiny_tokenizer()
    model = tiny_llama()
    backend = RecordingBackend.from_model(model, tok)
    config = tiny_rollout_config()
    policy = register(sqlite_store, ModelRef("tiny", "/models/tiny", "tiny"))
    result = run_rollout(sqlite_store, config, backend=backend, policy=policy)
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[result.run_id]))
        run = repo.get_run(s, result.run_id)
    assert run.status == "finished" and RolloutConfig.model_validate(run.config) == config
    assert len(result.episodes) == 6 and all(e.status is not EpisodeStatus.running for e in result.episodes)
    # golden: the stored prompt ids are exactly the ids the backend consumed (as a multiset of calls)
    assert sorted(map(tuple, (i.prompt_ids.tolist() for i in invs))) == sorted(map(tuple, backend.seen))
    assert {i.policy_version for i in invs} == {policy.id}
    # the stored sampler log-probs agree with a fresh fp32 forward pass at the same temperature
    worst = 0.0
    for inv in invs:
        ids = torch.tensor(np.concatenate([inv.prompt_ids, inv.output_ids]), dtype=torch.long)[None]
        with torch.no_grad():
            logits = model(ids, use_cache=False).logits[0].float()
        p = len(inv.prompt_ids)
        lp = torch.log_softmax(logits[p - 1 : -1] / inv.temperature, -1)
        fresh = lp.gather(-1, torch.tensor(inv.output_ids, dtype=torch.long)[:, None])[:, 0].numpy()
        worst = max(worst, float(np.abs(fresh - inv.output_logprobs).max()))
    assert worst < 1e-3, worst


class KilledBackend(TransformersBackend):
    """Dies (as a kill would) after a number of batched calls."""

    def generate(self, prompts, params):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return super().generate(prompts, params)


def test_kill_and_resume_without_duplicates(sqlite_store):
    tok = tiny_tokenizer()
    model = tiny_llama()
    config = tiny_rollout_config()
    policy = register(sqlite_store, ModelRef("tiny", "/models/tiny", "tiny"))
    killed = KilledBackend.from_model(model, tok)
    killed.left = 3
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, config, backend=killed, policy=policy)
    with sqlite_store.session() as s:
        (summary,) = repo.list_runs(s)
        run_id = summary.run.id
        partial = list(repo.stream_invocations(s, run_ids=[run_id]))
    assert 0 < len(partial) and summary.run.status != "finished"
    result = run_rollout(sqlite_store, config, backend=TransformersBackend.from_model(model, tok), policy=policy,
                         resume=run_id)
    assert result.resumed_episodes > 0
    with sqlite_store.session() as s:
        invs = list(repo.stream_invocations(s, run_ids=[run_id]))
        episodes = repo.list_episodes(s, run_id)
    assert len(episodes) == 6 and all(e.status is not EpisodeStatus.running for e in episodes)
    for ep in episodes:
        steps = [i.step for i in invs if i.episode_id == ep.id]
        assert steps == list(range(ep.n_chunks + 1)), (ep.id, steps)
    kept = {i.id: i for i in invs}
    for old in partial:  # the calls stored before the kill are untouched
        assert kept[old.id].output_ids.tolist() == old.output_ids.tolist()
