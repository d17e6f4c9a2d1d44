"""The agent loop and the rollout job: what is stored is exactly what the backend consumed and produced,
memory chains step to step, failures are data, and a killed rollout resumes without duplicates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import tiny_llama, tiny_tokenizer

from agentmem.agent.loop import AgentConfig, AgentLoop, EpisodeState, ListSink
from agentmem.agent.rollout import RolloutConfig, register_policy, run_rollout
from agentmem.policy.scripted import ScriptedBackend
from agentmem.policy.transformers_backend import TransformersBackend
from agentmem.records import Episode, EpisodeStatus, InvocationKind
from envs import load_env
from store import repository as repo

SYNTH = {"context_tokens": 120, "distractors": 1, "hops": 1}


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
    assert ep.stop_reason == f"read 1 of {len(task.chunks)} chunks (max_chunks)"
    assert len(sink.all_invocations) == 2


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
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    result = run_rollout(sqlite_store, config, backend, policy)
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
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    killed = KilledBackend.from_model(model, tok)
    killed.left = 3
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, config, killed, policy)
    with sqlite_store.session() as s:
        (summary,) = repo.list_runs(s)
        run_id = summary.run.id
        partial = list(repo.stream_invocations(s, run_ids=[run_id]))
    assert 0 < len(partial) and summary.run.status == "running"
    result = run_rollout(sqlite_store, config, TransformersBackend.from_model(model, tok), policy, run_id=run_id)
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
