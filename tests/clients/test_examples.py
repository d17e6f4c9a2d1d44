"""The agent-framework examples in examples/ run against `agentmem serve` (a scripted model behind the real
server, so the replies are known): the OpenAI Agents SDK on its default Responses model and on chat
completions, LangGraph's ReAct agent, LangChain's structured output; each run's calls land in its episode.
docs/frameworks.md quotes them: each of its code blocks is the text of the example file it names. The
end-to-end recipe (examples/agent_recipe.py) runs at tiny size: teacher run, sft, distill, evaluations."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import running

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import ServeConfig
from agentmem.records import EpisodeStatus, RunKind
from agentmem.serve.recorder import episode_row_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import tiny_tokenizer
from store import repository as repo
from store.engine import open_store
from store.repository import serve as serve_repo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "frameworks"
WEATHER_CALL = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
ANSWER = {"city": "Oslo", "weather": "sunny"}


def reply(text: str) -> str:
    """The scripted model: calls the weather tool, answers from its result, and answers a structured request
    (a forced `Weather` tool or a JSON format) with ANSWER."""
    if "<tool_response>" in text:
        return "It is sunny in Oslo."
    if '"name": "weather"' in text:
        return WEATHER_CALL
    if '"name": "Weather"' in text:
        return f'<tool_call>\n{{"name": "Weather", "arguments": {json.dumps(ANSWER)}}}\n</tool_call>'
    return json.dumps(ANSWER)


class Constraining(ScriptedBackend):
    """The scripted model, declaring constrained decoding: its replies already satisfy each grammar (the grammars
    themselves are tested on a real model in tests/agentmem/serve/test_constraints.py)."""

    constrains = True


@pytest.fixture
def server(sqlite_store):
    tok = tiny_tokenizer()
    server = build_server(sqlite_store, ServeConfig(model="s", chat_template="chatml_tools"),
                          backend=Constraining(tok, lambda p: reply(tok.decode(p))))
    yield server
    server.close("finished")


def run_example(name: str, root: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(EXAMPLES / name), "--server", root, "--model", "s", *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_the_agents_sdk_example_calls_its_tool_and_is_rewarded(server, sqlite_store, api):
    pytest.importorskip("agents")
    with running(server.app) as root:
        done = run_example("agents_sdk.py", root, "--api", api, "--episode", api)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "It is sunny in Oslo.\n"
    with sqlite_store.session() as s:
        episode = repo.get_episode(s, episode_row_id(server.run_id, api))
        calls = repo.episode_invocations(s, episode.id)
    assert [c.output_text for c in calls] == [WEATHER_CALL, "It is sunny in Oslo."]
    assert (episode.reward, episode.status) == (1.0, EpisodeStatus.answered)


def test_the_langgraph_react_example_calls_its_tool_and_is_rewarded(server, sqlite_store):
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    with running(server.app) as root:
        done = run_example("langgraph_react.py", root)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "It is sunny in Oslo.\n"
    with sqlite_store.session() as s:
        episode = repo.get_episode(s, episode_row_id(server.run_id, "langgraph"))
        calls = repo.episode_invocations(s, episode.id)
    assert [c.output_text for c in calls] == [WEATHER_CALL, "It is sunny in Oslo."]
    assert "<tool_response>\nsunny\n</tool_response>" in calls[1].prompt_text and episode.reward == 1.0


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_the_langchain_structured_output_example_parses_the_reply(server, sqlite_store, method):
    pytest.importorskip("langchain_openai")
    with running(server.app) as root:
        done = run_example("langchain_structured.py", root, "--method", method, "--episode", method)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ANSWER
    with sqlite_store.session() as s:
        [call] = repo.episode_invocations(s, episode_row_id(server.run_id, method))
        sent = serve_repo.get_serve_call(s, call.id)
    assert call.output_text == reply(call.prompt_text)
    kind = {"json_schema": "json_schema", "function_calling": "tool_call", "json_mode": "json_object"}[method]
    assert sent.sampling["constraint"]["kind"] == kind


def test_each_code_block_of_the_frameworks_page_is_the_text_of_its_example():
    """A block follows a line naming its file (`[examples/...](../examples/...)`); its lines are consecutive lines
    of that file, so the page cannot drift from the code the tests above run."""
    page = (ROOT / "docs" / "frameworks.md").read_text()
    blocks = re.findall(r"\]\(\.\./(examples/[\w/.]+\.py)\)[^\n]*\n+```python\n(.*?)```", page, re.S)
    assert {path for path, _ in blocks} == {f"examples/frameworks/{p.name}" for p in EXAMPLES.glob("*.py")}
    for path, block in blocks:
        assert block in (ROOT / path).read_text(), path


@pytest.mark.slow
def test_the_agent_recipe_runs_at_tiny_size(tmp_path):
    """Teacher run through serve (4 tasks x 2 samples, rewarded), sft and distill on it, and four evaluations
    through serve on the same 4 tasks; the printed table's F1 values are the stored episodes' means."""
    pytest.importorskip("agents")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTMEM_DB": ""}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "agent_recipe.py"), "--tiny", "--workdir",
                           str(tmp_path)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr + (tmp_path / "recipe.log").read_text()
    table = re.findall(r"^(teacher|student[ +a-z]*?) +([0-9a-f]{12}) +([0-9.]+)$", done.stdout, re.M)
    assert [row[0] for row in table] == ["teacher", "student", "student + sft", "student + sft + distill"]
    store = open_store(f"sqlite:///{tmp_path / 'recipe.db'}")
    with store.session() as s:
        serve_runs = repo.list_runs_of_kind(s, RunKind.serve)
        trained = [repo.list_runs_of_kind(s, kind) for kind in (RunKind.sft, RunKind.distill)]
        checkpoints = [len(repo.list_checkpoints(s, runs[0].id)) for runs in trained]
        episodes = {r.id: repo.list_episodes(s, r.id) for r in serve_runs}
    store.dispose()
    assert len(serve_runs) == 5 and [len(runs) for runs in trained] == [1, 1] and checkpoints == [1, 1]
    [teacher] = [r for r in episodes if len(episodes[r]) == 8]
    assert sorted(e.sample_index for e in episodes[teacher]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(e.status is EpisodeStatus.answered and e.f1 is not None for e in episodes[teacher])
    for label, short, f1 in table:
        [run_id] = [r for r in episodes if r.startswith(short) and r != teacher]
        assert len(episodes[run_id]) == 4
        assert all(e.status is EpisodeStatus.answered for e in episodes[run_id])
        assert float(f1) == pytest.approx(sum(e.f1 for e in episodes[run_id]) / 4, abs=5e-4), label
