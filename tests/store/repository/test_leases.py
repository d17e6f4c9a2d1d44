"""Episode leases (store.repository.leases) and rollout workers (agentmem.jobs.worker), on SQLite and Postgres.

Two owners never hold one episode (also two real processes racing); a write after the lease was taken over
raises LeaseLost and stores nothing; an expired lease is claimed again and the episode resumes exactly
from its last stored call (the rows equal an uninterrupted run's); a run is finished only when every
episode is; an episode claimed too often is marked failed with its error; and `agentmem rollout --workers
2` stores the same calls as one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, RolloutConfig
from agentmem.jobs.rollout import (
    LeaseTerms,
    StoreSink,
    create_rollout,
    rollout_loop,
    rollout_setup,
    run_rollout,
)
from agentmem.jobs.worker import run_worker
from agentmem.model_refs import ModelRef, register
from agentmem.records import EpisodeStatus, Invocation
from agentmem.testing.scripted_worker import respond
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.errors import LeaseLost
from store.repository import leases

ROOT = Path(__file__).resolve().parents[3]
SYNTH = {"context_tokens": 160, "distractors": 2, "hops": 2}


def config(episodes: int = 4, group_size: int = 2) -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=episodes, group_size=group_size, chunk_tokens=48, env_knobs=SYNTH,
                         agent=AgentConfig(memory_tokens=16, answer_max_new_tokens=8, max_batch=2, seed=1))


def scripted():
    tok = tiny_tokenizer()
    return ScriptedBackend(tok, respond(tok))


def policy_row(store):
    return register(store, ModelRef("tiny", "/models/tiny", "tiny"))


def new_run(store, cfg=None) -> str:
    return create_rollout(store, cfg or config(), backend=scripted())


def claim(store, run_id, owner, n=None, ttl=60.0, max_attempts=3):
    with store.session() as s:
        got = leases.claim(s, run_id, owner, n, ttl, max_attempts)
        s.commit()
    return [e.id for e in got]


def canonical(store, run_id):
    with store.session() as s:
        episodes = repo.list_episodes(s, run_id)
        invs = list(repo.stream_invocations(s, run_ids=[run_id]))
    key = {e.id: (e.task_id, e.sample_index) for e in episodes}
    calls = sorted((key[i.episode_id], i.step, i.kind, i.prompt_text, i.output_ids.tolist(), i.memory_before,
                    i.memory_after) for i in invs)
    outcomes = sorted((key[e.id], e.status.value, e.prediction, e.f1) for e in episodes)
    return calls, outcomes


def invocation(episode_id: str, step: int) -> Invocation:
    return Invocation(episode_id=episode_id, step=step, kind="update", prompt_ids=[1, 2], output_ids=[3],
                      output_logprobs=[0.0], prompt_text="p", output_text="o", memory_before="", memory_after="o")


def n_calls(store, run_id) -> int:
    with store.session() as s:
        return repo.count_invocations(s, [run_id])


# ---- claims ---------------------------------------------------------------------------------------------


def test_two_owners_never_claim_the_same_episode(store):
    rid = new_run(store)  # 8 episodes
    a = claim(store, rid, "a", 3)
    b = claim(store, rid, "b", 10)
    assert len(a) == 3 and len(b) == 5 and not set(a) & set(b)
    assert claim(store, rid, "c", 10) == []
    with store.session() as s:
        rows = s.execute(sa.text("select lease_owner, attempts from episodes")).all()
    assert sorted(o for o, _ in rows) == ["a"] * 3 + ["b"] * 5 and {n for _, n in rows} == {1}


RACER = textwrap.dedent("""
    import json, sys
    from store.repository import leases
    from store.engine import open_store
    store = open_store(sys.argv[1])
    mine = []
    while True:
        with store.session() as s:
            got = leases.claim(s, sys.argv[2], sys.argv[3], 1, 60.0, 3)
            s.commit()
        if not got:
            break
        mine += [e.id for e in got]
    print(json.dumps(mine))
""")


def test_processes_racing_for_claims_never_share_an_episode(store):
    rid = new_run(store, config(episodes=20, group_size=2))  # 40 episodes
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = store.engine.url.render_as_string(hide_password=False)
    procs = [subprocess.Popen([sys.executable, "-c", RACER, url, rid, f"racer{k}"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(3)]
    claimed = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        assert "database is locked" not in err
        claimed.append(json.loads(out))
    flat = [e for mine in claimed for e in mine]
    assert len(flat) == len(set(flat)) == 40


# ---- writes after the lease was lost ---------------------------------------------------------------------


def test_a_write_after_the_lease_was_taken_over_raises_and_stores_nothing(store):
    rid = new_run(store)
    (ep, other) = claim(store, rid, "a", 2, ttl=0.05)
    time.sleep(0.1)
    assert claim(store, rid, "b", 1) == [ep]  # a's expired lease is taken over
    with store.session() as s, pytest.raises(LeaseLost, match=r"worker a lost the lease of 1 episode"):
        leases.insert_invocations(s, "a", [invocation(ep, 0), invocation(other, 0)], 60.0)
    assert n_calls(store, rid) == 0  # neither episode: the whole write is refused
    with store.session() as s:  # the new owner writes; the old one may still write the episode it holds
        leases.insert_invocations(s, "b", [invocation(ep, 0)], 60.0)
        leases.insert_invocations(s, "a", [invocation(other, 0)], 60.0)
        s.commit()
    assert n_calls(store, rid) == 2

    sink = StoreSink(store, lease=LeaseTerms(owner="a"))  # the sink stores what it holds, returns what it lost
    assert sink.invocations([invocation(ep, 1), invocation(other, 1)]) == {ep}
    assert sink.lost == {ep} and n_calls(store, rid) == 3
    with store.session() as s:
        assert [i.step for i in repo.episode_invocations(s, ep)] == [0]


def test_an_expired_lease_is_reclaimed_and_the_episode_resumes_exactly(store):
    policy = policy_row(store)
    whole = run_rollout(store, config(), backend=scripted(), policy=policy)
    want = canonical(store, whole.run_id)

    rid = new_run(store)
    stalled = LeaseTerms(owner="stalled", seconds=0.2)
    backend = scripted()
    setup = rollout_setup(store, config(), backend=backend)
    loop = rollout_loop(store, setup, backend, policy)
    tasks = {t.task_id: t for t in setup.tasks}
    with store.session() as s:
        held = leases.claim(s, rid, stalled.owner, 3, stalled.seconds, stalled.max_attempts)
        s.commit()
    states = [loop.start(e, tasks[e.task_id]) for e in held]
    sink = StoreSink(store, lease=stalled)
    for _ in range(2):
        states, _ = loop.step(states, sink)
    assert n_calls(store, rid) == 6
    time.sleep(0.3)

    # another worker takes the three over (and does the rest), resuming each from its stored calls
    done = run_worker(store, rid[:8], lease=LeaseTerms(owner="fresh", seconds=30), backend=scripted(), policy=policy)
    assert done.runs == [rid] and done.finished_runs == [rid]
    assert done.stats.claimed == 8 and done.stats.resumed == 3 and done.stats.lost == 0
    stored = n_calls(store, rid)

    # the stalled worker wakes up: its round is refused and its episodes dropped, state and all
    states, stats = loop.step(states, sink)
    assert states == [] and stats.calls == 0 and stats.dropped == 3 and sink.lost == {e.id for e in held}
    assert n_calls(store, rid) == stored
    assert canonical(store, rid) == want
    with store.session() as s:
        assert repo.get_run(s, rid).status == "finished"


# ---- finishing ---------------------------------------------------------------------------------------------


def test_the_run_is_finished_only_when_every_episode_is(store):
    rid = new_run(store, config(episodes=2, group_size=1))
    (a,) = claim(store, rid, "a", 1)
    (b,) = claim(store, rid, "b", 1)
    with store.session() as s:
        ep_a, ep_b = repo.get_episode(s, a), repo.get_episode(s, b)
        leases.finish_episodes(s, "a", [ep_a.model_copy(update={"status": EpisodeStatus.answered})])
        assert not leases.finish_run_if_done(s, rid)
        s.commit()
        with pytest.raises(LeaseLost):
            leases.finish_episodes(s, "a", [ep_b.model_copy(update={"status": EpisodeStatus.answered})])
        s.rollback()
        assert repo.get_run(s, rid).status == "running"
        leases.finish_episodes(s, "b", [ep_b.model_copy(update={"status": EpisodeStatus.truncated})])
        assert leases.finish_run_if_done(s, rid)
        assert not leases.finish_run_if_done(s, rid)  # exactly once
        s.commit()
        assert repo.get_run(s, rid).status == "finished"
        rows = s.execute(sa.text("select lease_owner from episodes")).scalars().all()
    assert rows == [None, None]


def test_an_episode_claimed_too_often_is_failed_with_its_error(store):
    rid = new_run(store, config(episodes=2, group_size=1))
    first, second = claim(store, rid, "w1", ttl=0.01, max_attempts=2)
    with store.session() as s:  # the second episode's worker failed and said why; the first one's was killed
        assert leases.release(s, "w1", [second], error="RuntimeError: out of memory") == 1
        s.commit()
    time.sleep(0.05)
    assert sorted(claim(store, rid, "w2", ttl=0.01, max_attempts=2)) == sorted([first, second])
    time.sleep(0.05)
    assert claim(store, rid, "w3", max_attempts=2) == []
    with store.session() as s:
        eps = {e.id: e for e in repo.list_episodes(s, rid)}
        assert leases.finish_run_if_done(s, rid)
        s.commit()
    for e in eps.values():
        assert e.status is EpisodeStatus.failed and e.stop_reason == leases.EXHAUSTED
    assert eps[first].error == "lease expired 2 times"
    assert eps[second].error == "RuntimeError: out of memory"


def test_a_clean_stop_gives_the_attempt_back(store):
    rid = new_run(store, config(episodes=1, group_size=1))
    (ep,) = claim(store, rid, "w1", max_attempts=1)
    with store.session() as s:
        leases.release(s, "w1", [ep])
        s.commit()
    assert claim(store, rid, "w2", max_attempts=1) == [ep]


def test_an_interrupted_worker_releases_its_episodes(sqlite_store):
    class Interrupting(ScriptedBackend):
        calls = 0

        def generate(self, prompts, params):
            self.calls += 1
            if self.calls == 3:
                raise KeyboardInterrupt
            return super().generate(prompts, params)

    tok = tiny_tokenizer()
    rid = new_run(sqlite_store)
    policy = policy_row(sqlite_store)
    with pytest.raises(KeyboardInterrupt):
        run_worker(sqlite_store, rid, backend=Interrupting(tok, respond(tok)), policy=policy)
    with sqlite_store.session() as s:
        rows = s.execute(sa.text("select lease_owner, attempts from episodes where status = 'running'")).all()
    assert rows and all(owner is None and attempts == 0 for owner, attempts in rows)


# ---- through the CLI -----------------------------------------------------------------------------------


def test_rollout_with_two_workers_stores_the_calls_of_one(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    args = ["rollout", "--model", model, "--episodes", "3", "--group-size", "2", "--chunk-tokens", "48",
            "--memory-tokens", "12", "--answer-tokens", "6", "--batch", "1", "--sample-temperature", "0",
            "--knob", "context_tokens=120", "--knob", "distractors=1", "--threads", "1"]
    calls = {}
    for n in (1, 2):
        url = f"sqlite:///{tmp_path / f'w{n}.db'}"
        done = subprocess.run([sys.executable, "-m", "agentmem", *args, "--workers", str(n), "--db", url], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        assert "database is locked" not in done.stderr
        engine = sa.create_engine(url)
        with engine.connect() as c:
            rows = c.execute(sa.text(
                "select e.task_id, e.sample_index, i.step, i.kind, i.output_ids, e.status from invocations i "
                "join episodes e on e.id = i.episode_id")).all()
            assert c.execute(sa.text("select status from runs")).scalar() == "finished"
        engine.dispose()
        calls[n] = sorted(tuple(r) for r in rows)
        assert {r[-1] for r in rows} <= {"answered", "truncated"}
        if n == 2:
            assert done.stdout.count("worker=") == 2
    assert len(calls[1]) > 6 and calls[2] == calls[1]


def test_worker_cli_errors_are_one_line(sqlite_store):
    url = sqlite_store.engine.url.render_as_string()
    env = {**os.environ, "AGENTMEM_DB": ""}
    for args, needle in [(["--run", "nosuchrun"], "no run with id 'nosuchrun'"),
                         (["--max-attempts", "0"], "Invalid value for '--max-attempts'")]:
        done = subprocess.run([sys.executable, "-m", "agentmem", "worker", *args, "--db", url], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode in (1, 2) and needle in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    idle = subprocess.run([sys.executable, "-m", "agentmem", "worker", "--db", url], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert idle.returncode == 0 and "runs=- claimed=0" in idle.stdout, idle.stderr
