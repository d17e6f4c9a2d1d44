"""``rollout --backend openai`` over several servers (``agentmem.backends.server_pool``): each episode stays on one
server, a server that fails is skipped and its calls answered by another, once; the stored calls equal those of one
server (greedy), with nothing lost or duplicated."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from serve_helpers import free_port, running

from agentmem import model_refs
from agentmem.backends.openai_backend import ServerUnavailable
from agentmem.backends.server_pool import ServerPool, rank
from agentmem.backends.types import Generation, SamplingParams
from agentmem.config import AgentConfig, BackendKind, RolloutConfig
from agentmem.errors import BackendError
from agentmem.jobs.rollout import run_rollout
from agentmem.records import FinishReason
from agentmem.runtime import CPU
from agentmem.serve.server import ServeConfig, build_server
from agentmem.testing.serving import dies_at
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[3]
URLS = [f"http://server{i}/v1" for i in range(3)]


class FakeServer:
    """Answers each prompt with its own length (as one token) and remembers what it was asked; ``down``: it
    fails as a dead server does; ``refuse``: it answers 400."""

    def __init__(self, url: str, down: bool = False, refuse: bool = False):
        self.base_url, self.down, self.refuse = url, down, refuse
        self.tokenizer = tiny_tokenizer()
        self.asked: list[list[list[int]]] = []

    def generate(self, prompts, params):
        if self.down:
            raise ServerUnavailable(f"cannot reach {self.base_url}/completions: connection refused")
        if self.refuse:
            raise BackendError(f"{self.base_url}/completions answered 400: bad request")
        self.asked.append(prompts)
        return [Generation([len(p)], [-0.5], FinishReason.stop, 0.0) for p in prompts]


def test_rank_is_stable_and_a_dead_server_moves_only_its_own_keys():
    keys = [f"episode{i}" for i in range(200)]
    first = {k: rank(k, URLS)[0] for k in keys}
    assert first == {k: rank(k, list(URLS))[0] for k in keys}  # a function of (key, urls) alone
    assert set(first.values()) == {0, 1, 2}
    without = URLS[:1] + URLS[2:]
    for k in keys:
        if first[k] != 1:  # keys whose server stays keep it; server 1's keys go to their second choice
            assert without[rank(k, without)[0]] == URLS[first[k]]
        else:
            assert without[rank(k, without)[0]] == URLS[rank(k, URLS)[1]]


def test_pool_places_by_key_fails_over_once_and_keeps_the_order():
    servers = [FakeServer(u) for u in URLS]
    pool = ServerPool(servers)
    keys = [f"e{i % 7}" for i in range(21)]
    prompts = [[1] * (i + 1) for i in range(21)]
    params = SamplingParams(temperature=0)
    out = pool.generate_keyed(keys, prompts, params)
    assert [g.output_ids for g in out] == [[len(p)] for p in prompts]
    for s, server in enumerate(servers):  # one request per server, holding exactly its keys' prompts
        mine = [p for k, p in zip(keys, prompts, strict=True) if rank(k, URLS)[0] == s]
        assert server.asked == ([mine] if mine else [])
    assert pool.failovers == 0

    servers[1].down = True
    for server in servers:
        server.asked.clear()
    out = pool.generate_keyed(keys, prompts, params)
    assert [g.output_ids for g in out] == [[len(p)] for p in prompts]  # every call answered once, in order
    asked = [p for server in servers for request in server.asked for p in request]
    assert sorted(map(len, asked)) == sorted(map(len, prompts))
    assert pool.failovers == 1
    moved = {k for k in keys if rank(k, URLS)[0] == 1}
    assert moved and all(servers[rank(k, URLS)[1]].asked for k in moved)

    servers[1].down = False  # back, but cooling down: not asked again before cooldown_s
    pool.generate_keyed(keys, prompts, params)
    assert pool.failovers == 1 and not servers[1].asked

    for server in servers:
        server.down = True
    with pytest.raises(BackendError, match="no server answered"):
        pool.generate_keyed(keys, prompts, params)
    servers[0].down, servers[0].refuse = False, True
    with pytest.raises(BackendError, match="answered 400"):  # the request's own fault: not retried elsewhere
        pool.generate_keyed(["x"], [[1]], params)


@pytest.fixture
def model_dir(tmp_path) -> str:
    return save_tiny(tmp_path / "tiny")


def config(model_dir: str) -> RolloutConfig:
    # batch 1: every call is a batch of its own wherever it goes, so greedy ids do not depend on the split
    return RolloutConfig(model=model_dir, episodes=3, group_size=2, chunk_tokens=48, env_knobs={"context_tokens": 100},
                         agent=AgentConfig(memory_tokens=6, answer_max_new_tokens=3, temperature=0, max_batch=1))


def calls(store, run_id: str) -> dict:
    with store.session() as s:
        eps = {e.id: e for e in repo.list_episodes(s, run_id)}
        assert {e.status.value for e in eps.values()} <= {"answered", "truncated"}
        return {(eps[i.episode_id].task_id, eps[i.episode_id].sample_index, i.step): i
                for i in repo.stream_invocations(s, run_ids=[run_id])}


def assert_same_calls(want: dict, got: dict) -> None:
    assert got.keys() == want.keys() and want  # nothing lost, nothing stored twice
    for key, inv in want.items():
        assert got[key].prompt_ids.tolist() == inv.prompt_ids.tolist()
        assert got[key].output_ids.tolist() == inv.output_ids.tolist()
        np.testing.assert_allclose(got[key].output_logprobs, inv.output_logprobs, atol=1e-5)


def pooled(store, cfg: RolloutConfig, urls: list[str]):
    ref = model_refs.resolve(store, cfg.model)
    return model_refs.sampler(store, ref, BackendKind.openai, cfg.dtype, CPU, base_url=urls)


def test_each_episode_stays_on_one_server_and_a_failing_server_is_skipped(sqlite_store, model_dir, tmp_path):
    cfg = config(model_dir)
    want = calls(sqlite_store, run_rollout(sqlite_store, cfg).run_id)
    stores = [open_store(f"sqlite:///{tmp_path / f'server{i}.db'}", create=True) for i in range(2)]
    servers = [build_server(s, ServeConfig(model=model_dir, dtype="float32", batch_window_ms=0)) for s in stores]
    with running(servers[0].app) as a, running(servers[1].app) as b:
        urls = [f"{a}/v1", f"{b}/v1"]
        policy, pool = pooled(sqlite_store, cfg, urls)
        assert isinstance(pool, ServerPool)
        both = run_rollout(sqlite_store, cfg.model_copy(update={"backend": BackendKind.openai, "base_url": urls}),
                           backend=pool, policy=policy)
    for server in servers:
        server.close("finished")
    got = calls(sqlite_store, both.run_id)
    assert_same_calls(want, got)
    served, expected = [], [Counter(), Counter()]
    for server, s in zip(servers, stores, strict=True):
        with s.session() as session:
            served.append(Counter(tuple(i.prompt_ids.tolist())
                                  for i in repo.stream_invocations(session, run_ids=[server.run_id])))
    for inv in got.values():  # every call of an episode on the episode's first-ranked server, once
        expected[rank(inv.episode_id, urls)[0]][tuple(inv.prompt_ids.tolist())] += 1
    assert served == expected  # (the episode ids are random: all of them may rank one server first)

    # one server fails at its third call (and every later one): its calls go to the other, each answered once
    stores.append(open_store(f"sqlite:///{tmp_path / 'server2.db'}", create=True))
    live = build_server(stores[2], ServeConfig(model=model_dir, dtype="float32", batch_window_ms=0))
    dying = build_server(stores[0], ServeConfig(model=model_dir, dtype="float32", batch_window_ms=0))
    with running(live.app) as a, running(dies_at(dying.app, 3)) as b:
        policy, pool = pooled(sqlite_store, cfg, [f"{a}/v1", f"{b}/v1"])
        failed_over = run_rollout(sqlite_store, cfg.model_copy(update={"backend": BackendKind.openai,
                                                                       "base_url": [f"{a}/v1", f"{b}/v1"]}),
                                  backend=pool, policy=policy)
    assert pool.failovers >= 1
    assert_same_calls(want, calls(sqlite_store, failed_over.run_id))


def test_a_server_killed_mid_call_loses_and_duplicates_nothing(sqlite_store, model_dir, tmp_path):
    """A real ``agentmem serve`` process SIGKILLed while it holds a request: the call is answered by the other
    server and stored once; the rollout equals one through a single server."""
    cfg = config(model_dir)
    want = calls(sqlite_store, run_rollout(sqlite_store, cfg).run_id)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentmem.testing.dying_server", model_dir,
                             f"sqlite:///{tmp_path / 'dying.db'}", str(port), "4"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        live = build_server(open_store(f"sqlite:///{tmp_path / 'live.db'}", create=True),
                            ServeConfig(model=model_dir, dtype="float32", batch_window_ms=0))
        with running(live.app) as a:
            urls = [f"http://127.0.0.1:{port}/v1", f"{a}/v1"]
            policy, pool = pooled(sqlite_store, cfg, urls)
            run = run_rollout(sqlite_store, cfg.model_copy(update={"backend": BackendKind.openai, "base_url": urls}),
                              backend=pool, policy=policy)
        assert proc.wait(30) == -9  # it died holding its fourth call
    finally:
        proc.kill()
    assert pool.failovers >= 1
    assert_same_calls(want, calls(sqlite_store, run.run_id))
