"""Postgres restarted in the middle of a rollout: the workers lose their connections, retry with backoff
(``store.retry``) and finish the run, with every episode's calls equal to an uninterrupted run's.

The test starts its own throwaway server (``scripts/pg_throwaway.sh``) so that it can restart it; it is
skipped where the server binaries are missing.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from fault_helpers import BINDIR, ROOT, calls_by_episode, fault_config, own_server, pg_ctl, pg_port  # noqa: F401 (own_server is a fixture)

from agentmem.backends.scripted import ScriptedBackend
from agentmem.jobs.rollout import create_rollout, run_rollout
from agentmem.model_refs import ModelRef, register
from agentmem.testing.scripted_worker import respond
from agentmem.testing.tiny_models import tiny_tokenizer
from store.engine import make_engine, open_store
from store.migrations import upgrade

pytestmark = [pytest.mark.postgres,
              pytest.mark.skipif(not BINDIR or sys.platform != "linux", reason="no PostgreSQL server binaries")]


def test_workers_finish_after_a_postgres_restart(own_server):  # noqa: F811 - the fixture
    url, data = own_server
    upgrade(make_engine(url))
    store = open_store(url)
    tok = tiny_tokenizer()
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    reference = run_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy).run_id
    run_id = create_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)))
    workers = [subprocess.Popen([sys.executable, "-m", "agentmem.testing.scripted_worker", url, run_id, str(tag), "30",
                                 "0.1", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for tag in range(2)]
    engine = store.engine
    # restart only once both workers are past start-up (opening the store checks its schema, which is not
    # retried: a worker that cannot reach the store when it starts fails at once; the next test covers a
    # store that goes away between start-up and the first claim)
    for w in workers:
        assert w.stdout is not None and w.stdout.readline().strip() == "registered", w.stderr and w.stderr.read()[-3000:]

    def stored() -> int:
        with engine.connect() as c:
            return c.execute(sa.text("select count(*) from invocations i join episodes e on e.id = i.episode_id "
                                     "where e.run_id = :r"), {"r": run_id}).scalar()

    deadline = time.time() + 120
    while stored() < 10 and time.time() < deadline:
        time.sleep(0.1)
    before = stored()
    engine.dispose()
    pg_ctl(data, "-m", "fast", "-w", "-l", f"'{data}/server.log'", "restart", "-o", f"'-h 127.0.0.1 -p {pg_port(url)} "
                  "-k /tmp -F'")
    outs = [w.communicate(timeout=300) for w in workers]
    for w, (_out, err) in zip(workers, outs, strict=True):
        assert w.returncode == 0, err[-3000:]
    with engine.connect() as c:
        assert c.execute(sa.text("select status from runs where id = :r"), {"r": run_id}).scalar() == "finished"
        statuses = set(c.execute(sa.text("select status from episodes where run_id = :r"), {"r": run_id}).scalars())
    assert statuses == {"answered"}
    want, got = calls_by_episode(engine, reference), calls_by_episode(engine, run_id)
    assert {k: [r[:-1] for r in v] for k, v in got.items()} == {k: [r[:-1] for r in v] for k, v in want.items()}
    assert 0 < before < sum(len(v) for v in want.values())  # the restart came mid-run
    assert any("lost its connection" in err for _, err in outs)  # and the workers did retry


def test_a_worker_waits_for_a_store_that_goes_away_before_its_first_claim(own_server):  # noqa: F811 - the fixture
    """The store stops between a worker's start-up and its first read of the run (the worker is held at that
    point): reading the run's config, setting it up, releasing dead leases and claiming all wait for the
    server, and the run finishes with the same calls as an uninterrupted run."""
    import os

    url, data = own_server
    upgrade(make_engine(url))
    store = open_store(url)
    tok = tiny_tokenizer()
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    reference = run_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy).run_id
    run_id = create_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)))
    w = subprocess.Popen([sys.executable, "-m", "agentmem.testing.scripted_worker", url, run_id, "0", "30", "0", "2"],
                         cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "AGENTMEM_WORKER_GO": "stdin"})
    assert w.stdout is not None and w.stdout.readline().strip() == "registered", w.stderr and w.stderr.read()[-3000:]
    store.engine.dispose()
    pg_ctl(data, "-m", "fast", "-w", "stop")
    assert w.stdin is not None and w.stderr is not None
    w.stdin.write("go\n")
    w.stdin.flush()
    seen = ""
    while "lost its connection" not in seen:  # blocks until the worker has met the stopped server
        line = w.stderr.readline()
        assert line, seen[-3000:]  # the worker ended without retrying
        seen += line
    assert "store: reading the run lost its connection" in seen, seen[-3000:]
    pg_ctl(data, "-w", "-l", f"'{data}/server.log'", "start", "-o", f"'-h 127.0.0.1 -p {pg_port(url)} -k /tmp -F'")
    out, err = w.communicate(timeout=300)
    assert w.returncode == 0, (seen + err)[-3000:]
    assert "calls=" in out and "finished=" + run_id in out, out
    with store.engine.connect() as c:
        assert c.execute(sa.text("select status from runs where id = :r"), {"r": run_id}).scalar() == "finished"
    want, got = calls_by_episode(store.engine, reference), calls_by_episode(store.engine, run_id)
    assert {k: [r[:-1] for r in v] for k, v in got.items()} == {k: [r[:-1] for r in v] for k, v in want.items()}
