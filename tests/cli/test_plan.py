"""cli/plan.py: the first line after a job's run id is its planned work: episodes, calls counted from the tasks
it will read, and the time at a measured rate (this store's last run of the model, else the default model's
figure), without loading weights or preparing the default model."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from agentmem.config import RolloutConfig
from agentmem.jobs.rollout import build_env
from agentmem.model_refs import load_tokenizer
from agentmem.records import Run, RunKind
from agentmem.testing.store_records import make_episode, make_invocation
from agentmem.testing.tiny_models import save_tiny
from cli.plan import DEFAULT_MODEL_CALLS_PER_SECOND, Plan, agent_plan, sum_plans
from store import repository as repo


def test_plan_lines():
    assert Plan(8, 40, 0.5, "a basis").line() == "plan: 8 episodes, about 40 calls, about 1 min 20 s (at 0.50 calls/s, a basis)"
    assert Plan(8, 40, None, "").line() == "plan: 8 episodes, about 40 calls, time shown once calls run"
    assert Plan(8, None, None, "the default model is prepared").line() == (
        "plan: 8 episodes, calls counted once the default model is prepared")
    assert Plan(None, 16, None, "").line() == "plan: 16 calls, time shown once calls run"
    assert sum_plans([Plan(2, 10, 1.0, "b"), Plan(2, 30, 2.0, "c")]) == Plan(4, 40, 1.0, "b")


def test_a_rollout_plans_one_call_a_chunk_and_an_answer_per_episode(tmp_path):
    model = save_tiny(tmp_path / "model")
    config = RolloutConfig(model=model, episodes=3, group_size=2, env_knobs={"context_tokens": 300})
    tasks = build_env(config, load_tokenizer(model)).tasks(3)
    calls = 2 * sum(len(t.chunks) + 1 for t in tasks)
    db = f"sqlite:///{tmp_path / 'store.db'}"
    assert agent_plan(config, db) == Plan(6, calls, None, "the rate of this model's last finished run in this store")
    oracle = RolloutConfig(model=model, episodes=3, group_size=2, env_knobs={"context_tokens": 300}, policy="oracle")
    assert agent_plan(oracle, db) == Plan(6, calls, None, "")


def test_the_time_is_at_the_rate_of_the_models_last_run_here(tmp_path, sqlite_store):
    model = save_tiny(tmp_path / "model")
    run = Run(kind=RunKind.eval, config={"model": model, "policy": "model"}, status="finished")
    run = run.model_copy(update={"finished_at": run.created_at + timedelta(seconds=20)})
    episode = make_episode(run)
    rng = np.random.default_rng(0)
    with sqlite_store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [episode])
        repo.insert_invocations(s, [make_invocation(episode, step, rng, 8, 4) for step in range(10)])
        s.commit()
    config = RolloutConfig(model=model, episodes=2, env_knobs={"context_tokens": 300})
    plan = agent_plan(config, str(sqlite_store.engine.url))
    assert (plan.rate, plan.basis) == (0.5, "the rate of this model's last finished run in this store")


def test_the_default_model_is_not_prepared_for_a_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTMEM_CACHE", str(tmp_path / "cache"))
    db = f"sqlite:///{tmp_path / 'store.db'}"
    assert agent_plan(RolloutConfig(episodes=4, group_size=2), db) == Plan(8, None, None,
                                                                           "the default model is prepared")
    assert not (tmp_path / "cache").exists()
    save_tiny(tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct")
    plan = agent_plan(RolloutConfig(episodes=4), db)
    assert (plan.episodes, plan.rate) == (4, DEFAULT_MODEL_CALLS_PER_SECOND) and plan.calls
