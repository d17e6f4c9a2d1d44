"""Token-by-token streaming of `agentmem serve` on a backend with a step hook (the transformers backend's
`on_step`): the first chunk leaves when the first token is sampled, stop strings and tool calls hold back only the
text that may begin them, and a row ends as soon as its stop string completes. Deterministic: the backend waits on
an event after its first step, which the test sets only once it has received the first token's chunk."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from serve_helpers import running

from agentmem.backends.transformers_backend import Step
from agentmem.backends.types import Generation, SamplingParams
from agentmem.config import ServeConfig
from agentmem.records import FinishReason
from agentmem.serve.formatting import LiveText
from agentmem.serve.sampler import Tokens
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo

QUESTION = [{"role": "user", "content": "Where does Bob live?"}]
SAID = "Bob lives in Oslo. Alice lives in Lyon."
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]


class SteppedScript:
    """Says ``text`` token by token through ``on_step``, as the transformers backend samples (log-prob of token k:
    -k/10), and waits on ``release`` after its first step; ``steps`` counts the steps it made."""

    name = "stepped"

    def __init__(self, tokenizer, text: str):
        self.tokenizer, self.text = tokenizer, text
        self.release = threading.Event()
        self.steps = 0

    def generate(self, prompts: list[list[int]], params: SamplingParams, *, top_logprobs: int = 0,
                 on_step=None) -> list[Generation]:
        said = [*self.tokenizer(self.text, add_special_tokens=False)["input_ids"], self.tokenizer.eos_token_id]
        ids: list[list[int]] = [[] for _ in prompts]
        live = set(range(len(prompts)))
        for k in range(min(len(said), params.max_new_tokens)):
            steps = [Step(row, said[k], -k / 10) for row in sorted(live)]
            for row in live:
                ids[row].append(said[k])
            self.steps += 1  # counted before the step is handed on: its chunk may reach the client at once
            ended = set(on_step(steps) or ()) if on_step is not None else set()
            if self.steps == 1:
                assert self.release.wait(30), "the test never saw the first token"
            live -= ended
            if not live:
                break
        return [Generation(i, [-k / 10 for k in range(len(i))],
                           FinishReason.stop if i[-1] == said[-1] or len(i) < params.max_new_tokens
                           else FinishReason.length, 0.0) for i in ids]


def test_the_first_chunk_leaves_when_the_first_token_is_sampled(sqlite_store):
    """The backend is held after its first step until the client has the first token's chunk (which therefore
    left before the generation finished); the stream then carries every token, as stored."""
    tok = tiny_tokenizer()
    backend = SteppedScript(tok, SAID)
    server = build_server(sqlite_store, ServeConfig(model="s", batch_window_ms=0), backend=backend)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=20)
        stream = client.chat.completions.create(model="s", messages=QUESTION, stream=True, logprobs=True)
        chunks, steps_at_first = [], None
        for chunk in stream:
            chunks.append(chunk)
            if steps_at_first is None and chunk.choices and chunk.choices[0].logprobs:
                steps_at_first = backend.steps
                backend.release.set()
    server.close("finished")
    said = tok(SAID, add_special_tokens=False)["input_ids"]
    assert steps_at_first == 1 and backend.steps == len(said) + 1
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.delta.content or "" for p in pieces) == SAID
    lps = [e.logprob for p in pieces if p.logprobs for e in p.logprobs.content]
    assert lps == pytest.approx([-k / 10 for k in range(len(said) + 1)])
    assert pieces[-1].finish_reason == "stop"
    with sqlite_store.session() as s:
        [call] = repo.stream_invocations(s, run_ids=[server.run_id])
    assert call.id == chunks[0].id and call.output_ids.tolist() == [*said, tok.eos_token_id]


@pytest.mark.parametrize(("stop", "sent"), [("Lyon", "Bob lives in Oslo. Alice lives in "), ("Oslo. A", "Bob lives in ")])
def test_a_stop_string_streams_the_text_before_it_and_ends_the_row(sqlite_store, stop, sent):
    """Text streams live up to the stop string (never any of it: the text that may begin it is held back), and
    the backend stops sampling that row at the token that completed it."""
    tok = tiny_tokenizer()
    backend = SteppedScript(tok, SAID)
    backend.release.set()
    server = build_server(sqlite_store, ServeConfig(model="s", batch_window_ms=0), backend=backend)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=20)
        deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="s", messages=QUESTION, stream=True, stop=[stop], max_tokens=40) if c.choices]
    server.close("finished")
    assert "".join(deltas) == sent and not any(stop[:2] in d for d in deltas)
    with sqlite_store.session() as s:
        [call] = repo.stream_invocations(s, run_ids=[server.run_id])
    ids = tok(SAID, add_special_tokens=False)["input_ids"]
    keep = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k]))
    assert call.output_ids.tolist() == ids[:keep] and backend.steps == keep


def test_live_text_holds_back_only_what_may_begin_a_stop_or_a_call():
    tok = tiny_tokenizer()
    ids = tok(SAID, add_special_tokens=False)["input_ids"]

    def deltas(stops: tuple[str, ...], opener: str | None, text_ids: list[int]) -> list[str]:
        live = LiveText(tok, [1], stops, opener)
        return [live.add(Tokens(0, [t], [0.0]))[3] for t in text_ids]

    plain = deltas((), None, ids)
    assert "".join(plain) == SAID and all(plain)  # every token's text at once
    held = deltas(("Oslo!",), None, ids)  # " Oslo" may begin the stop until "." comes
    at = [tok.decode([i]) for i in ids].index(" Oslo")
    assert held[at] == " " and held[at + 1] == "Oslo." and "".join(held) == SAID
    call = tok("Let me look.\n<tool_call>\n{}", add_special_tokens=False)["input_ids"]
    opened = deltas((), "<tool_call>", call)
    assert "".join(opened) == "Let me look."  # the whitespace before the call, and the call, are not content


def test_tool_call_content_streams_then_the_call(sqlite_store):
    """With tools (a Hermes template), the content before a call streams live and the call follows whole."""
    from agentmem.testing.tiny_models import tool_tokenizer

    tok = tool_tokenizer()
    said = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call>'
    backend = SteppedScript(tok, said)
    server = build_server(sqlite_store, ServeConfig(model="s", batch_window_ms=0), backend=backend)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=20)
        chunks = []
        for chunk in client.chat.completions.create(model="s", messages=QUESTION, tools=WEATHER, stream=True,
                                                    max_tokens=200):
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].delta.content:
                backend.release.set()  # content arrived while the backend is held at its first step
        backend.release.set()
    server.close("finished")
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.delta.content or "" for p in pieces) == "Let me look."
    calls = [t for p in pieces for t in p.delta.tool_calls or []]
    assert [t.function.name for t in calls if t.function.name] == ["weather"] and pieces[-1].finish_reason == "tool_calls"


def test_the_tiny_model_streams_before_it_finishes(sqlite_store, tmp_path):
    """The real transformers backend: the first token's chunk arrives while later tokens are still being
    sampled (its step hook is held until then)."""
    from agentmem import model_refs
    from agentmem.runtime import CPU

    path = save_tiny(tmp_path / "tiny")
    inner = model_refs.backend("transformers", path, "float32", CPU)
    release, seen = threading.Event(), []
    generate = inner.generate

    def held(prompts, params, *, top_logprobs=0, on_step=None):
        def hook(steps):
            seen.append(time.monotonic())
            ended = on_step(steps) if on_step is not None else None
            if len(seen) == 1:
                release.wait(30)
            return ended
        return generate(prompts, params, top_logprobs=top_logprobs, on_step=hook)

    inner.generate = held
    server = build_server(sqlite_store, ServeConfig(model=path, batch_window_ms=0), backend=inner)
    eos = tiny_tokenizer().eos_token_id
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=20)
        at_first = None
        for chunk in client.chat.completions.create(model=path, messages=QUESTION, stream=True, max_tokens=6,
                                                    logprobs=True, logit_bias={str(eos): -100}):
            if at_first is None and chunk.choices and chunk.choices[0].logprobs:
                at_first = len(seen)
                release.set()
    server.close("finished")
    assert at_first == 1 and len(seen) == 6


def test_a_continuous_batch_streams_before_it_finishes(sqlite_store, tmp_path, monkeypatch):
    """Plain sampling on the continuous path (``backends.decode_batch``): the first token's chunk arrives while the
    batch still holds its second step."""
    from agentmem import model_refs
    from agentmem.backends.decode_batch import DecodeBatch
    from agentmem.runtime import CPU

    path = save_tiny(tmp_path / "tiny")
    inner = model_refs.backend("transformers", path, "float32", CPU)
    release, seen = threading.Event(), []
    step = DecodeBatch.step

    def held(self, *args, **kwargs):
        seen.append(time.monotonic())
        if len(seen) == 2:
            release.wait(30)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(DecodeBatch, "step", held)
    server = build_server(sqlite_store, ServeConfig(model=path, batch_window_ms=0), backend=inner)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=20)
        at_first, pieces = None, []
        for chunk in client.chat.completions.create(model=path, messages=QUESTION, stream=True, max_tokens=6,
                                                    logprobs=True, temperature=0):
            if at_first is None and chunk.choices and chunk.choices[0].logprobs:
                at_first = len(seen)
                release.set()
            pieces += [e.logprob for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    server.close("finished")
    # the first token left before the held second step ended (whole answers would come after all 6 steps)
    assert at_first in (1, 2) and len(seen) == len(pieces) >= 3
