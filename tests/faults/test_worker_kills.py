"""Rollout workers killed with SIGKILL at random points, on Postgres: nothing lost, duplicated or mixed.

Three worker processes (``agentmem.testing.scripted_worker``: the scripted backend, so every process answers a prompt
alike) share one run; a live worker that stored the latest call of an unfinished episode is killed (kill -9)
whenever new calls were stored since the last kill, and a fresh one started in its place,
``AGENTMEM_FAULT_KILLS`` times (default 6). Choosing the victim that way makes every kill land mid-episode, so
another process must take an episode over (a random victim could be one still starting up, and six such
misses in a row left nothing taken over in one CI run). Each process stores its own number as every call's ``latency_s``. Then:

- lost = 0 and duplicates = 0: every episode's stored calls equal, row for row, those of an uninterrupted
  single-process run of the same config (the run is finished, every episode answered);
- mixed = 0: in every episode, each process's calls form one contiguous block of steps (a stale worker
  writing after another took the episode over would make a process's block reappear).

Leases last 30 s, longer than any round even on a loaded machine, so an episode changes hands only when its
worker was killed (the others see at once that its process is gone); a worker that stalls alive past its
lease and is refused is ``tests/store/repository/test_leases.py``'s case. With short leases a loaded machine would let a live
worker lose an episode and later claim it back, a legitimate history the block check would call mixed.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from fault_helpers import ROOT, fault_config, tally

from agentmem.backends.scripted import ScriptedBackend
from agentmem.jobs.rollout import create_rollout, run_rollout
from agentmem.model_refs import ModelRef, register
from agentmem.testing.scripted_worker import respond
from agentmem.testing.tiny_models import tiny_tokenizer

KILLS = int(os.environ.get("AGENTMEM_FAULT_KILLS", "6"))

pytestmark = pytest.mark.postgres


def test_killed_workers_lose_duplicate_and_mix_nothing(store):
    if store.engine.dialect.name != "postgresql":
        pytest.skip("workers on several machines share a Postgres store")
    tok = tiny_tokenizer()
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    reference = run_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)), policy=policy).run_id
    run_id = create_rollout(store, fault_config(), backend=ScriptedBackend(tok, respond(tok)))
    url = store.engine.url.render_as_string(hide_password=False)
    engine = store.engine
    rng = random.Random(13)

    def start(tag: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "agentmem.testing.scripted_worker", url, run_id, str(tag), "30",
                                 "0.05", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stored() -> int:
        with engine.connect() as c:
            return c.execute(sa.text("select count(*) from invocations i join episodes e on e.id = i.episode_id "
                                     "where e.run_id = :r"), {"r": run_id}).scalar()

    def mid_episode() -> set[int]:
        """The processes that stored the latest call of an episode still running: killing one of them
        leaves an episode half done for another process to take over."""
        with engine.connect() as c:
            tags = c.execute(sa.text(
                "select i.latency_s from invocations i join episodes e on e.id = i.episode_id "
                "where e.run_id = :r and e.status = 'running' "
                "and i.step = (select max(j.step) from invocations j where j.episode_id = e.id)"),
                {"r": run_id}).scalars().all()
        return {int(t) for t in tags}

    workers = {tag: start(tag) for tag in range(3)}
    next_tag, kills, last = 3, 0, 0
    deadline = time.time() + 400
    while kills < KILLS and time.time() < deadline:
        time.sleep(rng.uniform(0.2, 1.2))
        now = stored()
        live = [t for t, p in workers.items() if p.poll() is None]
        if not live:
            break
        busy = sorted(set(live) & mid_episode())
        if now > last and busy:  # kill only mid-episode, while calls are being stored: a kill at start-up
            victim = rng.choice(busy)  # or between episodes tests no takeover

            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(30)
            kills, last = kills + 1, now
            workers[next_tag] = start(next_tag)
            next_tag += 1
    for tag, p in workers.items():
        out, err = p.communicate(timeout=max(30, deadline - time.time()))
        assert p.returncode in (0, -signal.SIGKILL), (tag, err)
    assert kills == KILLS, f"only {kills} kills happened: the run finished too soon"

    lost, duplicates, differ, mixed_episodes, taken_over = tally(engine, reference, run_id)
    print(f"kills={kills} lost_calls={lost} duplicates={duplicates} differ={differ} mixed={mixed_episodes} "
          f"taken_over={taken_over}")
    assert (lost, duplicates, differ, mixed_episodes) == (0, 0, 0, 0)
    assert taken_over > 0  # some kills landed mid-episode, and another process resumed it
