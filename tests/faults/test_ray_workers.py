"""Rollout workers as Ray actors (``agentmem.jobs.ray_rollout``) on the session's local Ray cluster and a throwaway
Postgres, with faults: actors SIGKILLed while they hold leases, an inference server SIGKILLed mid-call, Postgres
restarted during a round. Each run ends with every episode finished exactly once: its calls equal, row for row,
those of an uninterrupted single-process run (0 lost, 0 duplicated), and each process's calls of an episode form
one block (0 mixed: a stale writer never wrote after a takeover). Skips without the ``ray`` extra."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import sqlalchemy as sa
from fault_helpers import ROOT, fault_config, own_server, pg_ctl, pg_port, tally  # noqa: F401 (own_server is a fixture)

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, BackendKind, RolloutConfig
from agentmem.errors import ConfigError, RunError
from agentmem.jobs import ray_rollout
from agentmem.jobs.rollout import LeaseTerms, create_rollout, run_rollout
from agentmem.model_refs import ModelRef, register
from agentmem.testing.scripted_worker import respond, tagged_sampler
from agentmem.testing.serving import free_port, running
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.engine import make_engine, open_store
from store.migrations import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.ray]
LEASE = LeaseTerms(seconds=30, max_attempts=1000)  # an episode changes hands only when its worker died


def pg_store(store):
    if store.engine.dialect.name != "postgresql":
        pytest.skip("Ray workers on several machines share a Postgres store")
    return store.engine.url.render_as_string(hide_password=False)


def reference_and_run(store, cfg: RolloutConfig) -> tuple[str, str]:
    tok = tiny_tokenizer()
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    reference = run_rollout(store, cfg, backend=ScriptedBackend(tok, respond(tok)), policy=policy).run_id
    return reference, create_rollout(store, cfg, backend=ScriptedBackend(tok, respond(tok)))


def in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_refusals_are_one_line_before_anything_is_written(ray_cluster):
    with pytest.raises(ConfigError, match="a SQLite file is one machine's"):
        ray_rollout.check_store("sqlite:///agentmem.db")
    ray_rollout.check_store("postgresql+psycopg://u@h/db")
    with pytest.raises(RunError, match=r"--workers 2 x --worker-gpus 1 needs 2"):
        ray_rollout.connect(ray_rollout.Placement(workers=2, gpus=1))  # the session's cluster has no GPU
    with pytest.raises(RunError, match=r"has 4 CPUs .*--worker-cpus 3 needs 6"):
        ray_rollout.connect(ray_rollout.Placement(workers=2, cpus=3))


def test_the_cli_runs_ray_workers_and_refuses_an_unreachable_cluster_and_sqlite(store, ray_cluster, tmp_path):
    url = pg_store(store)
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}

    def agentmem(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.app", "rollout", "--episodes", "2", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)

    unreachable = agentmem("--ray", "--ray-address", f"127.0.0.1:{free_port()}", "--workers", "2", "--db", url)
    assert unreachable.returncode == 1 and unreachable.stderr.strip().count("\n") == 0, unreachable.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:" in unreachable.stderr
    sqlite = agentmem("--ray", "--db", str(tmp_path / "x.db"))
    assert sqlite.returncode == 1 and "a SQLite file is one machine's" in sqlite.stderr, sqlite.stderr
    assert not (tmp_path / "x.db").exists()
    with store.session() as s:
        assert not repo.list_runs(s)  # nothing written

    tokenizer = save_tiny(tmp_path / "tiny")  # an oracle rollout: the workers load no weights
    ran = agentmem("--ray", "--ray-address", ray_cluster, "--workers", "2", "--policy", "oracle", "--model",
                   tokenizer, "--knob", "context_tokens=100", "--chunk-tokens", "48", "--db", url)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "ray_workers=2 claimed=2 " in ran.stdout and " lost=0" in ran.stdout, ran.stdout
    run_id = ran.stdout.split("run_id=")[1].split()[0]
    with store.session() as s:
        assert repo.get_run(s, run_id).status == "finished"
        assert {e.status.value for e in repo.list_episodes(s, run_id)} == {"answered"}


def test_killed_actors_are_restarted_and_lose_duplicate_and_mix_nothing(store, ray_cluster):
    url = pg_store(store)
    reference, run_id = reference_and_run(store, fault_config())
    placement = ray_rollout.Placement(workers=2, max_restarts=-1)
    thread, box = in_thread(lambda: ray_rollout.work_with_ray(
        url, run_id, placement, LEASE, device="cpu", batch=2, sampler=functools.partial(tagged_sampler, sleep_s=0.1)))
    engine = store.engine
    kills, killed = 0, set()
    deadline = time.time() + 300
    while kills < 3 and thread.is_alive() and time.time() < deadline:
        time.sleep(0.5)
        with engine.connect() as c:  # the processes holding a lease of an episode with stored calls
            owners = c.execute(sa.text(
                "select distinct e.lease_owner from episodes e where e.run_id = :r and e.status = 'running' "
                "and e.lease_owner is not null and exists (select 1 from invocations i where i.episode_id = e.id)"),
                {"r": run_id}).scalars().all()
        pids = sorted({int(o.split(":")[1]) for o in owners} - killed)
        if pids:
            os.kill(pids[0], signal.SIGKILL)  # an actor's process, mid-episode: Ray restarts it
            killed.add(pids[0])
            kills += 1
    thread.join(300)
    assert "error" not in box, box.get("error")
    assert kills == 3, f"only {kills} kills happened: the run finished too soon"
    lost, duplicates, differ, mixed_episodes, taken_over = tally(engine, reference, run_id)
    print(f"ray_kills={kills} lost_calls={lost} duplicates={duplicates} differ={differ} mixed={mixed_episodes} "
          f"taken_over={taken_over}")
    assert (lost, duplicates, differ, mixed_episodes) == (0, 0, 0, 0)
    assert taken_over > 0 and len(box["result"].owners) == 2


def test_actors_share_servers_and_a_server_killed_mid_call_loses_nothing(store, ray_cluster, tmp_path):
    """The actors load no model: they are clients of two ``agentmem serve`` servers; one is SIGKILLed holding a
    call, which the other answers; the calls equal a direct greedy rollout's."""
    from agentmem.serve.server import ServeConfig, build_server

    url = pg_store(store)
    model = save_tiny(tmp_path / "tiny")
    cfg = RolloutConfig(model=model, episodes=4, group_size=2, chunk_tokens=48, env_knobs={"context_tokens": 100},
                        agent=AgentConfig(memory_tokens=6, answer_max_new_tokens=3, temperature=0, max_batch=1))
    want = run_rollout(store, cfg).run_id
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentmem.testing.dying_server", model,
                             f"sqlite:///{tmp_path / 'dying.db'}", str(port), "5"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        live = build_server(open_store(f"sqlite:///{tmp_path / 'live.db'}", create=True),
                            ServeConfig(model=model, dtype="float32", batch_window_ms=0))
        with running(live.app) as a:
            urls = [f"http://127.0.0.1:{port}/v1", f"{a}/v1"]
            run_id = create_rollout(store, cfg.model_copy(update={"backend": BackendKind.openai, "base_url": urls}))
            result = ray_rollout.work_with_ray(url, run_id, ray_rollout.Placement(workers=2), LEASE, device="cpu")
        assert proc.wait(30) == -9  # it died holding its fifth call
    finally:
        proc.kill()
    assert result.stats.lost == 0

    def calls(run: str) -> dict:
        with store.session() as s:
            eps = {e.id: e for e in repo.list_episodes(s, run)}
            assert {e.status.value for e in eps.values()} <= {"answered", "truncated"}
            return {(eps[i.episode_id].task_id, eps[i.episode_id].sample_index, i.step): i
                    for i in repo.stream_invocations(s, run_ids=[run])}

    a, b = calls(want), calls(run_id)
    assert a.keys() == b.keys() and a  # 0 lost, 0 duplicated
    for key, inv in a.items():
        assert b[key].output_ids.tolist() == inv.output_ids.tolist()
        np.testing.assert_allclose(b[key].output_logprobs, inv.output_logprobs, atol=1e-5)


def test_actors_finish_after_a_postgres_restart(own_server, ray_cluster):  # noqa: F811 - the fixture
    url, data = own_server
    upgrade(make_engine(url))
    store = open_store(url)
    reference, run_id = reference_and_run(store, fault_config())
    engine = store.engine
    thread, box = in_thread(lambda: ray_rollout.work_with_ray(
        url, run_id, ray_rollout.Placement(workers=2), LEASE, device="cpu", batch=2,
        sampler=functools.partial(tagged_sampler, sleep_s=0.1)))

    def stored() -> int:
        with engine.connect() as c:
            return c.execute(sa.text("select count(*) from invocations i join episodes e on e.id = i.episode_id "
                                     "where e.run_id = :r"), {"r": run_id}).scalar()

    deadline = time.time() + 120
    while stored() < 20 and time.time() < deadline:  # both actors are in their rounds
        time.sleep(0.3)
    engine.dispose()
    pg_ctl(data, "-m", "fast", "-w", "stop")
    time.sleep(3)  # the actors' store calls fail and retry with backoff
    pg_ctl(data, "-w", "-l", f"'{data}/server.log'", "start", "-o", f"'-h 127.0.0.1 -p {pg_port(url)} -k /tmp -F'")
    thread.join(300)
    assert "error" not in box, box.get("error")
    lost, duplicates, differ, mixed_episodes, _ = tally(engine, reference, run_id)
    print(f"pg_restart lost_calls={lost} duplicates={duplicates} differ={differ} mixed={mixed_episodes}")
    assert (lost, duplicates, differ, mixed_episodes) == (0, 0, 0, 0)
    store.dispose()
