"""Tools through `agentmem serve`: a chat template that cannot render them gets the request refused (never a
silent drop), and `--chat-template chatml_tools` serves the default model's ChatML format with Hermes tool calls,
through a whole tool-calling loop of the real `openai` client."""

from __future__ import annotations

import json

import openai
import pytest
from serve_helpers import running

from agentmem.backends.model_files import DEFAULT_MODEL, default_cache_dir
from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import ServeConfig
from agentmem.config.serve_config import TEMPLATES
from agentmem.config.serve_config import load_template as load
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import tiny_tokenizer
from store import repository as repo
from store.repository import serve as serve_repo

WEATHER = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
SMOLLM2 = default_cache_dir() / DEFAULT_MODEL


def scripted(tok) -> ScriptedBackend:
    """Calls the weather tool, then answers from the tool's result once the prompt holds one."""
    return ScriptedBackend(tok, lambda p: "It is sunny in Oslo." if "<tool_response>" in tok.decode(p) else CALL)


def test_a_template_without_tools_refuses_them_by_name(store):
    """The tiny model's template (SmolLM2's format) has no tool format: `tools`, and an assistant turn's earlier
    `tool_calls`, get a 400 naming --chat-template and the field; the same request without them is served."""
    server = build_server(store, ServeConfig(model="s"), backend=scripted(tiny_tokenizer()))
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as tools:
            client.chat.completions.create(model="s", messages=ASK, tools=WEATHER)
        with pytest.raises(openai.BadRequestError) as calls:
            client.chat.completions.create(model="s", messages=history)
        plain = client.chat.completions.create(model="s", messages=ASK)
    server.close("finished")
    assert tools.value.body["param"] == "tools" and "--chat-template" in tools.value.body["message"]
    assert calls.value.body["param"] == "messages" and "messages[1].tool_calls" in calls.value.body["message"]
    assert "--chat-template" in calls.value.body["message"]
    assert plain.choices[0].message.content == CALL  # no tools asked: the reply is text
    with store.session() as s:
        assert repo.count_invocations(s, [server.run_id]) == 1  # the refused calls stored nothing


def test_chatml_tools_template_runs_a_tool_calling_loop(store):
    """`--chat-template chatml_tools` on the tiny model: the client sends tools, gets a tool call back, runs the
    tool, sends its result and gets the final answer; the three calls land in one episode, each prompt rendered
    by the shipped template (tools in the system turn, the call in the assistant turn, the result a tool turn)."""
    tok = tiny_tokenizer()
    server = build_server(store, ServeConfig(model="s", chat_template="chatml_tools"), backend=scripted(tok))
    assert tok.chat_template != load("chatml_tools")  # the backend's tokenizer is left as it was
    tools_run = []
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/loop/v1", api_key="unused", max_retries=0)
        messages: list = list(ASK)
        for _ in range(3):
            reply = client.chat.completions.create(model="s", messages=messages, tools=WEATHER, temperature=0)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                tools_run.append((call.function.name, json.loads(call.function.arguments)))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny"})
        streamed = list(client.chat.completions.create(model="s", messages=messages[:1], tools=WEATHER, stream=True))
    server.close("finished")

    assert tools_run == [("weather", {"city": "Oslo"})]
    assert messages[-1] == {"role": "assistant", "content": "It is sunny in Oslo."}
    names = [t.function.name for c in streamed if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [n for n in names if n] == ["weather"]
    with store.session() as s:
        calls = repo.episode_invocations(s, episode_row_id(server.run_id, "loop"))
        sent = serve_repo.get_serve_call(s, calls[1].id)
    assert [c.step for c in calls] == [0, 1, 2]  # the loop's two calls, then the streamed one
    first, second = (c.prompt_text for c in calls[:2])
    assert first == tok.apply_chat_template(ASK, tools=WEATHER, add_generation_prompt=True, tokenize=False,
                                            chat_template=load("chatml_tools"))
    assert '<tools>\n{"type": "function", "function": {"name": "weather"' in first
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n" in second
    assert second.endswith("<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")
    assert sent.tools == WEATHER


@pytest.mark.skipif(not (SMOLLM2 / "chat_template.jinja").is_file(), reason="the default model is not downloaded")
def test_chatml_tools_renders_plain_chats_as_smollm2_does():
    """Without tools the shipped template renders exactly as the default model's own: a server started with it
    stores the same prompts for plain chats."""
    own = (SMOLLM2 / "chat_template.jinja").read_text()
    tok = tiny_tokenizer()
    for messages in (ASK, [{"role": "system", "content": "Be brief."}, *ASK, {"role": "assistant", "content": "Hm."},
                           {"role": "user", "content": "And Lyon?"}]):
        for prompt in (True, False):
            assert (tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False,
                                            chat_template=load("chatml_tools"))
                    == tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=False,
                                               chat_template=own))
    assert (TEMPLATES / "chatml_tools.jinja").is_file()
