"""`agentmem serve`'s lifecycle rules: SIGTERM closes the run as interrupted and a restart continues it; the API
key guards every route; a reward is final unless replaced, and a rewarded episode takes no call unless reopened;
unknown routes and over-long outputs answer OpenAI errors naming the right field; top_logprobs come from the
sampling step itself; persistent_chat leaves out the calls that are no chat turns; traces read back over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from serve_helpers import free_port, running

from agentmem.config import ScoreConfig, ServeConfig
from agentmem.jobs.score import run_score
from agentmem.records import EpisodeStatus, RunKind, TeacherContext
from agentmem.serve.recorder import episode_row_id, serve_run_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from store import repository as repo

ROOT = Path(__file__).resolve().parents[3]
QUESTION = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where does Bob live?"}]


@pytest.fixture
def model_dir(tmp_path) -> str:
    return save_tiny(tmp_path / "tiny")


def test_sigterm_marks_the_run_interrupted_and_a_restart_continues_it(tmp_path, model_dir):
    from store.engine import open_store

    db = f"sqlite:///{tmp_path / 'served.db'}"
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    ids, statuses = [], []
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "cli.app", "serve", "--model", model_dir, "--port", str(port),
                                 "--db", db, "--run-name", "term", "--device", "cpu"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            root = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{root}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            store = open_store(db)
            with store.session() as s:
                statuses.append(repo.get_run(s, serve_run_id("term")).status)  # running again after a restart
            store.dispose()
            client = openai.OpenAI(base_url=f"{root}/episodes/long/v1", api_key="unused", max_retries=0)
            ids.append(client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=3).id)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "run " + serve_run_id("term") + " interrupted; --run-name term continues it" in out
    store = open_store(db)
    with store.session() as s:
        run = repo.get_run(s, serve_run_id("term"))
        calls = repo.episode_invocations(s, episode_row_id(run.id, "long"))
    store.dispose()
    assert statuses == ["running", "running"]
    assert run.kind is RunKind.serve and run.status == "interrupted"
    assert [(c.id, c.step) for c in calls] == [(ids[0], 0), (ids[1], 1)]


def test_the_key_guards_every_route_in_either_header(sqlite_store, model_dir):
    server = build_server(sqlite_store, ServeConfig(model=model_dir, dtype="float32"), api_key="sekret")
    with running(server.app) as root:
        assert httpx.get(f"{root}/health").status_code == 401
        assert httpx.get(f"{root}/health", headers={"api-key": "wrong"}).status_code == 401
        assert httpx.get(f"{root}/health", headers={"api-key": "sekret"}).json()["run"] == server.run_id
        assert httpx.get(f"{root}/health", headers={"Authorization": "Bearer sekret"}).status_code == 200
        azure_style = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0,
                                    default_headers={"api-key": "sekret", "Authorization": ""})
        assert [m.id for m in azure_style.models.list()] == [model_dir]
        refused = httpx.post(f"{root}/agentmem/episodes/e/reward", json={"reward": 1.0})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    server.close("finished")


def test_a_reward_is_final_unless_replaced_and_a_rewarded_episode_is_reopened_on_request(sqlite_store):
    from agentmem.backends.scripted import ScriptedBackend

    tok = tiny_tokenizer()
    server = build_server(sqlite_store, ServeConfig(model="s"), backend=ScriptedBackend(tok, lambda _: "Oslo."))
    body = {"model": "s", "messages": QUESTION}
    with running(server.app) as root:
        first = httpx.post(f"{root}/episodes/e/v1/chat/completions", json=body)
        assert httpx.post(f"{root}/agentmem/episodes/e/reward", json={"reward": 1.0}).status_code == 200
        again = httpx.post(f"{root}/agentmem/episodes/e/reward", json={"reward": 0.0})
        assert again.status_code == 409 and again.json()["error"]["param"] == "replace"
        replaced = httpx.post(f"{root}/agentmem/episodes/e/reward", json={"reward": 0.5, "replace": True})
        assert replaced.status_code == 200 and replaced.json()["reward"] == 0.5
        late = httpx.post(f"{root}/episodes/e/v1/chat/completions", json=body)
        assert late.status_code == 409 and late.json()["error"]["code"] == "episode_rewarded"
        late_stream = httpx.post(f"{root}/episodes/e/v1/chat/completions", json={**body, "stream": True})
        assert late_stream.status_code == 409  # refused before generating, stream or not
        with sqlite_store.session() as s:
            kept = repo.get_episode(s, episode_row_id(server.run_id, "e"))
        reopened = httpx.post(f"{root}/episodes/e/v1/chat/completions", json=body,
                              headers={"X-Agentmem-Reopen": "true"})
        assert reopened.status_code == 200, reopened.text
        with sqlite_store.session() as s:
            opened = repo.get_episode(s, episode_row_id(server.run_id, "e"))
            steps = [c.id for c in repo.episode_invocations(s, opened.id)]
        assert httpx.post(f"{root}/agentmem/episodes/e/reward", json={"reward": 0.25}).status_code == 200
    server.close("finished")
    assert (kept.reward, kept.status) == (0.5, EpisodeStatus.answered)
    assert (opened.reward, opened.f1, opened.status, opened.stop_reason) == (None, None, EpisodeStatus.running, None)
    assert steps == [first.json()["id"], reopened.json()["id"]]  # the refused calls stored nothing


def test_openai_errors_name_the_route_and_the_field(sqlite_store, model_dir):
    server = build_server(sqlite_store, ServeConfig(model=model_dir, dtype="float32", context_length=64))
    with running(server.app) as root:
        missing = httpx.post(f"{root}/v1/embeddings", json={"model": model_dir, "input": "hi"})
        assert missing.status_code == 404
        assert missing.json()["error"] == {"message": "unknown route: POST /v1/embeddings",
                                           "type": "invalid_request_error", "param": None, "code": "not_found"}
        wrong_method = httpx.get(f"{root}/v1/chat/completions")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["type"] == "invalid_request_error"
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        for field in ("max_tokens", "max_completion_tokens"):
            with pytest.raises(openai.BadRequestError) as long:
                client.chat.completions.create(model=model_dir, messages=QUESTION, **{field: 60})
            assert (long.value.body["param"], long.value.body["code"]) == (field, "context_length_exceeded")
        with pytest.raises(openai.BadRequestError) as long_prompt:
            client.completions.create(model=model_dir, prompt="Paris " * 80, max_tokens=2)
        assert long_prompt.value.body["param"] == "prompt"
    server.close("finished")


def test_top_logprobs_come_from_the_sampling_step(sqlite_store, model_dir):
    """Sampled at T = 1 with top_k 20 and top_logprobs 20: every sampled token is among its alternatives, with
    exactly its own log-prob, and the stored log-probs are the returned ones."""
    server = build_server(sqlite_store, ServeConfig(model=model_dir, dtype="float32"))
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=12, temperature=1.0,
                                               seed=4, logprobs=True, top_logprobs=20, extra_body={"top_k": 20})
    server.close("finished")
    entries = reply.choices[0].logprobs.content
    assert len(entries) > 0
    for entry in entries:  # (two ids may decode to the same text: the value is among that text's entries)
        assert entry.logprob in [alt.logprob for alt in entry.top_logprobs if alt.token == entry.token]
        assert len(entry.top_logprobs) <= 20
    with sqlite_store.session() as s:
        [call] = list(repo.stream_invocations(s, run_ids=[server.run_id]))
    assert call.output_logprobs.tolist() == pytest.approx([e.logprob for e in entries], abs=0)


def test_persistent_chat_leaves_out_calls_that_are_no_chat_turns(sqlite_store, model_dir):
    """A completions call in an episode of chats: score --context persistent_chat scores the chat calls (the
    later one reads the earlier chat, without the completions call) and counts the one it left out."""
    from transformers import AutoModelForCausalLM

    server = build_server(sqlite_store, ServeConfig(model=model_dir, dtype="float32"))
    second = [{"role": "user", "content": "And Alice?"}]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/mix/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=4, temperature=0)
        client.completions.create(model=model_dir, prompt="Bob lives in", max_tokens=3, temperature=0)
        client.chat.completions.create(model=model_dir, messages=second, max_tokens=4, temperature=0)
    server.close("finished")
    result = run_score(sqlite_store, ScoreConfig(run_ids=[server.run_id], teacher=model_dir,
                                                 context=TeacherContext.persistent_chat))
    assert (result.scored, result.not_chat) == (2, 1)
    with sqlite_store.session() as s:
        first, completion, last = repo.episode_invocations(s, episode_row_id(server.run_id, "mix"))
        scores = repo.get_teacher_scores(s, [first.id, completion.id, last.id], model_dir,
                                         TeacherContext.persistent_chat)
    assert completion.kind == "completion" and set(scores) == {first.id, last.id}
    tok = tiny_tokenizer()
    # the last call's own system message (it has none) leads; the first call's turn follows without its system
    chat = [QUESTION[1], {"role": "assistant", "content": first.output_text}, *second]
    context = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = context + last.output_ids.tolist()
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    direct = logp[len(context) - 1 : len(ids) - 1].gather(-1, torch.tensor(last.output_ids.tolist())[:, None])
    np.testing.assert_allclose(scores[last.id].token_logprobs, direct.squeeze(-1).numpy(), atol=1e-5)


def test_traces_read_back_over_http(sqlite_store):
    """GET /agentmem/episodes/{episode}: the episode's outcome and each call as sent and sampled; GET
    /agentmem/runs/{run}/episodes: the run's episodes; both behind the key."""
    from agentmem.backends.scripted import ScriptedBackend

    tok = tiny_tokenizer()
    server = build_server(sqlite_store, ServeConfig(model="s"), backend=ScriptedBackend(tok, lambda _: "Oslo."),
                          api_key="k")
    key = {"api-key": "k"}
    with running(server.app) as root:
        sent = httpx.post(f"{root}/episodes/t/v1/chat/completions", headers=key,
                          json={"model": "s", "messages": QUESTION, "temperature": 0.5, "user": "u7"}).json()
        httpx.post(f"{root}/agentmem/episodes/t/reward", headers=key, json={"reward": 0.75}).raise_for_status()
        assert httpx.get(f"{root}/agentmem/episodes/t").status_code == 401
        trace = httpx.get(f"{root}/agentmem/episodes/t", headers=key).json()
        listed = httpx.get(f"{root}/agentmem/runs/{server.run_id[:10]}/episodes", headers=key).json()
        unknown_run = httpx.get(f"{root}/agentmem/runs/{'0' * 32}/episodes", headers=key)
        unknown_episode = httpx.get(f"{root}/agentmem/episodes/nope", headers=key)
    server.close("finished")
    with sqlite_store.session() as s:
        [call] = repo.episode_invocations(s, episode_row_id(server.run_id, "t"))
    assert (trace["episode_id"], trace["reward"], trace["status"]) == (call.episode_id, 0.75, "answered")
    [got] = trace["calls"]
    assert got["invocation_id"] == sent["id"] == call.id and got["messages"] == QUESTION
    assert got["options"] == {"temperature": 0.5, "user": "u7", "n": 1}
    assert got["prompt_ids"] == call.prompt_ids.tolist() and got["output_ids"] == call.output_ids.tolist()
    assert got["output_logprobs"] == call.output_logprobs.tolist() and got["output_text"] == "Oslo."
    assert listed["run_id"] == server.run_id and [e["episode_id"] for e in listed["episodes"]] == [call.episode_id]
    assert unknown_run.status_code == 404 and unknown_run.json()["error"]["code"] == "run_not_found"
    assert unknown_episode.status_code == 404 and unknown_episode.json()["error"]["code"] == "episode_not_found"
