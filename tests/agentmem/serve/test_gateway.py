"""`agentmem serve --upstream` in front of other `agentmem serve` apps (a tiny random model): each call is
recorded once (the upstreams are told not to record), with the upstream's prompt log-probs; streams are
forwarded token by token; an episode sticks to one upstream; start-up waits for an upstream that is down and
`/health` reports each; a text-only provider's calls are stored not replayable (sft takes them, distill
refuses them)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from fastapi import FastAPI, Request
from serve_helpers import free_port, running

from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import ServeConfig
from agentmem.errors import ConfigError
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.engine import make_engine, open_store
from store.migrations import upgrade
from store.repository import serve as serve_repo

ROOT = Path(__file__).resolve().parents[3]


def _store(path: Path):
    url = f"sqlite:///{path}"
    upgrade(make_engine(url))
    return open_store(url)


def _calls(store, run_id: str) -> dict:
    with store.session() as s:
        return {c.id: c for c in repo.stream_invocations(s, run_ids=[run_id])}


def _ask(episode: str) -> list[dict]:
    return [{"role": "user", "content": f"Where does {episode} live?"}]


@pytest.fixture
def model_dir(tmp_path) -> str:
    return save_tiny(tmp_path / "tiny")


class _Gated(TransformersBackend):
    """Holds each decoding step after the first until ``released`` is set: a stream that reaches the client
    before then was forwarded token by token."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.released = threading.Event()

    def generate(self, prompts, params, *, top_logprobs: int = 0, on_step=None):
        def step(steps):
            ended = on_step(steps) if on_step is not None else set()
            if not self.released.wait(20):
                raise TimeoutError("the first token never reached the client")
            return ended

        return super().generate(prompts, params, top_logprobs=top_logprobs, on_step=step)


def test_gateway_records_once_with_prompt_logprobs_sticky_and_streamed(tmp_path, model_dir):
    stores = [_store(tmp_path / f"up{i}.db") for i in range(2)]
    gated = _Gated(model_dir, dtype="float32")
    gated.released.set()
    ups = [build_server(stores[0], ServeConfig(model=model_dir, run_name="up0"), api_key="k0"),
           # static batching: its steps go through the gated generate
           build_server(stores[1], ServeConfig(model="gated", run_name="up1", continuous_batching=False),
                        backend=gated, api_key="k0")]
    seen: list[list[tuple[int, list]]] = [[], []]
    for i, up in enumerate(ups):
        @up.app.middleware("http")
        async def _log(request, call_next, i=i):
            if request.url.path.endswith("/completions"):
                seen[i].append((request.headers.get("x-agentmem-record"), (await request.json())["prompt"]))
            return await call_next(request)

    store = _store(tmp_path / "gw.db")
    with running(ups[0].app) as root0, running(ups[1].app) as root1:
        urls = [f"{root0}/v1", f"{root1}/v1"]
        gw = build_server(store, ServeConfig(model=model_dir, upstream=urls, run_name="gw"), upstream_api_key="k0")
        assert gw.app.state.calls.settings.context_length == ups[0].app.state.calls.settings.context_length
        episodes = [f"e{k}" for k in range(6)]
        with running(gw.app) as root:
            ids = {}
            for ep in episodes:
                client = openai.OpenAI(base_url=f"{root}/episodes/{ep}/v1", api_key="unused", max_retries=0)
                ids[ep] = [client.chat.completions.create(model=model_dir, messages=_ask(ep), max_tokens=5,
                                                          temperature=0).id for _ in range(2)]
            # a stream through the gated upstream: its first chunk arrives while the upstream holds step 2
            gated_ep = next(ep for ep in (f"s{k}" for k in range(100))
                            if max(urls, key=lambda u: hashlib.sha256(f"{ep}\x00{u}".encode()).digest()) == urls[1])
            gated.released.clear()
            client = openai.OpenAI(base_url=f"{root}/episodes/{gated_ep}/v1", api_key="unused", max_retries=0)
            chunks = []
            for chunk in client.chat.completions.create(model=model_dir, messages=_ask("Ann"), max_tokens=6,
                                                        temperature=0, stream=True, logprobs=True):
                gated.released.set()
                chunks.append(chunk)
            health = httpx.get(f"{root}/health").json()
        gw.close("finished")
    for up in ups:
        up.close("finished")

    # recorded once: every upstream call said X-Agentmem-Record: no, and the upstreams stored nothing
    assert all(header == "no" for log in seen for header, _ in log) and sum(len(log) for log in seen) == 13
    for up_store, up in zip(stores, ups, strict=True):
        assert _calls(up_store, up.run_id) == {}
    stored = _calls(store, gw.run_id)
    assert len(stored) == 13
    # sticky: both calls of an episode went to one upstream, the first in rendezvous order
    tok = tiny_tokenizer()
    for ep in episodes:
        prompt = tok(tok.apply_chat_template(_ask(ep), add_generation_prompt=True, tokenize=False),
                     add_special_tokens=False)["input_ids"]
        went = [i for i, log in enumerate(seen) for _, p in log if p == [prompt]]
        first = max(range(2), key=lambda i: hashlib.sha256(f"{ep}\x00{urls[i]}".encode()).digest())
        assert went == [first, first], ep
        assert [stored[i].prompt_ids.tolist() for i in ids[ep]] == [prompt, prompt]
    # the upstream's prompt log-probs: a forward pass of the model over the prompt
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    call = stored[ids["e0"][0]]
    prompt = call.prompt_ids.tolist()
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    direct = [np.nan] + [logp[k - 1, t].item() for k, t in enumerate(prompt) if k > 0]
    with store.session() as s:
        sent = serve_repo.get_serve_call(s, call.id)
    np.testing.assert_allclose(sent.prompt_logprobs, np.asarray(direct, np.float32), atol=1e-5)
    assert sent.replayable and sent.client == {"episode": "e0", "task": "e0", "kind": "chat"}
    # the stream: its tokens and log-probs are the stored ones, its prompt log-probs came in the last chunk
    streamed = stored[chunks[0].id]
    lps = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(streamed.output_ids) == 6 and lps == pytest.approx(streamed.output_logprobs.tolist(), abs=1e-6)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == streamed.output_text
    with store.session() as s:
        assert serve_repo.get_serve_call(s, streamed.id).prompt_logprobs is not None
    assert [u["status"] for u in health["upstreams"]] == ["up", "up"] and health["status"] == "ok"
    assert [u["calls"] for u in health["upstreams"]] == [len(seen[0]), len(seen[1])]


def test_start_up_waits_for_an_upstream_and_health_reports_each(tmp_path, model_dir):
    up = build_server(_store(tmp_path / "up.db"), ServeConfig(model=model_dir, run_name="up"))
    late, never = free_port(), free_port()
    urls = [f"http://127.0.0.1:{late}/v1", f"http://127.0.0.1:{never}/v1"]
    with pytest.raises(ConfigError, match=rf"no upstream answered within 0.2 s: {urls[0]}: .*; {urls[1]}: "):
        build_server(_store(tmp_path / "none.db"), ServeConfig(model=model_dir, upstream=urls, upstream_wait=0.2))
    store = _store(tmp_path / "gw.db")
    built: list = []
    starting = threading.Thread(target=lambda: built.append(build_server(store, ServeConfig(
        model=model_dir, upstream=urls, upstream_wait=60))))
    starting.start()
    time.sleep(1.0)
    assert built == []  # still retrying: no upstream is up
    first = running(up.app, port=late)
    first.__enter__()
    try:
        starting.join(timeout=30)
        gw = built[0]
        with running(gw.app) as root:
            health = httpx.get(f"{root}/health")
            assert health.status_code == 200
            assert [(u["url"], u["status"]) for u in health.json()["upstreams"]] == [(urls[0], "up"), (urls[1], "down")]
            assert "ConnectError" in health.json()["upstreams"][1]["error"]
            client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
            reply = client.chat.completions.create(model=model_dir, messages=_ask("Bo"), max_tokens=3)
            with running(build_server(_store(tmp_path / "up2.db"), ServeConfig(model=model_dir)).app, port=never):
                deadline = time.monotonic() + 20  # re-probed with backoff (at most 8 s apart)
                while httpx.get(f"{root}/health").json()["upstreams"][1]["status"] != "up":
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
                first.__exit__(None, None, None)
                first = None
                # the episode's upstream is gone: its call goes to the other, which is then its upstream
                ep = next(e for e in (f"f{k}" for k in range(100))
                          if max(urls, key=lambda u: hashlib.sha256(f"{e}\x00{u}".encode()).digest()) == urls[0])
                moved = openai.OpenAI(base_url=f"{root}/episodes/{ep}/v1", api_key="unused", max_retries=0)
                moved_id = moved.chat.completions.create(model=model_dir, messages=_ask("Di"), max_tokens=2).id
                states = [(u["status"], u["calls"]) for u in httpx.get(f"{root}/health").json()["upstreams"]]
                assert states == [("down", 1), ("up", 1)]
            # every upstream gone: a call tries each, then gets 503, and /health says so
            with pytest.raises(openai.InternalServerError, match="no upstream is up"):
                client.chat.completions.create(model=model_dir, messages=_ask("Cy"), max_tokens=2)
            health = httpx.get(f"{root}/health")
            assert health.status_code == 503 and health.json()["status"] == "down"
    finally:
        if first is not None:
            first.__exit__(None, None, None)
    gw.close("finished")
    assert sorted(_calls(store, gw.run_id)) == sorted([reply.id, moved_id])


def test_text_provider_calls_are_not_replayable_sft_takes_them_distill_refuses(tmp_path, model_dir):
    provider = build_server(_store(tmp_path / "provider.db"), ServeConfig(model=model_dir, served_model_name="hosted"))
    db = tmp_path / "gw.db"
    store = _store(db)
    with running(provider.app) as up:
        gw = build_server(store, ServeConfig(model=model_dir, served_model_name="hosted", upstream=f"{up}/v1",
                                             upstream_text=True, run_name="text"))
        with running(gw.app) as root:
            client = openai.OpenAI(base_url=f"{root}/episodes/t/v1", api_key="unused", max_retries=0)
            replies = [client.chat.completions.create(model="hosted", messages=_ask(name), max_tokens=6, seed=1)
                       for name in ("Al", "Bea")]
            replies.append(openai.OpenAI(base_url=f"{root}/episodes/t/v1", api_key="unused", max_retries=0)
                           .completions.create(model="hosted", prompt="Bob lives in", max_tokens=4, temperature=0))
            with pytest.raises(openai.BadRequestError, match="top_k"):
                client.chat.completions.create(model="hosted", messages=_ask("Al"), max_tokens=2,
                                               extra_body={"top_k": 5})
            httpx.post(f"{root}/agentmem/episodes/t/reward", json={"reward": 1.0})
        gw.close("finished")
    provider.close("finished")
    tok = tiny_tokenizer()
    stored = _calls(store, gw.run_id)
    assert sorted(stored) == sorted(r.id for r in replies)
    for r in replies:
        call = stored[r.id]
        assert call.output_text == (r.choices[0].text if r.object == "text_completion" else r.choices[0].message.content)
        assert call.output_ids.tolist() == tok(call.output_text, add_special_tokens=False)["input_ids"]
        assert call.output_logprobs is None
        with store.session() as s:
            assert serve_repo.get_serve_call(s, r.id).replayable is False
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}

    def am(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cli.app", *args, "--db", f"sqlite:///{db}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)

    refused = am("distill", "--run", gw.run_id, "--student", model_dir, "--teacher", model_dir, "--steps", "1")
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert f"run {gw.run_id} has 3 calls" in refused.stderr and "agentmem sft" in refused.stderr
    tuned = am("sft", "--run", gw.run_id, "--student", model_dir, "--steps", "1", "--invocations-per-step", "3",
               "--out", str(tmp_path / "sft"))
    assert tuned.returncode == 0, tuned.stderr


def test_migration_0008_marks_stored_calls_replayable(tmp_path):
    """A served call stored before ``serve_calls.replayable`` existed is replayable after the upgrade, and the
    column goes away on the downgrade."""
    import sqlalchemy as sa

    from store.migrations import downgrade

    engine = make_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0007")
    with engine.begin() as conn:
        conn.execute(sa.text("PRAGMA foreign_keys=OFF"))
        conn.execute(sa.text("insert into serve_calls (invocation_id, sampling, client, created_at) "
                             "values ('i1', '{}', '{}', '2026-01-01 00:00:00')"))
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(sa.text("select invocation_id, replayable from serve_calls")).all() == [("i1", 1)]
    downgrade(engine, "0007")
    assert "replayable" not in {c["name"] for c in sa.inspect(engine).get_columns("serve_calls")}
    engine.dispose()


def test_a_groups_choices_route_where_the_group_went():
    """Choice i of an n > 1 call is episode E.i: its later calls go to E's upstream (rendezvous by E), other
    episodes spread over the upstreams."""
    from agentmem.serve.gateway import UpstreamSampler, affinity

    assert [affinity(e) for e in ("e7", "e7.0", "e7.12", "a.b", "v1.2.3", "x.")] == ["e7", "e7", "e7", "a.b", "v1.2",
                                                                                    "x."]
    sampler = UpstreamSampler([f"http://127.0.0.1:{9000 + i}/v1" for i in range(4)], tiny_tokenizer())
    try:
        for u in sampler.upstreams:
            u.up = True
        picked = {ep: sampler._pick(ep, set()).url for ep in [f"g{k}" for k in range(12)]}
        assert len(set(picked.values())) > 1
        for ep, url in picked.items():
            assert {sampler._pick(f"{ep}.{i}", set()).url for i in range(5)} == {url}
    finally:
        sampler.close()


def test_a_text_providers_tool_calls_are_stored_as_the_template_writes_them(tmp_path, model_dir):
    """--upstream-text with tools: the tools and tool_choice go to the provider; its tool calls come back to the
    client as tool_calls and are stored as the served template's assistant turn (Hermes <tool_call>), tokenized
    here and not replayable."""
    provider, bodies = FastAPI(), []

    @provider.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "hosted"}]}

    @provider.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        bodies.append(await request.json())
        call = {"id": "p1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "hosted",
                "choices": [{"index": 0, "finish_reason": "tool_calls",
                             "message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}

    weather = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                                "parameters": {"type": "object", "properties": {
                                                    "city": {"type": "string"}}, "required": ["city"]}}}
    store = _store(tmp_path / "gw.db")
    with running(provider) as up:
        gw = build_server(store, ServeConfig(model=model_dir, served_model_name="hosted", upstream=f"{up}/v1",
                                             upstream_text=True, run_name="tools", chat_template="chatml_tools"))
        with running(gw.app) as root:
            client = openai.OpenAI(base_url=f"{root}/episodes/w/v1", api_key="unused", max_retries=0)
            r = client.chat.completions.create(model="hosted", messages=_ask("Bob"), tools=[weather],
                                               tool_choice="auto", max_tokens=30)
        gw.close("finished")
    assert bodies[0]["tools"] == [weather] and bodies[0]["tool_choice"] == "auto"
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("weather", {"city": "Oslo"})
    assert r.choices[0].finish_reason == "tool_calls"
    stored = _calls(store, gw.run_id)[r.id]
    assert stored.output_text == '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    tok = tiny_tokenizer()
    assert stored.output_ids.tolist() == tok(stored.output_text, add_special_tokens=False)["input_ids"]
    with store.session() as s:
        assert serve_repo.get_serve_call(s, r.id).replayable is False
