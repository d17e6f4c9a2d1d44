"""The store on SQLite and Postgres: migrations, exact round-trips, idempotency, order, views,
concurrent writers."""

from __future__ import annotations

import multiprocessing as mp
import re
from datetime import datetime, timezone

import numpy as np
import pytest
import sqlalchemy as sa

from agentmem.records import (
    Checkpoint,
    EpisodeStatus,
    EvalResult,
    InvocationKind,
    TeacherContext,
    TeacherScore,
    TrainStep,
)
from agentmem.testing.store_records import make_episode, make_invocation, make_run
from store import repository as repo
from store.bounds import LIMITS
from store.engine import make_engine, open_store
from store.errors import NotFound, SchemaOutOfDate, StoredRowError, ValueOutOfBounds
from store.migrations import current_revision, downgrade, head_revision, upgrade
from store.orm import Base, InvocationRow

TABLES = {"runs", "checkpoints", "episodes", "invocations", "teacher_scores", "train_steps", "eval_results",
          "serve_calls"}
VIEWS = {"invocation_history", "episode_summary"}


def test_migrations_up_down_and_models_agree(db_url):
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    insp = sa.inspect(engine)
    assert TABLES <= set(insp.get_table_names())
    assert VIEWS <= set(insp.get_view_names())
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"]: c["nullable"] for c in insp.get_columns(table.name)}
        assert migrated == {c.name: c.nullable for c in table.columns}, table.name
    downgrade(engine, "base")
    insp = sa.inspect(engine)
    assert not (TABLES | VIEWS) & (set(insp.get_table_names()) | set(insp.get_view_names()))
    upgrade(engine)  # and up again
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_schema_check_says_to_upgrade(db_url):
    make_engine(db_url).connect().close()  # an empty database (on SQLite: an empty file)
    with pytest.raises(SchemaOutOfDate, match=r"run `agentmem db upgrade"):
        open_store(db_url)


def test_migration_0002_keeps_rows_up_and_down(db_url):
    """Rows written at 0001 survive the upgrade (with the new columns' defaults) and the downgrade, even
    where other tables reference the table SQLite copies."""
    engine = make_engine(db_url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(sa.text("insert into runs (id, kind, config, status, created_at) "
                             "values ('r1', 'rollout', '{}', 'running', '2026-01-01 00:00:00')"))
        conn.execute(sa.text("insert into episodes (id, run_id, env, task_id, sample_index, question, "
                             "gold_answers, evidence, status, n_chunks, created_at) values ('e1', 'r1', 'synthetic', "
                             "'t', 0, 'q', '[]', '[]', 'running', 1, '2026-01-01 00:00:00')"))
        conn.execute(sa.text("insert into invocations (id, episode_id, step, kind, prompt_ids, output_ids, "
                             "output_logprobs, prompt_text, output_text, memory_before, memory_after, prompt_tokens, "
                             "output_tokens, finish_reason, temperature, latency_s, created_at) values ('i1', 'e1', 0, "
                             "'answer', :b, :b, :b, '', '', '', '', 0, 0, 'stop', 1.0, 0.0, '2026-01-01 00:00:00')"),
                     {"b": b""})
        conn.execute(sa.text("insert into teacher_scores (id, invocation_id, teacher, context, n_tokens, "
                             "token_logprobs, reverse_kl, entropy, created_at) values ('s1', 'i1', 't', 'aligned', 0, "
                             ":b, :b, :b, '2026-01-01 00:00:00')"), {"b": b""})
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("select memory_policy from invocation_history")).scalar_one() == "overwrite"
        assert conn.execute(sa.text("select temperature from teacher_scores")).scalar_one() == 1.0
        assert conn.execute(sa.text("select pid, host, error, heartbeat_at from runs")).one() == (None,) * 4
    downgrade(engine, "0001")
    with engine.connect() as conn:
        assert conn.execute(sa.text("select count(*) from teacher_scores join invocation_history "
                                    "on invocation_history.invocation_id = teacher_scores.invocation_id")).scalar() == 1
    insp = sa.inspect(engine)
    assert "memory_policy" not in {c["name"] for c in insp.get_columns("invocations")}
    assert "memory_policy" not in {c["name"] for c in insp.get_columns("invocation_history")}
    engine.dispose()


@pytest.mark.parametrize("prompt_len,output_len", [(0, 0), (1, 1), (600, 200), (32768, 32768)])
def test_invocation_round_trip_is_exact(store, prompt_len, output_len):
    rng = np.random.default_rng(prompt_len)
    run = make_run()
    ep = make_episode(run)
    inv = make_invocation(ep, 0, rng, prompt_len, output_len)
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        s.commit()
    with store.session() as s:
        (back,) = list(repo.stream_invocations(s, run_ids=[run.id]))
    assert back.prompt_ids.dtype == np.int32 and back.output_logprobs.dtype == np.float32
    np.testing.assert_array_equal(back.prompt_ids, inv.prompt_ids)
    np.testing.assert_array_equal(back.output_ids, inv.output_ids)
    assert back.output_logprobs.tobytes() == inv.output_logprobs.tobytes()  # bit-exact
    assert back.model_dump(exclude={"prompt_ids", "output_ids", "output_logprobs"}) == inv.model_dump(
        exclude={"prompt_ids", "output_ids", "output_logprobs"}
    )


def test_all_records_round_trip(store):
    run = make_run()
    base = Checkpoint(path="/models/base", base_model="SmolLM2-135M-Instruct")
    child = Checkpoint(run_id=run.id, parent_id=base.id, step=10, path="/out/step10", base_model=base.base_model)
    ep = make_episode(run)
    inv = make_invocation(ep, 0, np.random.default_rng(0), 5, 3).model_copy(
        update={"kind": "search", "memory_policy": "notes"})  # kinds are open strings, owned by the policy
    score = TeacherScore(run_id=run.id, invocation_id=inv.id, teacher="t", context=TeacherContext.privileged,
                         token_logprobs=[-0.5, -1.0, -2.0], reverse_kl=[0.1, 0.2, 0.3], entropy=[1.0, 2.0, 3.0],
                         temperature=0.7)
    step = TrainStep(run_id=run.id, step=3, loss=1.5, tokens=100, lr=1e-5,
                     metrics={"kd_loss": 1.0, "rl_loss": 0.5, "clip_frac": 0.25})
    result = EvalResult(run_id=run.id, checkpoint_id=child.id, model="/out/step10", env="synthetic",
                        n_episodes=8, f1=0.5, em=0.25, sub_em=0.375, f1_ci=(0.2, 0.8), em_ci=(0.0, 0.5),
                        sub_em_ci=(0.1, 0.6), metrics={"context_tokens": 1024})
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_checkpoint(s, base)
        repo.insert_checkpoint(s, child)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        repo.insert_teacher_scores(s, [score])
        repo.insert_train_step(s, step)
        repo.insert_eval_result(s, result)
        finished = ep.model_copy(update={"prediction": "Oslo", "f1": 1.0, "em": 1.0, "sub_em": 1.0, "reward": 1.0,
                                         "status": EpisodeStatus.answered, "stop_reason": "answered",
                                         "finished_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)})
        repo.update_episode(s, finished)
        repo.finish_run(s, run.id)
        s.commit()
    with store.session() as s:
        assert repo.get_run(s, run.id).model_dump(exclude={"status", "finished_at"}) == run.model_dump(
            exclude={"status", "finished_at"})
        assert repo.get_run(s, run.id).status == "finished"
        assert repo.get_checkpoint(s, child.id) == child
        assert repo.list_checkpoints(s, run.id) == [child]
        assert repo.get_episode(s, ep.id) == finished
        (back,) = repo.episode_invocations(s, ep.id)
        assert (back.kind, back.memory_policy) == ("search", "notes")
        assert [i.id for i in repo.stream_invocations(s, run_ids=[run.id], kinds=["search"])] == [inv.id]
        got = repo.get_teacher_scores(s, [inv.id], "t", TeacherContext.privileged)[inv.id]
        assert got.model_dump(exclude={"token_logprobs", "reverse_kl", "entropy"}) == score.model_dump(
            exclude={"token_logprobs", "reverse_kl", "entropy"})
        np.testing.assert_array_equal(got.reverse_kl, score.reverse_kl)
        assert repo.scored_invocation_ids(s, "t", TeacherContext.privileged) == {inv.id}
        assert repo.scored_invocation_ids(s, "t", TeacherContext.aligned) == set()
        assert repo.list_train_steps(s, run.id) == [step]
        # the kd and rl columns copy those terms from the metrics; a row whose metrics lack them reads them back
        assert s.execute(sa.text("select kd_loss, rl_loss from train_steps")).one() == (1.0, 0.5)
        s.execute(sa.text("update train_steps set metrics = '{\"clip_frac\": 0.25}', rl_loss = 0"))
        assert repo.list_train_steps(s, run.id)[0].metrics == {"kd_loss": 1.0, "clip_frac": 0.25}
        assert repo.list_eval_results(s, [run.id]) == [result]
        with pytest.raises(NotFound, match="no run with id 'nopenope'"):
            repo.get_run(s, "nopenope")
        with pytest.raises(NotFound, match="ids may be abbreviated to 6 or more characters"):
            repo.get_run(s, run.id[:5])
        assert repo.get_run(s, run.id[:6]).id == run.id  # abbreviated ids, as in git
        assert repo.get_episode(s, ep.id[:10]) == finished
        other = make_run(id=run.id[:6] + "0" * 26)
        repo.insert_run(s, other)
        with pytest.raises(NotFound, match="ambiguous"):
            repo.get_run(s, run.id[:6])


def test_inserts_are_idempotent_and_streams_ordered(store):
    rng = np.random.default_rng(1)
    run = make_run()
    eps = [make_episode(run, task=t) for t in range(3)]
    invs = [make_invocation(e, step, rng, 7, 2) for e in eps for step in (2, 0, 1)]
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, eps)
        repo.insert_invocations(s, invs)
        s.commit()
    # a resumed job re-offers everything, and the same (episode, step) under a new id
    dup = make_invocation(eps[0], 0, rng, 7, 2)
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [make_episode(run, task=0)] + eps)
        repo.insert_invocations(s, invs + [dup])
        s.commit()
    with store.session() as s:
        got = list(repo.stream_invocations(s, run_ids=[run.id], batch_size=2))
        assert len(repo.list_episodes(s, run.id)) == 3
        answers = list(repo.stream_invocations(s, run_ids=[run.id], kinds=[InvocationKind.answer]))
    assert len(got) == 9 and answers == []
    keys = [(i.episode_id, i.step) for i in got]
    assert keys == sorted(keys)
    assert {i.id for i in got} == {i.id for i in invs}


def test_nul_in_text_is_stored_as_replacement_character(store):
    run = make_run()
    ep = make_episode(run)
    inv = make_invocation(ep, 0, np.random.default_rng(3), 3, 2).model_copy(
        update={"output_text": "a\x00b", "memory_after": "\x00"})
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        repo.update_episode(s, ep.model_copy(update={"prediction": "x\x00"}))
        s.commit()
        (back,) = repo.episode_invocations(s, ep.id)
        assert (back.output_text, back.memory_after) == ("a\ufffdb", "\ufffd")
        assert repo.get_episode(s, ep.id).prediction == "x\ufffd"
        np.testing.assert_array_equal(back.output_ids, inv.output_ids)


def test_bounds_are_the_same_on_every_database(store):
    """A value a column cannot hold is refused before anything is written, with the same message on SQLite
    (which would store it) and Postgres (which would fail after the work is done); text for people keeps a NUL
    as U+FFFD on both."""
    assert (LIMITS["episodes.task_id"], LIMITS["invocations.kind"], LIMITS["invocations.id"]) == (255, 32, 64)
    run = make_run()
    ep = make_episode(run)
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
        with pytest.raises(ValueOutOfBounds, match=r"task_id is 256 characters long: at most 255 are stored "
                                                   r"\(episodes.task_id is VARCHAR\(255\)\)") as long:
            repo.insert_episodes(s, [ep.model_copy(update={"task_id": "t" * 256})])
        assert long.value.field == "task_id"
        with pytest.raises(ValueOutOfBounds, match=r"task_id contains a NUL character"):
            repo.insert_episodes(s, [ep.model_copy(update={"task_id": "a\x00"})])
        s.rollback()
        repo.insert_episodes(s, [ep.model_copy(update={"task_id": "t" * 255, "question": "q\x00"})])
        s.commit()
        assert (repo.get_episode(s, ep.id).task_id, repo.get_episode(s, ep.id).question) == ("t" * 255, "q\ufffd")
        inv = make_invocation(ep, 0, np.random.default_rng(3), 3, 2)
        with pytest.raises(ValueOutOfBounds, match=r"kind is 33 characters long: at most 32"):
            repo.insert_invocations(s, [inv.model_copy(update={"kind": "k" * 33})])
        s.rollback()
        for update, message in [({"reward": float("inf")}, r"reward must be a finite number, got inf"),
                                ({"reward": float("nan")}, r"reward must be a finite number, got nan"),
                                ({"f1": 7.0}, r"f1 must lie in \[0, 1\], got 7.0"),
                                ({"em": -0.5}, r"em must lie in \[0, 1\], got -0.5"),
                                ({"sub_em": float("-inf")}, r"sub_em must be a finite number")]:
            with pytest.raises(ValueOutOfBounds, match=f"episode {ep.id}: {message}"):
                repo.update_episode(s, ep.model_copy(update=update))
        s.rollback()
        assert repo.count_invocations(s, [run.id]) == 0
        back = repo.get_episode(s, ep.id)
        assert (back.reward, back.f1, back.em) == (None, None, None)


def test_rows_a_job_cannot_read_are_named_before_it_reads(store):
    """A reward stored before the bounds (inf on both databases; NaN too on Postgres, which SQLite stores as
    NULL), another schema's finish reason, log-probs and ids of unequal lengths: each is one StoredRowError naming
    the run, the row and the column."""
    run = make_run()
    ep = make_episode(run)
    inv = make_invocation(ep, 0, np.random.default_rng(3), 3, 2)
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        s.commit()
        repo.check_stored_rows(s, [run.id])  # whole rows pass
        fix = ": fix the row (agentmem sql --write) or leave its run out"
        nan = [("nan", f"episode {ep.id} has reward nan, not a finite number")] if s.bind.dialect.name != "sqlite" else []
        for value, line in [("inf", f"episode {ep.id} has reward inf, not a finite number"), *nan]:
            s.execute(sa.text("UPDATE episodes SET reward = :r"), {"r": float(value)})
            with pytest.raises(StoredRowError, match=f"^{re.escape(f'run {run.id}: {line}{fix}')}$"):
                repo.check_stored_rows(s, [run.id])
        s.rollback()
        s.execute(sa.text("UPDATE invocations SET finish_reason = 'weird'"))
        with pytest.raises(StoredRowError, match=f"^run {run.id}: invocation {inv.id} has finish_reason 'weird', "
                                                 "which this version does not read"):
            repo.check_stored_rows(s, [run.id])
        s.rollback()
        s.execute(sa.update(InvocationRow).values(output_logprobs=b"\0" * 4))
        with pytest.raises(StoredRowError, match=r"output_logprobs \(1\) and output_ids \(2\) differ in length"):
            repo.check_stored_rows(s, [run.id])
        s.rollback()


def test_views(store):
    rng = np.random.default_rng(2)
    run = make_run()
    ep = make_episode(run)
    invs = [make_invocation(ep, 0, rng, 10, 4),
            make_invocation(ep, 1, rng, 12, 3, kind=InvocationKind.answer)]
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, invs)
        s.commit()
        summary = s.execute(sa.text("select n_calls, prompt_tokens, output_tokens, status, question "
                                    "from episode_summary")).one()
        history = s.execute(sa.text("select step, kind, prompt_tokens, output_tokens from invocation_history "
                                    "order by step")).all()
    assert tuple(summary) == (2, 22, 7, "running", ep.question)
    assert [tuple(r) for r in history] == [(0, "memory_update", 10, 4), (1, "answer", 12, 3)]


def _writer(url: str, run_id: str, worker: int, n_episodes: int, n_calls: int) -> None:
    from agentmem.records import Run, RunKind

    st = open_store(url)
    rng = np.random.default_rng(worker)
    run = Run(id=run_id, kind=RunKind.rollout)
    for t in range(n_episodes):
        ep = make_episode(run, task=t, sample=worker)
        with st.session() as s:
            repo.insert_episodes(s, [ep])
            s.commit()
        for step in range(n_calls):
            with st.session() as s:
                repo.insert_invocations(s, [make_invocation(ep, step, rng, 50, 10)])
                s.commit()
    st.dispose()


def test_two_processes_write_at_once(store, db_url):
    run = make_run()
    with store.session() as s:
        repo.insert_run(s, run)
        s.commit()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(db_url, run.id, w, 10, 10)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    with store.session() as s:
        assert repo.count_invocations(s, [run.id]) == 200
        assert len(repo.list_episodes(s, run.id)) == 20
