"""Every option of an OpenAI request to `agentmem serve` is applied and recorded, or refused with a 400 that names
it; the shaping options (logit_bias, penalties, top_k, min_p) change the distribution sampled from, and the stored
log-probs are that distribution's."""

from __future__ import annotations

import json
import typing

import httpx
import numpy as np
import pytest
import torch
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from serve_helpers import running

from agentmem.backends.types import SamplingParams
from agentmem.config import ServeConfig
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.repository import serve as serve_repo

QUESTION = [{"role": "user", "content": "Where does Bob live?"}]
WEATHER = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]

# chat fields applied, and what serve_calls.sampling then holds for them (None: the value as sent)
APPLIED_CHAT: dict[str, tuple[object, object]] = {
    "frequency_penalty": (0.5, None), "presence_penalty": (0.5, None), "logit_bias": ({"5": 2.0}, None),
    "logprobs": (True, None), "top_logprobs": (2, None), "max_tokens": (3, None),
    "max_completion_tokens": (3, ("max_tokens", 3)), "n": (2, None), "seed": (7, None), "stop": ("\n", ["\n"]),
    "stream": (True, None), "stream_options": ({"include_usage": True}, None), "temperature": (0.5, None),
    "top_p": (0.9, None), "tool_choice": ("required", None), "parallel_tool_calls": (True, None), "user": ("u1", None),
    "metadata": ({"note": "x"}, None), "store": (True, None), "service_tier": ("auto", None),
    "modalities": (["text"], None), "response_format": ({"type": "json_object"}, None), "top_k": (5, None),
    "min_p": (0.1, None), "repetition_penalty": (1.2, None), "safety_identifier": ("s1", None),
    "prompt_cache_key": ("k", None), "prompt_cache_retention": ("in_memory", None), "tools": (WEATHER, ()),
}
REFUSED_CHAT: dict[str, object] = {
    "response_format": {"type": "yaml"}, "audio": {"voice": "alloy", "format": "wav"},
    "prediction": {"type": "content", "content": "Oslo"}, "reasoning_effort": "low", "web_search_options": {},
    "functions": [{"name": "f", "parameters": {}}], "function_call": "auto", "verbosity": "low",
    "moderation": {"model": "m"}, "prompt_cache_options": {"ttl": 5}, "parallel_tool_calls": False,
    "store": False, "modalities": ["text", "audio"], "no_such_option": 1,
    "tool_choice": {"type": "function", "function": {"name": "not_a_tool"}},
}
APPLIED_COMPLETIONS: dict[str, object] = {"best_of": 1, "echo": False, "logprobs": 2, "user": "u", "suffix": ""}
REFUSED_COMPLETIONS: dict[str, object] = {"best_of": 2, "echo": True, "suffix": " end"}


def test_every_openai_field_has_a_decision():
    """The fields the installed `openai` client can send: each is applied or refused here (a new field fails this
    test until it is decided)."""
    chat = set(typing.get_type_hints(chat_create_params.CompletionCreateParamsBase)) | {"stream"}
    assert chat - {"model", "messages"} <= set(APPLIED_CHAT) | set(REFUSED_CHAT)
    legacy = set(typing.get_type_hints(completion_create_params.CompletionCreateParamsBase)) | {"stream"}
    decided = set(APPLIED_CHAT) | set(APPLIED_COMPLETIONS) | set(REFUSED_COMPLETIONS)
    assert legacy - {"model", "prompt"} <= decided


@pytest.fixture
def server(sqlite_store, tmp_path):
    srv = build_server(sqlite_store, ServeConfig(model=save_tiny(tmp_path / "tiny"), dtype="float32",
                                                 batch_window_ms=0, chat_template="chatml_tools"))
    yield srv
    srv.close("finished")


def _sampling(store, invocation_id: str) -> dict:
    with store.session() as s:
        return serve_repo.get_serve_call(s, invocation_id).sampling


def test_each_option_is_applied_and_recorded_or_refused_by_name(server, sqlite_store):
    model = server.app.state.calls.settings.model_name
    base = {"model": model, "messages": QUESTION, "max_tokens": 2}
    with running(server.app) as root:
        for name, (value, recorded) in APPLIED_CHAT.items():
            body = {**base, name: value}
            if name == "top_logprobs":
                body["logprobs"] = True
            if name == "stream_options":
                body["stream"] = True
            if name in ("tool_choice", "parallel_tool_calls"):
                body["tools"] = WEATHER
            answer = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 200, (name, answer.text)
            sampling = _sampling(sqlite_store, answer.headers["x-agentmem-invocation"].split(",")[0])
            if recorded == ():  # tools: stored in their own column
                with sqlite_store.session() as s:
                    assert serve_repo.get_serve_call(s, answer.headers["x-agentmem-invocation"]).tools == WEATHER
                continue
            key, want = recorded if isinstance(recorded, tuple) else (name, value if recorded is None else recorded)
            assert sampling[key] == want, (name, sampling)
        for name, value in REFUSED_CHAT.items():
            body = {**base, name: value}
            if name in ("tool_choice", "parallel_tool_calls"):  # parallel_tool_calls: false with tool_choice auto
                body["tools"] = WEATHER
            answer = httpx.post(f"{root}/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 400, (name, answer.text)
            assert answer.json()["error"]["param"] == name
        prompt = {"model": model, "prompt": "Bob lives in", "max_tokens": 2}
        for name, value in APPLIED_COMPLETIONS.items():
            answer = httpx.post(f"{root}/v1/completions", json={**prompt, name: value}, timeout=60)
            assert answer.status_code == 200, (name, answer.text)
            assert _sampling(sqlite_store, answer.headers["x-agentmem-invocation"])[name] == value
        for name, value in REFUSED_COMPLETIONS.items():
            answer = httpx.post(f"{root}/v1/completions", json={**prompt, name: value}, timeout=60)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == name, (name, answer.text)
        # a logit_bias naming no token of the vocabulary, and a value out of range
        for bias in ({"99999999": 1.0}, {"5": 101}):
            answer = httpx.post(f"{root}/v1/chat/completions", json={**base, "logit_bias": bias}, timeout=60)
            assert answer.status_code == 400 and answer.json()["error"]["param"].startswith("logit_bias")
    with sqlite_store.session() as s:  # a refused call stores nothing: one call per applied request (n=2: two)
        stored = repo.count_invocations(s, [server.run_id])
    assert stored == len(APPLIED_CHAT) + 1 + len(APPLIED_COMPLETIONS)


def _shaped_logprobs(model, prompt: list[int], output: list[int], params: SamplingParams) -> np.ndarray:
    """The log-prob of each output token under the shaped distribution, from one forward pass and
    transformers' processors applied position by position (the reference the backend must equal)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TopKLogitsWarper,
    )

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + output])).logits[0].float()
    out = []
    for k, token in enumerate(output):
        row = logits[len(prompt) + k - 1][None].clone()
        for tid, bias in params.logit_bias:
            row[0, tid] += bias
        seen = torch.tensor([prompt + output[:k]])
        row = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(seen, row)
        counts = torch.bincount(torch.tensor(output[:k], dtype=torch.long), minlength=row.shape[-1]).float()
        row = row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).float()
        row = row / (params.temperature or 1.0)
        if params.top_k:
            row = TopKLogitsWarper(params.top_k)(None, row)
        if params.min_p:
            row = MinPLogitsWarper(params.min_p)(None, row)
        out.append(torch.log_softmax(row, -1)[0, token].item())
    return np.asarray(out)


def test_shaped_sampling_stores_the_log_probs_of_the_distribution_sampled_from(tmp_path):
    from transformers import AutoModelForCausalLM

    from agentmem.backends.transformers_backend import TransformersBackend

    path = save_tiny(tmp_path / "tiny")
    backend = TransformersBackend(path, dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = tiny_tokenizer()
    prompts = [tok("Bob lives in Oslo. Where does Bob live?")["input_ids"], tok("Alice")["input_ids"]]
    shaped = SamplingParams(temperature=0.8, max_new_tokens=8, seed=3, top_k=4, min_p=0.05, repetition_penalty=1.5,
                            presence_penalty=0.4, frequency_penalty=0.3, logit_bias=((7, 2.5), (11, -1.0)))
    gens = backend.generate(prompts, shaped, top_logprobs=4)
    for prompt, gen in zip(prompts, gens, strict=True):
        np.testing.assert_allclose(gen.logprobs, _shaped_logprobs(model, prompt, gen.output_ids, shaped), atol=1e-4)
        for token, lp, top in zip(gen.output_ids, gen.logprobs, gen.top, strict=True):
            assert len(top) <= 4 and dict(top)[token] == lp  # top-k 4: the sampled token is listed, same value
    plain = backend.generate(prompts, SamplingParams(temperature=0.8, max_new_tokens=8, seed=3))
    assert [g.output_ids for g in plain] != [g.output_ids for g in gens]
    # top_k 1 samples the greedy ids, each with log-prob 0; a +100 bias forces its token
    greedy = backend.generate(prompts, SamplingParams(temperature=0, max_new_tokens=5))
    one = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=5, seed=1, top_k=1))
    assert [g.output_ids for g in one] == [g.output_ids for g in greedy]
    assert all(lp == 0.0 for g in one for lp in g.logprobs)
    forced = backend.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=3, seed=1,
                                                      logit_bias=((42, 100.0),)))
    assert [g.output_ids for g in forced] == [[42, 42, 42]] * 2
    # rows that stop early (eos pushed up) leave the batch with their penalty state, the others go on exact
    four = [*prompts, tok("Where does Carol live? In")["input_ids"], tok("x y z")["input_ids"]]
    early = SamplingParams(temperature=1.0, max_new_tokens=10, seed=2, repetition_penalty=1.3, frequency_penalty=0.5,
                           logit_bias=((tok.eos_token_id, 4.0),))
    gens = backend.generate(four, early)
    assert len({len(g.output_ids) for g in gens}) > 1 and max(len(g.output_ids) for g in gens) == 10
    for prompt, gen in zip(four, gens, strict=True):
        np.testing.assert_allclose(gen.logprobs, _shaped_logprobs(model, prompt, gen.output_ids, early), atol=1e-4)
    # greedy with a repetition penalty: the argmax of the penalised logits, stored at T = 1
    penalised = SamplingParams(temperature=0, max_new_tokens=6, repetition_penalty=2.0)
    [gen] = backend.generate(prompts[:1], penalised)
    np.testing.assert_allclose(gen.logprobs, _shaped_logprobs(model, prompts[0], gen.output_ids, penalised), atol=1e-4)


def test_options_reach_vllm_and_a_backend_without_them_refuses(sqlite_store):
    """The vLLM engine gets the shaping options under vLLM's names; a backend that cannot apply them (the scripted
    one) refuses them by name."""
    from agentmem.backends.scripted import ScriptedBackend

    server = build_server(sqlite_store, ServeConfig(model="s"),
                          backend=ScriptedBackend(tiny_tokenizer(), lambda _: "Oslo."))
    with running(server.app) as root:
        for name, value in (("top_k", 3), ("presence_penalty", 0.5), ("logit_bias", {"5": 1.0})):
            answer = httpx.post(f"{root}/v1/chat/completions", json={"model": "s", "messages": QUESTION, name: value})
            assert answer.status_code == 400 and answer.json()["error"]["param"] == name, answer.text
        assert httpx.post(f"{root}/v1/chat/completions", json={"model": "s", "messages": QUESTION}).status_code == 200
    server.close("finished")

    params = SamplingParams(top_k=3, min_p=0.1, repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3,
                            logit_bias=((5, 1.5),))
    assert params.shaping == {"top_k": 3, "min_p": 0.1, "repetition_penalty": 1.1, "presence_penalty": 0.2,
                              "frequency_penalty": 0.3, "logit_bias": {5: 1.5}}
    assert SamplingParams().shaping == {}
    assert json.dumps(params.shaping["logit_bias"]) == '{"5": 1.5}'
