"""Structured output and forced tool calls through `agentmem serve` (constrained decoding with llguidance): a random
model under a JSON grammar answers valid JSON, the stored log-probs are the masked distribution's, the stored row
names the constraint, and LangChain's `with_structured_output` (json_schema, function_calling, json_mode),
`bind_tools(tool_choice="required")` and LangGraph's ReAct agent work against it, each test's calls in one episode."""

from __future__ import annotations

import json
import sys
import types
from typing import Literal

import llguidance
import openai
import pytest
import torch
from serve_helpers import running

from agentmem.backends.shaping import Grammars
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.backends.types import SamplingParams
from agentmem.backends.vllm_backend import guidance_backend, structured
from agentmem.config import ServeConfig
from agentmem.serve.constraints import json_grammar
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer
from store import repository as repo
from store.repository import serve as serve_repo

ASK = [{"role": "user", "content": "Is it sunny in Oslo? Answer in JSON."}]
# every path of this schema ends within a few tokens, so a random model completes it
VERDICT = {"type": "object", "properties": {"sunny": {"type": "boolean"}, "score": {"type": "integer", "minimum": 0,
                                                                                     "maximum": 9},
                                            "city": {"enum": ["Oslo", "Lyon"]}},
           "required": ["sunny", "score", "city"], "additionalProperties": False}
WEATHER = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo"]}},
                                                         "required": ["city"], "additionalProperties": False}}},
           {"type": "function", "function": {"name": "clock", "parameters": {
               "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
               "additionalProperties": False}}}]


@pytest.fixture
def served(store):
    """A tiny random Llama served with the default model's ChatML template (`chatml_tools`)."""
    backend = TransformersBackend.from_model(tiny_llama(), tiny_tokenizer())
    server = build_server(store, ServeConfig(model="s", batch_window_ms=0, chat_template="chatml_tools"),
                          backend=backend)
    with running(server.app) as root:
        yield server, backend, root
    server.close("finished")


def _calls(store, server, episode: str):
    with store.session() as s:
        calls = repo.episode_invocations(s, episode_row_id(server.run_id, episode))
        return calls, [serve_repo.get_serve_call(s, c.id) for c in calls]


def _masked_logprobs(backend: TransformersBackend, grammar: str | None, prompt: list[int], output: list[int],
                     temperature: float) -> list[float]:
    """Each output token's log-prob recomputed by one forward pass: log_softmax of the logits with the tokens the
    grammar forbids at that position removed, divided by T (no mask when ``grammar`` is None)."""
    prompt, output = [int(t) for t in prompt], [int(t) for t in output]
    with torch.no_grad():
        logits = backend.model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1].float()
    if grammar is not None:
        matcher = Grammars(backend.tokenizer, logits.shape[-1], backend.stop_ids).matcher(grammar)
        import llguidance.numpy as lln
        import numpy as np

        for k, token in enumerate(output):
            bits = lln.allocate_token_bitmask(1, logits.shape[-1])
            lln.fill_next_token_bitmask(matcher, bits, 0)
            keep = np.unpackbits(bits.view(np.uint8), bitorder="little")[: logits.shape[-1]].astype(bool)
            logits[k, ~torch.from_numpy(keep)] = float("-inf")
            assert matcher.consume_token(token)
    lp = torch.log_softmax(logits / (temperature or 1.0), -1)
    return lp.gather(-1, torch.tensor(output)[:, None]).squeeze(-1).tolist()


def test_json_schema_reply_is_valid_and_stores_the_masked_log_probs(served, store):
    server, backend, root = served
    client = openai.OpenAI(base_url=f"{root}/episodes/js/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
    replies = [client.chat.completions.create(model="s", messages=ASK, response_format=fmt, seed=seed,
                                              max_tokens=80) for seed in range(3)]
    for reply in replies:
        answer = json.loads(reply.choices[0].message.content)
        assert list(answer) == ["sunny", "score", "city"]  # the schema's order, and nothing else
        assert isinstance(answer["sunny"], bool) and 0 <= answer["score"] <= 9 and answer["city"] in ("Oslo", "Lyon")
        assert reply.choices[0].finish_reason == "stop"
    calls, sent = _calls(store, server, "js")
    assert len(calls) == 3
    grammar = sent[0].sampling["constraint"]["grammar"]
    assert sent[0].sampling["constraint"] == {"kind": "json_schema", "schema": VERDICT, "grammar": json_grammar(VERDICT),
                                              "library": f"llguidance {llguidance.__version__}"}
    assert sent[0].sampling["response_format"] == fmt
    for call in calls:
        masked = _masked_logprobs(backend, grammar, call.prompt_ids, call.output_ids, 1.0)
        assert call.output_logprobs == pytest.approx(masked, abs=1e-4)
        free = _masked_logprobs(backend, None, call.prompt_ids, call.output_ids, 1.0)
        assert all(f <= m + 1e-5 for f, m in zip(free, masked, strict=True))  # the mask renormalises upwards
        assert sum(m - f for f, m in zip(free, masked, strict=True)) > 1.0  # and the difference is not round-off
        assert call.output_logprobs[0] == 0.0  # "{" is the only token allowed first: probability 1


def test_json_object_streams_and_a_cut_reply_says_length(served, store):
    server, _, root = served
    client = openai.OpenAI(base_url=f"{root}/episodes/jo/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_object"}
    chunks = list(client.chat.completions.create(model="s", messages=ASK, response_format=fmt, temperature=0,
                                                 max_tokens=60, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    cut = client.chat.completions.create(model="s", messages=ASK, response_format=fmt, temperature=0, max_tokens=2)
    calls, sent = _calls(store, server, "jo")
    assert reasons == [calls[0].finish_reason.value]
    if reasons == ["stop"]:
        assert isinstance(json.loads(text), dict)
    assert text == calls[0].output_text.removesuffix("<|im_end|>")
    assert cut.choices[0].finish_reason == "length" and calls[1].finish_reason.value == "length"
    assert len(calls[1].output_ids) == 2 and cut.choices[0].message.content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)  # cut by max_tokens: said so, not passed off as whole
    assert [s.sampling["constraint"]["kind"] for s in sent] == ["json_object", "json_object"]


def test_forced_tool_calls_parse_as_tool_calls(served, store):
    server, _, root = served
    client = openai.OpenAI(base_url=f"{root}/episodes/tc/v1", api_key="unused", max_retries=0)
    named = client.chat.completions.create(model="s", messages=ASK, tools=WEATHER, max_tokens=150, seed=1,
                                           tool_choice={"type": "function", "function": {"name": "clock"}},
                                           parallel_tool_calls=False)
    required = client.chat.completions.create(model="s", messages=ASK, tools=WEATHER, max_tokens=300, seed=2,
                                              tool_choice="required")
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "clock" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
    assert named.choices[0].finish_reason == "tool_calls" and named.choices[0].message.content is None
    assert required.choices[0].finish_reason == "tool_calls"
    for c in required.choices[0].message.tool_calls:
        assert c.function.name in ("weather", "clock") and isinstance(json.loads(c.function.arguments), dict)
    streamed = list(client.chat.completions.create(model="s", messages=ASK, tools=WEATHER, max_tokens=150, seed=1,
                                                   tool_choice={"type": "function", "function": {"name": "clock"}},
                                                   stream=True))
    heads = [t for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or [] if t.function.name]
    assert [t.function.name for t in heads] == ["clock"]
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    _, sent = _calls(store, server, "tc")
    assert {k: v for k, v in sent[0].sampling["constraint"].items() if k not in ("grammar", "library")} == {
        "kind": "tool_call", "tools": ["clock"], "calls": "one"}
    assert sent[1].sampling["constraint"]["tools"] == ["weather", "clock"]
    assert sent[1].sampling["constraint"]["calls"] == "one_or_more"


def test_responses_text_format_json_schema(served, store):
    server, _, root = served
    client = openai.OpenAI(base_url=f"{root}/episodes/rs/v1", api_key="unused", max_retries=0)
    reply = client.responses.create(model="s", input=ASK[0]["content"], max_output_tokens=80,
                                    text={"format": {"type": "json_schema", "name": "verdict", "schema": VERDICT}})
    assert reply.status == "completed" and list(json.loads(reply.output_text)) == ["sunny", "score", "city"]
    _, sent = _calls(store, server, "rs")
    assert sent[0].sampling["constraint"]["schema"] == VERDICT


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "response_format"),
    ({"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": WEATHER, "parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"tools": WEATHER, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_constraints_that_cannot_be_enforced_are_refused(served, store, body, param):
    server, _, root = served
    client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="s", messages=ASK, max_tokens=4, **body)
    assert err.value.body["param"] == param
    with store.session() as s:
        assert repo.count_invocations(s, [server.run_id]) == 0


def test_vllm_gets_the_grammar_as_a_guidance_request(monkeypatch):
    """vLLM is not installed here: its parameter building, on stand-in modules of both APIs."""
    params = SamplingParams(grammar=json_grammar({"type": "object"}))
    new = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=lambda **kw: ("so", kw)))
    old = types.SimpleNamespace(sampling_params=types.SimpleNamespace(GuidedDecodingParams=lambda **kw: ("gd", kw)))
    assert structured(new, params) == {"structured_outputs": ("so", {"grammar": params.grammar})}
    assert structured(old, params) == {"guided_decoding": ("gd", {"grammar": params.grammar})}
    assert structured(new, SamplingParams()) == {}
    config = types.ModuleType("vllm.config")
    config.StructuredOutputsConfig = lambda **kw: ("config", kw)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.config", config)
    assert guidance_backend() == {"structured_outputs_config": ("config", {"backend": "guidance"})}
    monkeypatch.setitem(sys.modules, "vllm.config", types.ModuleType("vllm.config"))
    assert guidance_backend() == {"guided_decoding_backend": "guidance"}


def _chat(root: str, episode: str, **extra):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=f"{root}/episodes/{episode}/v1", api_key="unused", model="s", max_tokens=200,
                      temperature=0, max_retries=0, **extra)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_with_structured_output(served, store, method):
    from pydantic import BaseModel, Field

    class Verdict(BaseModel):
        sunny: bool
        score: int = Field(ge=0, le=9)

    server, _, root = served
    schema = None if method == "json_mode" else Verdict
    # strict: the schema allows no other keys (a random model would wander into them); json_mode allows any object,
    # whose keys a random model would write on and on: a bias on "}" closes it
    close = {tiny_tokenizer().convert_tokens_to_ids("}"): 20} if method == "json_mode" else None
    model = _chat(root, f"lc-{method}", logit_bias=close).with_structured_output(
        schema, method=method, strict=None if method == "json_mode" else True)
    answers = [model.invoke("Is it sunny in Oslo? Answer in JSON.") for _ in range(2)]
    calls, sent = _calls(store, server, f"lc-{method}")
    assert len(calls) == 2  # both calls in the test's episode
    for answer in answers:
        if method == "json_mode":
            assert isinstance(answer, dict)
        else:
            assert isinstance(answer, Verdict) and 0 <= answer.score <= 9
    kind = {"json_schema": "json_schema", "function_calling": "tool_call", "json_mode": "json_object"}[method]
    assert sent[0].sampling["constraint"]["kind"] == kind


def test_langchain_bind_tools_required(served, store):
    from langchain_core.tools import tool

    @tool
    def clock(zone: Literal["UTC", "CET"]) -> str:
        """The time in a zone."""
        return "12:00"

    server, _, root = served
    reply = _chat(root, "lc-tools").bind_tools([clock], tool_choice="required", strict=True).invoke("What time?")
    assert reply.tool_calls and {c["name"] for c in reply.tool_calls} == {"clock"}
    assert all(c["args"]["zone"] in ("UTC", "CET") for c in reply.tool_calls)
    calls, sent = _calls(store, server, "lc-tools")
    assert len(calls) == 1 and sent[0].sampling["tool_choice"] == "required"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # create_react_agent: langchain.agents.create_agent in 2.0
def test_langgraph_react_agent(served, store):
    """The ReAct agent's model is made to call its tool (tool_choice required), the tool answers directly: the
    model's call, forced, lands in the test's episode and the tool ran on its parsed arguments."""
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    seen = []

    @tool(return_direct=True)
    def clock(zone: Literal["UTC", "CET"]) -> str:
        """The time in a zone."""
        seen.append(zone)
        return f"12:00 {zone}"

    server, _, root = served
    model = _chat(root, "lg").bind_tools([clock], tool_choice="required", strict=True, parallel_tool_calls=False)
    agent = create_react_agent(model, [clock])
    out = agent.invoke({"messages": [("user", "What time is it?")]})
    assert seen and out["messages"][-1].content == f"12:00 {seen[0]}"
    calls, sent = _calls(store, server, "lg")
    assert len(calls) == 1 and sent[0].sampling["constraint"]["kind"] == "tool_call"


def test_distill_leaves_constrained_calls_out(served, store):
    """A constrained call's log-probs are of the masked distribution: the selection distill trains on leaves it out
    (sft's keeps it), and a run of constrained calls only has nothing to distil."""
    from agentmem.errors import TrainingError
    from agentmem.training.selection import select

    server, _, root = served
    client = openai.OpenAI(base_url=f"{root}/episodes/d/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT}}
    client.chat.completions.create(model="s", messages=ASK, response_format=fmt, max_tokens=4)
    with pytest.raises(TrainingError, match="1 calls sampled under a grammar left out"):
        select(store, [server.run_id], constrained=False)
    plain = client.chat.completions.create(model="s", messages=ASK, max_tokens=4)
    assert len(select(store, [server.run_id]).invocations) == 2
    assert select(store, [server.run_id], constrained=False).ids == [plain.id]


def test_a_forced_reply_cut_in_its_second_call_keeps_the_first(store):
    """With `tool_choice: required`, a reply that `max_tokens` cut in its second call came back with no tool calls
    at all, although its first call was complete: the calls completed before the cut come back as `tool_calls`
    (chat, streamed or not) and `function_call` items (Responses), with `finish_reason: length` (`incomplete`)."""
    from agentmem.backends.scripted import ScriptedBackend

    class Forced(ScriptedBackend):
        constrains = True  # declares the grammar applied: the script writes what it would allow

    tok = tiny_tokenizer()
    first = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    script = first + '\n<tool_call>\n{"name": "clock", "arguments": {"zone": "UTC"}}\n</tool_call>'
    cut_at = len(tok.encode(first + '\n<tool_call>\n{"name": "cl', add_special_tokens=False))
    server = build_server(store, ServeConfig(model="s", batch_window_ms=0, chat_template="chatml_tools"),
                          backend=Forced(tok, lambda _prompt: script))
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/cut/v1", api_key="unused", max_retries=0)
        asked = dict(model="s", messages=ASK, tools=WEATHER, tool_choice="required")
        cut = client.chat.completions.create(max_tokens=cut_at, **asked)
        chunks = list(client.chat.completions.create(max_tokens=cut_at, stream=True, **asked))
        whole = client.chat.completions.create(max_tokens=200, **asked)
        answer = client.responses.create(model="s", input="Weather in Oslo?", max_output_tokens=cut_at,
                                         tools=[{"type": "function", "name": "weather", "parameters": {"type": "object"}},
                                                {"type": "function", "name": "clock", "parameters": {"type": "object"}}],
                                         tool_choice="required")
    server.close("finished")
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in cut.choices[0].message.tool_calls] == [
        ("weather", {"city": "Oslo"})]
    streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in streamed if d.function.name] == ["weather"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["weather", "clock"]
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert [(o.type, o.name) for o in answer.output] == [("function_call", "weather")]
    with store.session() as s:  # the stored reply is what was sampled, the cut call included
        calls = repo.episode_invocations(s, episode_row_id(server.run_id, "cut"))
    assert [c.finish_reason.value for c in calls] == ["length", "length", "stop", "length"]  # the last: Responses
    assert calls[0].output_text == tok.decode(tok.encode(script, add_special_tokens=False)[:cut_at])
