"""ReOPD, replayed-prefix distillation (docs/methods.md): each teacher episode branches at one step drawn
with P(t) ∝ kappa^t; the student samples that one call from the teacher's stored prompt; the replay run
stores those ids exactly with a link to the branched call, trains with `distill` (never with RL), and the
state-coverage audit counts the student's states that the teacher pool holds. Migration 0004 goes up and
down on both databases."""

from __future__ import annotations

import numpy as np
import pytest
import sqlalchemy as sa
from helpers import SYNTH, Called, register_policy
from typer.testing import CliRunner

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, DistillConfig, ReplayConfig, RolloutConfig
from agentmem.errors import ConfigError
from agentmem.jobs import distill as distill_job
from agentmem.jobs.replay import audit_coverage, plan_branches, run_replay, teacher_calls
from agentmem.jobs.rollout import run_rollout
from agentmem.records import EpisodeStatus, Run, RunKind
from agentmem.replay.reopd import branch_probabilities, draw_branch_steps, state_coverage
from agentmem.testing.store_records import make_episode, make_invocation
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from agentmem.training.trainer import Models
from cli.app import app, error_message
from store import repository as repo
from store.engine import make_engine
from store.migrations import downgrade, upgrade


class RecordingBackend(TransformersBackend):
    def generate(self, prompts, params):
        self.seen = getattr(self, "seen", []) + [list(p) for p in prompts]
        return super().generate(prompts, params)


# --- drawing the branch step ----------------------------------------------------------------------------


def test_branch_probabilities_are_kappa_powers_normalised():
    assert branch_probabilities(4, 0.5).tolist() == [8 / 15, 4 / 15, 2 / 15, 1 / 15]
    assert branch_probabilities(3, 1.0).tolist() == pytest.approx([1 / 3] * 3)
    assert branch_probabilities(1, 0.6).tolist() == [1.0]


def test_branch_step_frequencies_match_kappa_within_binomial_tolerance():
    """Over many draws each step's count is within 4.5 binomial standard deviations of N p_t, per episode
    length (each episode normalised over its own steps); the draws are a function of the seed."""
    kappa, n = 0.6, 20_000
    lengths = [5] * n + [2] * n
    steps = np.array(draw_branch_steps(lengths, kappa, seed=11))
    for length, drawn in ((5, steps[:n]), (2, steps[n:])):
        p = branch_probabilities(length, kappa)
        counts = np.bincount(drawn, minlength=length)
        assert counts.shape == (length,)
        sigma = np.sqrt(n * p * (1 - p))
        assert np.all(np.abs(counts - n * p) <= 4.5 * sigma), (counts, n * p)
    assert draw_branch_steps(lengths[:50], kappa, 11) == steps[:50].tolist()
    assert draw_branch_steps(lengths[:50], kappa, 12) != steps[:50].tolist()


# --- the replay run -------------------------------------------------------------------------------------


def teacher_rollout(store) -> str:
    config = RolloutConfig(model="teacher", episodes=2, group_size=2, chunk_tokens=48, env_knobs=SYNTH,
                           agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, seed=5))
    policy = register_policy(store, "/models/teacher", "tiny")
    backend = TransformersBackend.from_model(tiny_llama(seed=3), tiny_tokenizer())
    return run_rollout(store, config, backend=backend, policy=policy).run_id


def replay(store, teacher_run, **kw):
    backend = RecordingBackend.from_model(tiny_llama(seed=0), tiny_tokenizer())
    policy = register_policy(store, "/models/student", "tiny")
    config = ReplayConfig(teacher_run=teacher_run[:8], model="student", group_size=2, kappa=0.6, seed=3, **kw)
    return config, backend, policy, run_replay(store, config, backend=backend, policy=policy)


def test_replay_run_stores_the_teacher_prompts_and_points_to_the_branched_calls(store):
    """(SQLite and Postgres) One episode per (teacher episode, sample), each with one call: the drawn
    teacher call's exact prompt ids (what the backend consumed), step, kind and memory, the student's
    outputs and log-probs, and parent_invocation_id = that teacher call. No reward; a resume adds nothing."""
    teacher_run = teacher_rollout(store)
    config, backend, policy, result = replay(store, teacher_run)
    _, agent, episodes = teacher_calls(store, teacher_run)
    branches = plan_branches(episodes, config)
    steps = draw_branch_steps([len(calls) for _, calls in episodes], 0.6, 3)
    assert [b.parent.step for b in branches] == [t for t in steps for _ in range(2)]
    with store.session() as s:
        run = repo.get_run(s, result.run_id)
        replayed = list(repo.stream_invocations(s, run_ids=[result.run_id]))
        teacher = {i.id: i for i in repo.stream_invocations(s, run_ids=[teacher_run])}
    assert run.kind is RunKind.replay and run.config["teacher_run"] == teacher_run and run.status == "finished"
    assert len(result.episodes) == len(replayed) == 2 * len(episodes) == result.calls == 8
    by_episode = {e.id: e for e in result.episodes}
    teacher_episode = {ep.id: ep for ep, _ in episodes}
    for inv in replayed:
        parent = teacher[inv.parent_invocation_id]
        assert inv.prompt_ids.tolist() == parent.prompt_ids.tolist()
        assert (inv.step, inv.kind, inv.memory_before, inv.chunk_index) == (parent.step, parent.kind,
                                                                           parent.memory_before, parent.chunk_index)
        assert inv.policy_version == policy.id and inv.output_logprobs.shape == inv.output_ids.shape
        assert len(inv.output_ids) <= (agent.answer_max_new_tokens if inv.kind == "answer" else agent.memory_tokens)
        ep, source = by_episode[inv.episode_id], teacher_episode[parent.episode_id]
        assert (ep.task_id, ep.question, ep.gold_answers) == (source.task_id, source.question, source.gold_answers)
        assert ep.sample_index // 2 == source.sample_index
        assert ep.status is EpisodeStatus.truncated and ep.reward is None and ep.f1 is None
    assert sorted(map(tuple, backend.seen)) == sorted(tuple(i.prompt_ids.tolist()) for i in replayed)
    assert sorted(i.parent_invocation_id for i in replayed) == sorted(b.parent.id for b in branches)
    again = run_replay(store, None, resume=result.run_id[:8], backend=backend, policy=policy)
    assert again.run_id == result.run_id and again.calls == 0
    with store.session() as s:
        assert repo.count_invocations(s, [result.run_id]) == 8
        with pytest.raises(sa.exc.IntegrityError):  # the branch link is a foreign key
            bad = make_invocation(result.episodes[0], 99, np.random.default_rng(0), 4, 2).model_copy(
                update={"parent_invocation_id": "nope"})
            repo.insert_invocations(s, [bad])
            s.flush()


def models(policy) -> Models:
    tok = tiny_tokenizer()
    return Models(tiny_llama(seed=0).train(), tok, policy, tiny_llama(seed=3).requires_grad_(False), tok)


def test_distill_on_a_replay_run_runs_two_steps(store, tmp_path):
    """(SQLite and Postgres) The aligned teacher scores the student's replayed tokens under the teacher's
    stored prompt: `distill --run REPLAY --rl none` unchanged."""
    teacher_run = teacher_rollout(store)
    _, _, policy, result = replay(store, teacher_run)
    config = DistillConfig(run_ids=[result.run_id], out=str(tmp_path), rl=dict(kind="none"), optim=dict(steps=2, lr=1e-3), batch=dict(invocations_per_step=4))
    done = distill_job.run_distill(store, config, models=models(policy))
    with store.session() as s:
        steps = repo.list_train_steps(s, done.run_id)
    assert [t.step for t in steps] == [1, 2] and all(np.isfinite(t.loss) and t.kd_loss > 0 for t in steps)


def test_rl_on_a_replay_run_is_refused_before_models_load(sqlite_store, tmp_path, monkeypatch):
    teacher_run = teacher_rollout(sqlite_store)
    _, _, _, result = replay(sqlite_store, teacher_run)

    def no_load(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(distill_job, "load_models", no_load)
    monkeypatch.setattr(distill_job, "resolve_models", no_load)
    config = DistillConfig(run_ids=[result.run_id], out=str(tmp_path))
    with pytest.raises(ConfigError, match=f"run {result.run_id} is a replay run .* no reward.*--rl none"):
        distill_job.run_distill(sqlite_store, config)


def test_replay_refuses_what_it_cannot_branch_from(sqlite_store):
    teacher_run = teacher_rollout(sqlite_store)
    _, _, _, result = replay(sqlite_store, teacher_run)
    with pytest.raises(Exception, match="is a replay run, not a rollout run"):
        replay(sqlite_store, result.run_id)
    with pytest.raises(ValueError, match="greater than 0"):
        ReplayConfig(teacher_run="r", kappa=0)


# --- the state-coverage audit ---------------------------------------------------------------------------


def test_state_coverage_is_exact_on_a_constructed_example(sqlite_store):
    """Student calls (task, step, memory): t0 (0, '') (1, 'a') (2, 'a b'); t1 (0, '') (1, 'x').
    Teacher pool: t0 (0, '') (1, 'a') (2, 'a c'); t1 (0, '') (1, 'y'); t2 (1, 'x').
    Matched: t0 steps 0 and 1, t1 step 0 (t1 'x' is only in another task): 3 of 5; after step 0, 1 of 3."""
    rng = np.random.default_rng(0)
    student, teacher = Run(kind=RunKind.rollout), Run(kind=RunKind.rollout)
    plan = [(student, {0: ["", "a", " a b "], 1: ["", "x"]}),
            (teacher, {0: ["", "a", "a c"], 1: ["", "y"], 2: ["", "x"]})]
    with sqlite_store.session() as s:
        for run, tasks in plan:
            repo.insert_run(s, run)
            for task, memories in tasks.items():
                ep = make_episode(run, task)
                repo.insert_episodes(s, [ep])
                repo.insert_invocations(s, [make_invocation(ep, t, rng, 4, 2).model_copy(update={"memory_before": m})
                                            for t, m in enumerate(memories)])
        s.commit()
    cov = audit_coverage(sqlite_store, student.id, teacher.id)
    assert (cov.matched, cov.total, cov.teacher_states) == (3, 5, 7)
    assert cov.share == 0.6 and cov.share_after_first == 1 / 3
    assert cov.by_step == {0: (2, 2), 1: (1, 2), 2: (0, 1)}
    url = str(sqlite_store.engine.url)
    out = CliRunner().invoke(app, ["replay-audit", "--student-run", student.id, "--teacher-run", teacher.id[:8],
                                   "--db", url])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0] == ("coverage=0.6000 matched=3 student_calls=5 teacher_states=7 "
                                          "coverage_after_step0=0.3333")
    assert out.output.splitlines()[1:] == ["step=0 matched=2 of=2 share=1.0000", "step=1 matched=1 of=2 share=0.5000",
                                           "step=2 matched=0 of=1 share=0.0000"]
    with pytest.raises(Exception, match="no student calls"):
        state_coverage([], [], {})


# --- the CLI --------------------------------------------------------------------------------------------


def test_rollout_replay_flags_reach_the_config(captured):
    runner = CliRunner()
    result = runner.invoke(app, ["rollout", "--replay-from", "abc123", "--kappa", "0.8", "--group-size", "4",
                                 "--model", "m", "--seed", "2", "--sample-temperature", "0.7", "--device", "cpu"])
    assert isinstance(result.exception, Called), result.output
    assert captured["replay"] == ReplayConfig(teacher_run="abc123", kappa=0.8, group_size=4, model="m", seed=2,
                                          temperature=0.7)
    bad = runner.invoke(app, ["rollout", "--replay-from", "abc123", "--episodes", "3", "--chunk-tokens", "64"])
    assert error_message(bad.exception) == ("--replay-from takes the tasks, prompts and token limits from the teacher "
                                            "run: --episodes, --chunk-tokens do(es) not apply")
    lone = runner.invoke(app, ["rollout", "--kappa", "0.5"])
    assert "give --replay-from RUN_ID" in error_message(lone.exception)


# --- migration 0004 -------------------------------------------------------------------------------------

_INSERT = (
    "insert into invocations (id, episode_id, step, kind, prompt_ids, output_ids, output_logprobs, prompt_text, "
    "output_text, memory_before, memory_after, prompt_tokens, output_tokens, finish_reason, temperature, latency_s, "
    "created_at{extra}) values (:id, 'e1', :step, 'answer', :p, :o, :o, '', '', '', '', 2, 1, 'stop', 1.0, 0.0, "
    "'2026-01-01 00:00:00'{values})"
)


def ids(*values: int) -> bytes:
    return np.array(values, "<i4").tobytes()


def test_migration_0004_keeps_rows_up_and_down(db_url):
    """Rows written at 0003 come up sampled 'aligned' with no privileged ids and no parent; on the way down a
    privileged call's ids go back into its prompt (what the sampler read) and the new columns go."""
    engine = make_engine(db_url)
    upgrade(engine, "0003")
    with engine.begin() as conn:
        conn.execute(sa.text("insert into runs (id, kind, config, status, created_at) "
                             "values ('r1', 'rollout', '{}', 'running', '2026-01-01 00:00:00')"))
        conn.execute(sa.text("insert into episodes (id, run_id, env, task_id, sample_index, question, "
                             "gold_answers, evidence, status, n_chunks, created_at) values ('e1', 'r1', 'synthetic', "
                             "'t', 0, 'q', '[]', '[]', 'running', 1, '2026-01-01 00:00:00')"))
        conn.execute(sa.text(_INSERT.format(extra="", values="")), {"id": "i0", "step": 0, "p": ids(1, 2), "o": ids(3)})
    upgrade(engine)
    with engine.begin() as conn:
        row = conn.execute(sa.text("select sampled_context, parent_invocation_id from invocation_history")).one()
        assert tuple(row) == ("aligned", None)
        assert conn.execute(sa.text("select privileged_ids from invocations")).scalar_one() is None
        conn.execute(sa.text(_INSERT.format(extra=", sampled_context, privileged_ids, parent_invocation_id",
                                            values=", 'privileged', :v, 'i0'")),
                     {"id": "i1", "step": 1, "p": ids(4, 5), "o": ids(6), "v": ids(7, 8, 9)})
    assert "ix_invocations_parent_invocation_id" in {i["name"] for i in sa.inspect(engine).get_indexes("invocations")}
    downgrade(engine, "0003")
    with engine.connect() as conn:
        rows = conn.execute(sa.text("select id, prompt_ids, prompt_tokens from invocations order by step")).all()
        assert conn.execute(sa.text("select count(*) from invocation_history")).scalar() == 2
    assert [(r[0], bytes(r[1]), r[2]) for r in rows] == [("i0", ids(1, 2), 2), ("i1", ids(7, 8, 9, 4, 5), 5)]
    insp = sa.inspect(engine)
    gone = {"sampled_context", "privileged_ids", "parent_invocation_id"}
    assert not gone & {c["name"] for c in insp.get_columns("invocations")}
    assert not gone & {c["name"] for c in insp.get_columns("invocation_history")}
    assert "role" in {c["name"] for c in insp.get_columns("invocation_history")}
    upgrade(engine)
    engine.dispose()
