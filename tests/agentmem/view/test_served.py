"""The viewer's episode page for served calls (`agentmem serve`): each call shows the request the client sent
(its messages, tool calls and results, tools, sampling options and decoding constraint) instead of a memory
diff, with exactly the stored values; a rollout's call keeps its memory diff."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import openai
from fastapi.testclient import TestClient
from serve_helpers import running

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import ServeConfig
from agentmem.records import Episode, Invocation, InvocationKind, ServeCall
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import tiny_tokenizer
from agentmem.view import served
from agentmem.view.app import create_app
from store import repository as repo
from store.engine import open_read_only
from store.repository import serve as serve_repo

TOOLS = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}


class Constraining(ScriptedBackend):
    """A scripted model that declares constrained decoding: its replies already satisfy each grammar."""

    constrains = True


class Request(HTMLParser):
    """Per call section: its messages (role, text, tool calls), tools, options, constraint and schema, and
    whether it has a memory diff; text is collected by the element's class."""

    TEXT = {"role": "role", "content": "text", "tool-call": "calls", "tool-name": "tools", "opt-key": "options",
            "opt-value": "options", "constraint": "constraint", "schema": "schema", "grammar": "grammar"}

    def __init__(self):
        super().__init__()
        self.calls: list[dict] = []
        self._into: tuple[dict | list, str | int] | None = None  # where the next text goes

    def handle_starttag(self, tag, attrs):
        cls = set((dict(attrs).get("class") or "").split())
        if tag == "section" and "call" in cls:
            self.calls.append({"messages": [], "tools": [], "options": [], "constraint": None, "schema": None,
                               "grammar": None, "diff": False})
        if not self.calls:
            return
        call = self.calls[-1]
        call["diff"] |= "diff" in cls
        if "msg" in cls:
            call["messages"].append({"role": "", "text": "", "calls": []})
        for name in cls & set(self.TEXT):
            field = self.TEXT[name]
            if field in ("role", "text", "calls"):
                target = call["messages"][-1]
                if field == "calls":
                    target["calls"].append("")
                    self._into = (target["calls"], -1)
                else:
                    self._into = (target, field)
            elif field == "options":
                if name == "opt-key":
                    call["options"].append(["", ""])
                self._into = (call["options"][-1], 0 if name == "opt-key" else 1)
            elif field == "tools":
                call["tools"].append("")
                self._into = (call["tools"], -1)
            else:
                call[field] = ""
                self._into = (call, field)

    def handle_endtag(self, tag):
        self._into = None

    def handle_data(self, data):
        if self._into is not None:
            target, key = self._into
            target[key] += data  # type: ignore[index]


def calls_of(html: str) -> list[dict]:
    parser = Request()
    parser.feed(html)
    return parser.calls


def test_served_calls_show_their_request_with_the_stored_values(sqlite_store):
    tok = tiny_tokenizer()

    def reply(prompt: list[int]) -> str:
        text = tok.decode(prompt)
        return "Sunny." if "<tool_response>" in text else CALL if "<tools>" in text else '{"answer": "sunny"}'

    server = build_server(sqlite_store, ServeConfig(model="s", chat_template="chatml_tools"),
                          backend=Constraining(tok, reply))
    asked = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/loop/v1", api_key="unused", max_retries=0)
        first = client.chat.completions.create(model="s", messages=asked, tools=TOOLS, temperature=0.5, seed=7,
                                               max_tokens=200)
        call = first.choices[0].message.tool_calls[0]
        answered = [*asked, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
                    {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        client.chat.completions.create(model="s", messages=answered, tools=TOOLS, max_tokens=200)
        client.chat.completions.create(model="s", messages=asked, response_format=FORMAT, max_tokens=200)
    server.close("finished")
    episode_id = episode_row_id(server.run_id, "loop")
    with sqlite_store.session() as s, s.begin():  # and an agent-loop call beside them, with its memory
        rollout = Episode(run_id=server.run_id, env="synthetic", task_id="t", question="q")
        repo.insert_episodes(s, [rollout])
        repo.insert_invocations(s, [Invocation(episode_id=rollout.id, step=0, kind=InvocationKind.memory_update,
                                               prompt_ids=np.array([1]), output_ids=np.array([2]),
                                               output_logprobs=np.array([0.0]), prompt_text="p", output_text="o",
                                               memory_before="old", memory_after="new")])
    with sqlite_store.session() as s:
        stored = [serve_repo.get_serve_call(s, c.id) for c in repo.episode_invocations(s, episode_id)]
    assert stored[0].sampling == {"temperature": 0.5, "seed": 7, "max_tokens": 200, "n": 1}
    assert stored[1].sampling == {"max_tokens": 200, "n": 1}
    record = stored[2].sampling["constraint"]  # serve's record: kind, schema, grammar (and what built it)
    grammar = record["grammar"]
    assert {k: v for k, v in stored[2].sampling.items() if k != "constraint"} == {
        "response_format": FORMAT, "max_tokens": 200, "n": 1}
    assert (record["kind"], record["schema"]) == ("json_schema", SCHEMA) and grammar.startswith("start: ")

    def options(call: ServeCall) -> list[list[str]]:  # the sampling fields in their stored order, values as JSON
        return [[k, json.dumps(v)] for k, v in call.sampling.items() if k != "constraint"]

    store = open_read_only(sqlite_store.engine.url.render_as_string(hide_password=False))
    viewer = TestClient(create_app(store))
    page, other = viewer.get(f"/episodes/{episode_id}"), viewer.get(f"/episodes/{rollout.id}")
    store.dispose()
    assert page.status_code == 200 and other.status_code == 200, other.text[-600:]
    tool_text, weather_call = "weather", 'weather {"city": "Oslo"}'
    one = [{"role": "system", "text": "Be brief.", "calls": []}, {"role": "user", "text": "Weather in Oslo?", "calls": []}]
    assert calls_of(page.text) == [
        {"messages": one, "tools": [tool_text], "options": options(stored[0]), "constraint": "none: sampled freely",
         "schema": None, "grammar": None, "diff": False},
        {"messages": [*one, {"role": "assistant", "text": "", "calls": [weather_call]},
                      {"role": f"tool · {call.id}", "text": "sunny", "calls": []}],
         "tools": [tool_text], "options": options(stored[1]), "constraint": "none: sampled freely",
         "schema": None, "grammar": None, "diff": False},
        {"messages": one, "tools": [], "options": options(stored[2]), "constraint": "JSON schema",
         "schema": json.dumps(SCHEMA), "grammar": grammar, "diff": False}]
    assert "The weather in a city" in page.text and "memory before" not in page.text
    assert calls_of(other.text) == [{"messages": [], "tools": [], "options": [], "constraint": None, "schema": None,
                                     "grammar": None, "diff": True}]


def test_constraints_in_words():
    """The record serve stores under ``sampling["constraint"]`` (``serve.constraints``), in words; the other
    fields are the options."""
    def said(record):
        r = served.request(ServeCall(invocation_id="i", sampling={"n": 1, "constraint": record}))
        return r.constraint, r.schema, r.grammar, r.options

    g = "start: call"
    assert said({"kind": "json_object", "grammar": g}) == ("JSON object", None, g, [("n", "1")])
    assert said({"kind": "json_schema", "schema": SCHEMA, "grammar": g}) == ("JSON schema", json.dumps(SCHEMA), g,
                                                                            [("n", "1")])
    assert said({"kind": "tool_call", "tools": ["weather"], "calls": "one", "grammar": g})[0] == "a call of weather"
    assert said({"kind": "tool_call", "tools": ["weather", "clock"], "calls": "one_or_more", "grammar": g})[0] == (
        "one or more tool calls of weather, clock")
    r = served.request(ServeCall(invocation_id="i", messages=[
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}]))
    assert r.messages == [served.Message("user", "ab", [], None), served.Message("assistant", "", ["f not json"], None)]
    assert (r.constraint, r.schema, r.grammar, r.options) == (None, None, None, [])
