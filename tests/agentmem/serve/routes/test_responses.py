"""`POST /v1/responses` through the real `openai` client (`client.responses.create`, `stream=True` and
`client.responses.stream`): each call is one stored chat invocation with the exact ids and log-probs, function
tools and `function_call_output` inputs make a tool-calling loop, and `previous_response_id` is resolved from the
store."""

from __future__ import annotations

import asyncio
import json
import typing

import httpx
import openai
import pytest
from openai.types.responses import response_create_params
from serve_helpers import running

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import ServeConfig
from agentmem.config.serve_config import load_template as load
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo
from store.repository import serve as serve_repo

TOOLS = [{"type": "function", "name": "weather", "description": "The weather in a city", "strict": False,
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TEMPLATE = load("chatml_tools")


def render(messages, tools=None) -> str:
    return tiny_tokenizer().apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                                chat_template=TEMPLATE)


def test_a_response_is_one_exact_invocation_streamed_or_not(sqlite_store, tmp_path):
    """The tiny model, greedy: the response's text and log-probs are the stored call's; streamed, the deltas
    concatenate to the same text and the completed response equals the non-streamed one; previous_response_id
    puts the earlier call's messages and reply before the input, in its episode."""
    path = save_tiny(tmp_path / "tiny")
    server = build_server(sqlite_store, ServeConfig(model=path, batch_window_ms=0, chat_template="chatml_tools"))
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/r/v1", api_key="unused", max_retries=0, timeout=60)
        first = client.responses.create(model=path, input="Where does Bob live?", instructions="Be brief.",
                                        max_output_tokens=6, temperature=0,
                                        include=["message.output_text.logprobs"], top_logprobs=2)
        events = list(client.responses.create(model=path, input="Where does Bob live?", instructions="Be brief.",
                                              max_output_tokens=6, temperature=0, stream=True,
                                              include=["message.output_text.logprobs"]))
        follow = client.responses.create(model=path, input="And Alice?", previous_response_id=first.id,
                                         max_output_tokens=4, temperature=0)
        with pytest.raises(openai.NotFoundError) as missing:
            client.responses.create(model=path, input="x", previous_response_id="nope")
    server.close("finished")

    with sqlite_store.session() as s:
        calls = {c.id: c for c in repo.episode_invocations(s, episode_row_id(server.run_id, "r"))}
        sent = serve_repo.get_serve_call(s, follow.id)
    stored = calls[first.id]
    assert first.status == "incomplete" and first.incomplete_details.reason == "max_output_tokens"
    [message] = first.output
    assert message.type == "message" and message.id == f"msg_{first.id}"
    assert first.output_text == stored.output_text and len(stored.output_ids) == 6
    assert [lp.logprob for lp in message.content[0].logprobs] == stored.output_logprobs.tolist()
    assert all(len(lp.top_logprobs) == 2 for lp in message.content[0].logprobs)
    assert stored.prompt_text == render([{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Where does Bob live?"}])
    assert first.usage.input_tokens == len(stored.prompt_ids) and first.usage.output_tokens == 6

    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == first.output_text
    assert [lp.logprob for e in deltas for lp in e.logprobs] == stored.output_logprobs.tolist()
    last = events[-1].response
    assert calls[last.id].output_ids.tolist() == stored.output_ids.tolist() and last.output_text == first.output_text

    # the follow-up: the first call's messages but its instructions, its reply, then the new input
    assert sent.messages == [{"role": "user", "content": "Where does Bob live?"},
                             {"role": "assistant", "content": first.output_text},
                             {"role": "user", "content": "And Alice?"}]
    assert calls[follow.id].prompt_text == render(sent.messages)
    assert calls[follow.id].parent_invocation_id == first.id and follow.previous_response_id == first.id
    assert [c.step for c in calls.values()] == [0, 1, 2]
    assert missing.value.body["param"] == "previous_response_id"


def test_function_tools_and_call_outputs_make_a_tool_loop(sqlite_store):
    """A function tool: the reply's call comes back as a function_call item (streamed as arguments events too);
    its function_call_output goes back as a tool turn, and the final answer is text; one episode."""
    tok = tiny_tokenizer()
    backend = ScriptedBackend(tok, lambda p: "It is sunny." if "<tool_response>" in tok.decode(p) else CALL)
    server = build_server(sqlite_store, ServeConfig(model="s", chat_template="chatml_tools"), backend=backend)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/loop/v1", api_key="unused", max_retries=0, timeout=60)
        items: list = [{"role": "user", "content": "Weather in Oslo?"}]
        asked = client.responses.create(model="s", input=items, tools=TOOLS)
        [call] = asked.output
        items += [call.model_dump(exclude_none=True),
                  {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
        with client.responses.stream(model="s", input=items, tools=TOOLS) as stream:
            answer = stream.get_final_response()
        events = list(client.responses.create(model="s", input=items[:1], tools=TOOLS, stream=True))
        with pytest.raises(openai.BadRequestError) as other:
            client.responses.create(model="s", input="hi", tools=[{"type": "web_search"}])
    server.close("finished")

    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "weather", {"city": "Oslo"})
    assert call.call_id == f"call_{asked.id}_0_0" and asked.status == "completed"
    assert answer.output_text == "It is sunny." and [o.type for o in answer.output] == ["message"]
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert json.loads(events[4].arguments) == {"city": "Oslo"}
    assert other.value.body["param"] == "tools.0"
    with sqlite_store.session() as s:
        calls = repo.episode_invocations(s, episode_row_id(server.run_id, "loop"))
        sent = serve_repo.get_serve_call(s, answer.id)
    assert [c.id for c in calls] == [asked.id, answer.id, events[-1].response.id]
    assert sent.messages[1]["tool_calls"][0]["function"] == {"name": "weather", "arguments": {"city": "Oslo"}}
    assert sent.messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert calls[1].prompt_text.endswith("<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
                                         "<|im_start|>assistant\n")
    assert sent.tools == [{"type": "function", "function": {k: TOOLS[0][k] for k in ("name", "description",
                                                                                     "parameters")}}]


# Responses fields applied, and what serve_calls.sampling then holds for them (None: the value as sent; (): not
# in sampling: stored as the messages or tools they give)
APPLIED: dict[str, tuple[object, object]] = {
    "input": ("hi", ()), "instructions": ("Be brief.", None), "max_output_tokens": (3, ("max_tokens", 3)),
    "temperature": (0.5, None), "top_p": (0.9, None), "top_logprobs": (2, None), "stream": (True, None),
    "include": (["message.output_text.logprobs"], None), "stream_options": ({"include_obfuscation": False}, None),
    "metadata": ({"note": "x"}, None), "user": ("u1", None), "safety_identifier": ("s1", None),
    "service_tier": ("auto", None), "prompt_cache_key": ("k", None), "prompt_cache_retention": ("in_memory", None),
    "store": (True, None), "parallel_tool_calls": (False, None), "truncation": ("disabled", None),
    "text": ({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}, None), "reasoning": ({"effort": None}, None), "background": (False, None),
    "tool_choice": ("auto", None), "tools": (TOOLS, ()),
}
REFUSED: dict[str, object] = {
    "text": {"format": {"type": "yaml"}}, "reasoning": {"effort": "low"},
    "background": True, "max_tool_calls": 2, "conversation": "conv_1", "prompt": {"id": "p"},
    "context_management": [{"type": "compaction"}], "include": ["file_search_call.results"], "store": False,
    "truncation": "auto", "tool_choice": "required", "n": 2,
    "access_programs": {"cyber": "standard"}, "background_options": {}, "image": {"context_compression": "enabled"},
    "moderation": {"model": "m"}, "prompt_cache_options": {"ttl": "30m"}, "no_such_option": 1,
}


def test_every_responses_field_is_applied_and_recorded_or_refused_by_name(sqlite_store, tmp_path):
    """Each field the installed `openai` client can send to /v1/responses (a new one fails this test until it
    is decided): applied ones answer 200 and are recorded in serve_calls.sampling, refused ones get a 400 naming
    them, and a refused call stores nothing."""
    fields = set(typing.get_type_hints(response_create_params.ResponseCreateParamsBase)) | {"stream"}
    assert fields - {"model", "previous_response_id"} <= set(APPLIED) | set(REFUSED)
    path = save_tiny(tmp_path / "tiny")
    server = build_server(sqlite_store, ServeConfig(model=path, batch_window_ms=0, chat_template="chatml_tools"))
    base = {"model": path, "input": "hi", "max_output_tokens": 2}
    with running(server.app) as root:
        for name, (value, recorded) in APPLIED.items():
            answer = httpx.post(f"{root}/v1/responses", json={**base, name: value}, timeout=60)
            assert answer.status_code == 200, (name, answer.text)
            with sqlite_store.session() as s:
                call = serve_repo.get_serve_call(s, answer.headers["x-agentmem-invocation"])
            if recorded == ():
                assert name not in call.sampling
                continue
            key, want = recorded if isinstance(recorded, tuple) else (name, value)
            assert call.sampling[key] == want, (name, call.sampling)
        for name, value in REFUSED.items():
            answer = httpx.post(f"{root}/v1/responses", json={**base, name: value}, timeout=60)
            assert answer.status_code == 400 and answer.json()["error"]["param"] == name, (name, answer.text)
    server.close("finished")
    with sqlite_store.session() as s:
        assert repo.count_invocations(s, [server.run_id]) == len(APPLIED)


def test_responses_options_are_applied_or_refused_by_name(sqlite_store):
    tok = tiny_tokenizer()
    server = build_server(sqlite_store, ServeConfig(model="s", context_length=64),
                          backend=ScriptedBackend(tok, lambda _: "Oslo."))
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0, timeout=60)
        plain = client.responses.create(model="s", input="hi", text={"format": {"type": "text"}}, store=True,
                                        truncation="disabled", metadata={"task": "t1"})
        refused = {}
        for name, value in {"text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "high"},
                            "background": True, "store": False, "include": ["reasoning.encrypted_content"],
                            "tools": TOOLS}.items():
            with pytest.raises(openai.BadRequestError) as err:
                client.responses.create(model="s", input="hi", **{name: value})
            refused[name] = err.value.body["param"]
        for name, value in {"input": "Bob lives in Oslo. " * 40, "max_output_tokens": 100}.items():
            with pytest.raises(openai.BadRequestError) as err:
                client.responses.create(model="s", **{"input": "hi", name: value})
            assert (err.value.body["param"], err.value.body["code"]) == (name, "context_length_exceeded")
    server.close("finished")
    assert plain.output_text == "Oslo." and plain.status == "completed"
    assert refused == {name: name for name in refused}  # tools: the tiny template cannot render them
    with sqlite_store.session() as s:
        assert serve_repo.get_serve_call(s, plain.id).sampling == {
            "n": 1, "text": {"format": {"type": "text"}}, "store": True, "truncation": "disabled",
            "metadata": {"task": "t1"}}


def test_input_items_of_the_wrong_types_are_refused_by_name(sqlite_store):
    """Found by the serve fuzz: an input item whose role was a list or an object raised a TypeError (a 500); each
    item's type, role, call id, name and arguments are strings, or a 400 naming the item's field."""
    server = build_server(sqlite_store, ServeConfig(model="s"), backend=ScriptedBackend(tiny_tokenizer(), lambda _: "x"))
    cases = [({"role": [1, "a"], "content": "hi"}, "input.0.role"), ({"role": {"type": "x"}, "content": "hi"},
                                                                     "input.0.role"),
             ({"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}, "input.0.call_id"),
             ({"type": "function_call", "call_id": "c", "arguments": "{}"}, "input.0.name")]
    with running(server.app) as root:
        for item, param in cases:
            answer = httpx.post(f"{root}/v1/responses", json={"model": "s", "input": [item]})
            assert (answer.status_code, answer.json()["error"]["param"]) == (400, param), answer.text
    server.close("finished")


def test_the_openai_agents_sdk_runs_its_default_model_with_a_tool(sqlite_store):
    """The OpenAI Agents SDK's default model (Responses) with a function tool, run and streamed, and its chat
    completions model: the agent calls the tool, reads its result and answers; each run's calls land in one
    episode."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    tok = tiny_tokenizer()
    backend = ScriptedBackend(tok, lambda p: "It is sunny in Oslo." if "<tool_response>" in tok.decode(p) else CALL)
    server = build_server(sqlite_store, ServeConfig(model="s", chat_template="chatml_tools"), backend=backend)
    ran = []

    @agents.function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return "sunny"

    async def streamed(agent) -> str:
        result = agents.Runner.run_streamed(agent, "Weather in Oslo?")
        async for _ in result.stream_events():
            pass
        return result.final_output

    agents.set_tracing_disabled(True)
    with running(server.app) as root:
        outputs = []
        for name, run in (("run", agents.Runner.run_sync), ("stream", lambda a, q: asyncio.run(streamed(a))),
                          ("chat", agents.Runner.run_sync)):
            client = AsyncOpenAI(base_url=f"{root}/episodes/{name}/v1", api_key="unused", max_retries=0)
            agents.set_default_openai_client(client)
            model = agents.OpenAIChatCompletionsModel(model="s", openai_client=client) if name == "chat" else "s"
            agent = agents.Agent(name="w", instructions="Answer briefly.", tools=[weather], model=model)
            outputs.append(run(agent, "Weather in Oslo?"))
    server.close("finished")
    assert [getattr(o, "final_output", o) for o in outputs] == ["It is sunny in Oslo."] * 3 and ran == ["Oslo"] * 3
    with sqlite_store.session() as s:
        for name in ("run", "stream", "chat"):
            calls = repo.episode_invocations(s, episode_row_id(server.run_id, name))
            assert [c.output_text for c in calls] == [CALL, "It is sunny in Oslo."]
            assert "<tool_response>\nsunny\n</tool_response>" in calls[1].prompt_text
