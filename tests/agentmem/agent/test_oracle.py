"""The oracle policy: a scripted writer with no model, and calls stored without sampler log-probs.

An oracle rollout loads only a tokenizer (the model folder here holds no weights at all), stores calls with
role 'oracle', NULL log-probs and the student's exact prompts; its memory is the facts read so far, within
the budget; replay rebuilds NaN sampler log-probs, which the RL term refuses and cross-entropy trains on."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
import torch
from helpers import register_policy

from agentmem.agent.loop import AgentLoop, ListSink
from agentmem.agent.oracle import OracleWriter
from agentmem.agent.prompts import EMPTY_MEMORY, answer_prompt, update_prompt
from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, DistillConfig, RolloutConfig
from agentmem.errors import AgentError, ConfigError, TrainingError
from agentmem.jobs import distill as distill_job
from agentmem.jobs.export import export_invocations
from agentmem.jobs.rollout import StoreSink, build_env, run_rollout
from agentmem.records import Episode, Fact, FinishReason, Invocation, RunKind, Task
from agentmem.replay import rebuild_aligned
from agentmem.testing.store_records import make_episode, make_invocation, make_run
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.terms import MicroBatch, PolicyGradientTerm
from agentmem.training.trainer import Models
from envs.metrics import score_answer
from store import repository as repo
from store.engine import make_engine
from store.migrations import downgrade, upgrade

ROOT = Path(__file__).resolve().parents[3]




def oracle_config(model: str, level: int = 2, memory_tokens: int = 256, **kw) -> RolloutConfig:
    return RolloutConfig(model=model, policy="oracle", env_knobs={"level": level}, chunk_tokens=48,
                         **{"episodes": 2, **kw}, agent=AgentConfig(memory_tokens=memory_tokens,
                                                                   answer_max_new_tokens=32))


def encode(text: str) -> list[int]:
    return tiny_tokenizer().encode(text, add_special_tokens=False)


def stored(store, run_id: str) -> tuple[dict[str, Episode], list[Invocation]]:
    with store.session() as s:
        return ({e.id: e for e in repo.list_episodes(s, run_id)},
                list(repo.stream_invocations(s, run_ids=[run_id])))


def tasks_of(config: RolloutConfig) -> dict[str, Task]:
    return {t.task_id: t for t in build_env(config, tiny_tokenizer()).tasks(config.episodes)}


def seen(task: Task, chunk: int) -> str:
    return "\n".join(f.text for f in task.facts if f.chunk <= chunk) or EMPTY_MEMORY


# --- the rollout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 2, 3])
def test_oracle_rollout_stores_oracle_calls_that_answer_gold(sqlite_store, tokenizer_folder, level):
    tok = tiny_tokenizer()
    config = oracle_config(tokenizer_folder, level, group_size=2)
    result = run_rollout(sqlite_store, config)
    assert result.policy is None
    episodes, invocations = stored(sqlite_store, result.run_id)
    tasks = tasks_of(config)
    assert len(episodes) == 4 and all(e.f1 == 1.0 and e.status.value == "answered" for e in episodes.values())
    if level:
        assert all(len(t.chunks) > 1 and t.facts for t in tasks.values())
    with sqlite_store.session() as s:
        assert repo.get_run(s, result.run_id).config["policy"] == "oracle"
    for inv in invocations:
        task = tasks[episodes[inv.episode_id].task_id]
        assert inv.role == "oracle" and inv.output_logprobs is None and inv.policy_version is None
        assert inv.finish_reason is FinishReason.stop
        if inv.kind == "memory_update":
            i = inv.chunk_index
            assert inv.memory_before == (seen(task, i - 1) if i else "")
            assert inv.prompt_ids.tolist() == update_prompt(tok, task.question, inv.memory_before, task.chunks[i],
                                                            "chunk-first").ids
            assert inv.memory_after == inv.output_text == seen(task, i)
            text = seen(task, i)
        else:
            assert inv.step == len(task.chunks) and inv.memory_before == seen(task, len(task.chunks))
            assert inv.prompt_ids.tolist() == answer_prompt(tok, task.question, inv.memory_before).ids
            assert inv.memory_before == "\n".join(f.text for f in task.facts)  # every fact, in reading order
            text = task.answers[0]
        assert inv.output_ids.tolist() == encode(text) + [tok.eos_token_id]


def test_a_tiny_budget_keeps_only_the_facts_that_fit(sqlite_store, tokenizer_folder):
    probe = oracle_config(tokenizer_folder, level=3, episodes=1)
    (task,) = tasks_of(probe).values()
    first, second = (f.text for f in task.facts)
    both = len(encode(f"{first}\n{second}"))
    assert len(encode(first)) < both - 1
    result = run_rollout(sqlite_store, oracle_config(tokenizer_folder, level=3, episodes=1, memory_tokens=both))
    episodes, invocations = stored(sqlite_store, result.run_id)
    updates = [i for i in invocations if i.kind == "memory_update"]
    # both facts need `both` tokens, the budget leaves both - 1 (one for eos): only the first is kept
    assert updates[-1].memory_after == first
    assert all(len(i.output_ids) <= both for i in updates)
    assert [e.f1 for e in episodes.values()] == [1.0]  # the oracle answers gold whatever its memory holds
    nothing = run_rollout(sqlite_store, oracle_config(tokenizer_folder, level=3, episodes=1, memory_tokens=2))
    _, invocations = stored(sqlite_store, nothing.run_id)
    # no fact fits: the oracle writes what the prompt shows for an empty memory, cut to the budget like a
    # model's output, never a bare end-of-sequence (a teacher trained on those learns to stop at once)
    empty = encode(EMPTY_MEMORY)
    assert len(empty) > 2
    updates = [i for i in invocations if i.kind == "memory_update"]
    assert {tuple(i.output_ids) for i in updates} == {tuple(empty[:2])}
    assert {i.finish_reason for i in updates} == {FinishReason.length}


def test_the_oracle_never_writes_an_empty_update():
    """A chunk with no fact read yet gets the empty-memory text and eos, as the next prompt would show it."""
    tok = tiny_tokenizer()
    oracle = OracleWriter(tok)
    facts = [Fact(text="Bob lives in Oslo.", chunk=2)]
    assert oracle.memory(facts, 0, 64) == EMPTY_MEMORY
    assert oracle.memory(facts, 2, 64) == "Bob lives in Oslo."
    assert oracle.memory(facts, 2, 1) == EMPTY_MEMORY  # the fact does not fit


def test_memory_is_first_fit_in_reading_order():
    oracle = OracleWriter(tiny_tokenizer())
    facts = [Fact(text="Bob lives in Oslo.", chunk=0), Fact(text="Alice " * 40, chunk=1),
             Fact(text="Paris.", chunk=2), Fact(text="Late fact.", chunk=5)]
    budget = len(encode("Bob lives in Oslo.\nParis."))
    assert oracle.memory(facts, 0, budget) == "Bob lives in Oslo."
    assert oracle.memory(facts, 4, budget) == "Bob lives in Oslo.\nParis."  # the long one is left out
    assert oracle.memory(facts, 9, budget) == "Bob lives in Oslo.\nParis."  # no room left for the last
    assert oracle.memory(facts, 9, 1000) == "\n".join(f.text.strip() for f in facts)
    assert oracle.memory([], 3, 100) == EMPTY_MEMORY


def test_a_task_without_facts_gets_the_empty_memory_text_and_the_gold_answer():
    tok = tiny_tokenizer()
    task = Task(task_id="t", env="none", question="Where does Bob live?", chunks=["Bob is here.", "And there."],
                answers=["Oslo"])
    loop = AgentLoop(None, AgentConfig(memory_tokens=16), lambda p, t: score_answer(p, t.answers),
                     oracle=OracleWriter(tok))
    sink = ListSink()
    loop.run([loop.start(Episode(run_id="r", env="none", task_id="t", question=task.question), task)], sink)
    assert [i.memory_after for i in sink.all_invocations] == [EMPTY_MEMORY] * 3
    assert [i.role for i in sink.all_invocations] == ["oracle"] * 3
    (episode,) = sink.finished
    assert episode.prediction == "Oslo" and episode.f1 == 1.0


def test_a_long_gold_answer_is_cut_like_a_model_would_be():
    tok = tiny_tokenizer()
    task = Task(task_id="t", env="none", question="q?", chunks=["c"], answers=["a very long answer " * 5])
    loop = AgentLoop(None, AgentConfig(memory_tokens=8, answer_max_new_tokens=4),
                     lambda p, t: score_answer(p, t.answers), oracle=OracleWriter(tok))
    sink = ListSink()
    loop.run([loop.start(Episode(run_id="r", env="none", task_id="t", question="q?"), task)], sink)
    answer = sink.all_invocations[-1]
    assert answer.output_ids.tolist() == encode(task.answers[0])[:4] and answer.finish_reason is FinishReason.length
    assert sink.finished[0].status.value == "truncated"


def test_the_loop_takes_a_backend_or_an_oracle():
    tok = tiny_tokenizer()
    score = lambda p, t: score_answer(p, t.answers)  # noqa: E731
    with pytest.raises(AgentError, match="not both"):
        AgentLoop(ScriptedBackend(tok, lambda p: "m"), AgentConfig(), score, oracle=OracleWriter(tok))
    with pytest.raises(AgentError, match="not both"):
        AgentLoop(None, AgentConfig(), score)


def test_oracle_config_errors_before_anything_runs(sqlite_store, tokenizer_folder):
    config = oracle_config(tokenizer_folder)
    with pytest.raises(ConfigError, match="give no backend"):
        run_rollout(sqlite_store, config, backend=ScriptedBackend(tiny_tokenizer(), lambda p: "m"),
                    policy=register_policy(sqlite_store, "/models/tiny", "tiny"))
    with pytest.raises(ConfigError, match="for rollouts"):
        run_rollout(sqlite_store, config, kind=RunKind.eval)
    # a name no test registers (test_memory_policy registers "notes" for the whole session)
    other = config.model_copy(update={"agent": config.agent.model_copy(update={"memory_policy": "no-such-policy"})})
    with pytest.raises(AgentError, match="unknown memory policy 'no-such-policy'"):
        run_rollout(sqlite_store, other)
    with sqlite_store.session() as s:
        assert repo.list_runs(s) == []


class StopAfterTwoRounds(StoreSink):
    def __init__(self, store):
        super().__init__(store)
        self.rounds = 0

    def invocations(self, invocations):
        if self.rounds == 2:
            raise KeyboardInterrupt
        self.rounds += 1
        super().invocations(invocations)


def test_an_oracle_run_resumes_to_the_same_calls(sqlite_store, tokenizer_folder):
    config = oracle_config(tokenizer_folder, level=2, episodes=3)
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, config, sink=StopAfterTwoRounds(sqlite_store))
    with sqlite_store.session() as s:
        (summary,) = repo.list_runs(s)
    run_id = summary.run.id
    assert summary.run.status == "interrupted"
    assert 0 < len(stored(sqlite_store, run_id)[1]) < 3 * (len(next(iter(tasks_of(config).values())).chunks) + 1)
    done = run_rollout(sqlite_store, None, resume=run_id[:8])
    assert done.run_id == run_id and done.resumed_episodes == 3
    fresh = run_rollout(sqlite_store, config)

    def calls(rid):
        episodes, invocations = stored(sqlite_store, rid)
        return sorted((episodes[i.episode_id].task_id, i.step, i.kind, i.output_ids.tolist(), i.memory_after)
                      for i in invocations)

    assert calls(run_id) == calls(fresh.run_id)
    assert all(e.f1 == 1.0 for e in stored(sqlite_store, run_id)[0].values())


# --- replay and training -----------------------------------------------------------------------------


def test_replay_rebuilds_nan_sampler_logprobs_and_the_rl_term_refuses_them():
    inv = Invocation(episode_id="e", step=0, kind="answer", prompt_ids=[1, 2, 3], output_ids=[4, 5],
                     output_logprobs=None, role="oracle")
    seq = rebuild_aligned(inv)
    assert seq.sampler_logprobs.dtype == np.float32 and seq.sampler_logprobs.shape == (2,)
    assert np.isnan(seq.sampler_logprobs).all() and seq.action_ids.tolist() == [4, 5]
    assert seq.action_mask.tolist() == [False, False, True, True, False]

    def batch(sampler):
        return MicroBatch(logits=torch.zeros(2, 7, requires_grad=True), action_ids=torch.tensor([4, 5]),
                          sampler_logprobs=torch.tensor(sampler), sampling_temperature=torch.ones(2),
                          advantages=torch.ones(2), weights=torch.full((2,), 0.5))

    assert math.isfinite(float(PolicyGradientTerm()(batch([-1.0, -2.0])).loss.detach()))
    with pytest.raises(TrainingError, match=r"without sampler log-probs \(oracle calls\).*--rl none"):
        PolicyGradientTerm()(batch([float("nan"), -2.0]))


@pytest.fixture
def oracle_run(sqlite_store, tokenizer_folder):
    return sqlite_store, run_rollout(sqlite_store, oracle_config(tokenizer_folder, level=1)).run_id, tokenizer_folder


def test_distill_with_rl_on_an_oracle_run_fails_before_loading_models(oracle_run, tmp_path, monkeypatch):
    store, run_id, folder = oracle_run

    def no_load(*args, **kw):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(distill_job, "load_models", no_load)
    monkeypatch.setattr(distill_job, "resolve_models", no_load)
    config = DistillConfig(run_ids=[run_id[:8]], student=folder, out=str(tmp_path), teacher=dict(model=None), loss=dict(kd_weight=0, rl_weight=1.0))
    with pytest.raises(ConfigError, match=f"run {run_id} is an oracle rollout.*--rl none"):
        distill_job.run_distill(store, config)
    with store.session() as s:
        assert [r.run.kind for r in repo.list_runs(s)] == [RunKind.rollout]  # no distill run was opened


def test_cross_entropy_trains_on_an_oracle_run(oracle_run, tmp_path):
    store, run_id, folder = oracle_run
    tok = tiny_tokenizer()
    student = tiny_llama(seed=0).train()
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    models = Models(student, tok, register_policy(store, folder, "tiny"))
    config = DistillConfig(run_ids=[run_id], student=folder, out=str(tmp_path), teacher=dict(model=None), loss=dict(kd_weight=0, ce_weight=1.0), rl=dict(kind="none"), optim=dict(steps=1, lr=1e-3), batch=dict(invocations_per_step=4))
    result = distill_job.run_distill(store, config, models=models)
    (step,) = result.history
    assert math.isfinite(step.loss) and step.loss > 0 and step.tokens > 0 and step.rl_loss == 0
    assert any(not torch.equal(p, before[n]) for n, p in student.named_parameters())


# --- the store ---------------------------------------------------------------------------------------


def test_oracle_invocation_round_trips_with_null_logprobs(store, tmp_path):
    rng = np.random.default_rng(0)
    run = make_run()
    ep = make_episode(run)
    model = make_invocation(ep, 0, rng, 8, 3)
    oracle = make_invocation(ep, 1, rng, 8, 3).model_copy(update={"output_logprobs": None, "role": "oracle"})
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [model, oracle])
        s.commit()
        back = repo.episode_invocations(s, ep.id)
        roles = s.execute(sa.text("select step, role from invocation_history order by step")).all()
    assert back[1].model_dump(mode="json") == oracle.model_dump(mode="json")
    assert back[0].role == "model" and back[0].output_logprobs.tobytes() == model.output_logprobs.tobytes()
    assert back[1].output_logprobs is None and back[1].role == "oracle"
    assert [tuple(r) for r in roles] == [(0, "model"), (1, "oracle")]
    if store.engine.dialect.name == "sqlite":
        ds = export_invocations(store, [run.id], tmp_path / "calls.parquet")
        assert ds["role"] == ["model", "oracle"] and ds["output_logprobs"][1] is None
        assert ds["output_logprobs"][0] == pytest.approx(model.output_logprobs.tolist())


_INSERT = (
    "insert into invocations (id, episode_id, step, kind, prompt_ids, output_ids, output_logprobs, prompt_text, "
    "output_text, memory_before, memory_after, prompt_tokens, output_tokens, finish_reason, temperature, latency_s, "
    "created_at{role}) values (:id, 'e1', :step, 'answer', :b, :b, {logprobs}, '', '', '', '', 0, 2, 'stop', 1.0, "
    "0.0, '2026-01-01 00:00:00'{oracle})"
)


def test_migration_0003_keeps_rows_up_and_down(db_url):
    """Rows written at 0002 come up as role 'model'; on the way down an oracle call's NULL log-probs become
    NaN, one per output token, and role goes."""
    engine = make_engine(db_url)
    upgrade(engine, "0002")
    two = np.array([-0.5, -1.5], "<f4").tobytes()
    with engine.begin() as conn:
        conn.execute(sa.text("insert into runs (id, kind, config, status, created_at) "
                             "values ('r1', 'rollout', '{}', 'running', '2026-01-01 00:00:00')"))
        conn.execute(sa.text("insert into episodes (id, run_id, env, task_id, sample_index, question, "
                             "gold_answers, evidence, status, n_chunks, created_at) values ('e1', 'r1', 'synthetic', "
                             "'t', 0, 'q', '[]', '[]', 'running', 1, '2026-01-01 00:00:00')"))
        conn.execute(sa.text(_INSERT.format(logprobs=":b", role="", oracle="")), {"id": "i0", "step": 0, "b": two})
    upgrade(engine)
    with engine.begin() as conn:
        assert conn.execute(sa.text("select role from invocation_history")).scalar_one() == "model"
        conn.execute(sa.text(_INSERT.format(logprobs="NULL", role=", role", oracle=", 'oracle'")),
                     {"id": "i1", "step": 1, "b": two})
    downgrade(engine, "0002")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("select id, output_logprobs from invocations order by step")).all()
    assert bytes(rows[0][1]) == two
    assert np.isnan(np.frombuffer(bytes(rows[1][1]), "<f4")).sum() == 2
    insp = sa.inspect(engine)
    assert "role" not in {c["name"] for c in insp.get_columns("invocations")}
    assert not {c["name"]: c["nullable"] for c in insp.get_columns("invocations")}["output_logprobs"]
    assert "memory_policy" in {c["name"] for c in insp.get_columns("invocation_history")}
    upgrade(engine)
    engine.dispose()


# --- the CLI -----------------------------------------------------------------------------------------


def test_cli_oracle_rollout_end_to_end(tmp_path, tokenizer_folder):
    url = f"sqlite:///{tmp_path / 'oracle.db'}"
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "cli.app", "rollout", "--policy", "oracle", "--model", tokenizer_folder,
         "--episodes", "2", "--group-size", "2", "--knob", "level=2", "--chunk-tokens", "48", "--threads", "1",
         "--db", url], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "run_id=" in proc.stdout
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        roles = conn.execute(sa.text("select role, count(*), count(output_logprobs), count(policy_version) "
                                     "from invocations group by role")).all()
        f1 = conn.execute(sa.text("select min(f1), count(*) from episodes")).one()
        config = conn.execute(sa.text("select config from runs")).scalar_one()
    engine.dispose()
    assert len(roles) == 1 and roles[0][0] == "oracle" and roles[0][1] > 4 and roles[0][2:] == (0, 0)
    assert tuple(f1) == (1.0, 4)
    assert (json.loads(config) if isinstance(config, str) else config)["policy"] == "oracle"
