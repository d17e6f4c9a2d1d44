"""`agentmem serve` driven by the real `openai` client: every call is stored exactly (prompt ids from the chat
template, output ids, sampler log-probs, policy version), episodes come from the URL, headers or metadata,
and `score`, `distill`, `export` and the viewer work on the serve run unchanged. SQLite and Postgres."""

from __future__ import annotations

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
from fastapi.testclient import TestClient
from serve_helpers import running

from agentmem.config import ScoreConfig, ServeConfig
from agentmem.jobs.score import run_score
from agentmem.records import EpisodeStatus, RunKind, TeacherContext
from agentmem.serve.recorder import episode_row_id, serve_run_id
from agentmem.serve.server import build_server
from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer, tool_tokenizer
from agentmem.view.app import create_app as create_view
from store import repository as repo
from store.engine import open_read_only
from store.repository import serve as serve_repo

ROOT = Path(__file__).resolve().parents[3]
QUESTION = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Where does Bob live?"}]


WEATHER = [{"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"]}}}]


def chat_ids(messages, tools=None, tok=None) -> list[int]:
    tok = tok or tiny_tokenizer()
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def am(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def model_dir(tmp_path) -> str:
    return save_tiny(tmp_path / "tiny")


def serve(store, model_dir: str, **options):
    config = ServeConfig(model=model_dir, dtype="float32", run_name="test", batch_window_ms=50, **options)
    return build_server(store, config)


def test_openai_client_calls_are_stored_exactly(store, model_dir, tmp_path):
    server = serve(store, model_dir)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/ep1/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == [model_dir]

        # a two-step chat in episode ep1 (URL path); the second call continues the first (parent header)
        first = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=8, temperature=0,
                                               logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
        second_messages = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content},
                           {"role": "user", "content": "And Alice?"}]
        raw = client.chat.completions.with_raw_response.create(
            model=model_dir, messages=second_messages, max_tokens=6, temperature=0.8, top_p=0.9, seed=5,
            logprobs=True, extra_headers={"X-Agentmem-Parent": first.id})
        second = raw.parse()
        assert raw.headers["x-agentmem-invocation"] == second.id
        rewarded = httpx.post(f"{root}/agentmem/episodes/ep1/reward", json={"reward": 0.5, "metrics": {"em": 0.0}})
        assert rewarded.status_code == 200, rewarded.text

        # n = 4 under one task (header), no episode: a group of four one-call episodes
        group = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        four = group.chat.completions.create(model=model_dir, messages=QUESTION, n=4, max_tokens=5,
                                             extra_headers={"X-Agentmem-Task": "bob"})
        assert len(four.choices) == 4

        # streaming gives the same ids and text as the same seeded call without streaming
        kwargs = dict(model=model_dir, messages=QUESTION, max_tokens=10, temperature=1.0, seed=11, logprobs=True,
                      extra_body={"metadata": {"episode": "s"}})
        plain = group.chat.completions.create(**kwargs)
        chunks = list(group.chat.completions.create(stream=True, **kwargs))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == plain.choices[0].message.content
        stream_lps = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                      for e in c.choices[0].logprobs.content]
        assert stream_lps == [e.logprob for e in plain.choices[0].logprobs.content]
        assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason

        # concurrent clients from threads share backend calls and are all stored
        batches_before = server.sampler.batches
        answers: dict[int, str] = {}

        def call(i: int) -> None:
            c = openai.OpenAI(base_url=f"{root}/episodes/par{i}/v1", api_key="unused", max_retries=0)
            r = c.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=4, temperature=0)
            answers[i] = r.id

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(answers) == 6
        assert server.sampler.batches - batches_before < 6
    server.close("finished")
    run_id = server.run_id

    with store.session() as s:
        run = repo.get_run(s, run_id)
        ep1 = repo.get_episode(s, episode_row_id(run_id, "ep1"))
        calls = repo.episode_invocations(s, ep1.id)
        episodes = repo.list_episodes(s, run_id)
        ckpt = repo.get_checkpoint(s, calls[0].policy_version)
    assert run.kind is RunKind.serve and run.config["model"] == model_dir
    assert ckpt.path == model_dir
    assert [c.step for c in calls] == [0, 1] and [c.id for c in calls] == [first.id, second.id]
    assert calls[0].prompt_ids.tolist() == chat_ids(QUESTION)
    assert calls[1].prompt_ids.tolist() == chat_ids(second_messages)
    assert calls[0].output_ids.tolist() == first.choices[0].model_extra["token_ids"]
    assert first.model_extra["prompt_token_ids"] == chat_ids(QUESTION)
    assert calls[0].output_logprobs.tolist() == [e.logprob for e in first.choices[0].logprobs.content]
    assert calls[1].output_logprobs.tolist() == [e.logprob for e in second.choices[0].logprobs.content]
    assert calls[0].output_text == first.choices[0].message.content
    assert calls[0].temperature == 0 and calls[1].temperature == 0.8
    assert calls[1].parent_invocation_id == first.id and calls[0].parent_invocation_id is None
    assert (ep1.reward, ep1.f1, ep1.em, ep1.status) == (0.5, 0.5, 0.0, EpisodeStatus.answered)
    # greedy: each listed top token is the sampled one, with exactly its log-prob (the same sampling step)
    for entry in first.choices[0].logprobs.content:
        assert entry.top_logprobs[0].token == entry.token and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob

    with store.session() as s:
        sent = [serve_repo.get_serve_call(s, c.id) for c in calls]
    assert sent[0].messages == QUESTION and sent[1].messages == second_messages and sent[0].tools is None
    assert sent[0].sampling == {"temperature": 0.0, "max_tokens": 8, "n": 1, "logprobs": True, "top_logprobs": 3}
    assert sent[1].sampling == {"temperature": 0.8, "top_p": 0.9, "max_tokens": 6, "seed": 5, "n": 1, "logprobs": True}
    assert sent[0].client == {"episode": "ep1", "task": "ep1", "kind": "chat"} and sent[0].prompt_logprobs is None

    bob = sorted((e for e in episodes if e.task_id == "bob"), key=lambda e: e.sample_index)
    assert [e.sample_index for e in bob] == [0, 1, 2, 3]
    assert all(e.status is EpisodeStatus.answered for e in bob)  # standalone calls close with their call
    with store.session() as s:
        streamed_calls = repo.episode_invocations(s, episode_row_id(run_id, "s"))
        assert len(streamed_calls) == 2
        assert streamed_calls[0].output_ids.tolist() == streamed_calls[1].output_ids.tolist()
        assert [len(repo.episode_invocations(s, episode_row_id(run_id, f"par{i}"))) for i in range(6)] == [1] * 6

    # score: the teacher's log-probs of the served calls equal a direct forward pass of the model
    result = run_score(store, ScoreConfig(run_ids=[run_id], teacher=model_dir, context=TeacherContext.aligned))
    assert len(episodes) == 1 + 4 + 1 + 6 and result.scored == 2 + 4 + 2 + 6  # every stored call
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with store.session() as s:
        score = repo.get_teacher_scores(s, [calls[0].id], model_dir, TeacherContext.aligned)[calls[0].id]
    ids = np.concatenate([calls[0].prompt_ids, calls[0].output_ids])
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids.tolist()])).logits[0].float(), -1)
    p = calls[0].prompt_tokens
    direct = logp[p - 1 : len(ids) - 1].gather(-1, torch.tensor(calls[0].output_ids.tolist())[:, None]).squeeze(-1)
    np.testing.assert_allclose(score.token_logprobs, direct.numpy(), atol=1e-5)
    np.testing.assert_allclose(score.token_logprobs, calls[0].output_logprobs, atol=1e-4)  # greedy: T = 1

    # distill one step, export and the viewer's episode page, all on the serve run
    distilled = am("distill", "--run", run_id, "--student", model_dir, "--teacher", model_dir, "--steps", "1",
                   "--invocations-per-step", "4", "--out", str(tmp_path / "ck"), "--db", _plain(store))
    assert distilled.returncode == 0, distilled.stderr
    tuned = am("sft", "--run", run_id, "--student", model_dir, "--min-f1", "0.4", "--kinds", "chat", "--steps", "1",
               "--invocations-per-step", "2", "--out", str(tmp_path / "sft"), "--db", _plain(store))
    assert tuned.returncode == 0, tuned.stderr  # ep1's two calls: its reward made its F1 0.5
    out = tmp_path / "calls.parquet"
    exported = am("export", "--run", run_id, "--out", str(out), "--db", _plain(store))
    assert exported.returncode == 0, exported.stderr
    import datasets

    rows = datasets.Dataset.from_parquet(str(out))
    assert rows.num_rows == 14
    row = next(r for r in rows if r["invocation_id"] == first.id)
    assert row["prompt_ids"] == chat_ids(QUESTION) and row["output_ids"] == calls[0].output_ids.tolist()
    viewer = TestClient(create_view(open_read_only(_plain(store))))
    page = viewer.get(f"/episodes/{ep1.id}")
    assert page.status_code == 200 and "Where does Bob live?" in page.text
    assert viewer.get(f"/runs/{run_id}").status_code == 200 and run_id[:8] in viewer.get("/").text


def _plain(store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def test_bad_input_gets_openai_errors_and_stores_nothing(sqlite_store, model_dir):
    server = serve(sqlite_store, model_dir, max_n=4, context_length=64)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-9", messages=QUESTION, max_tokens=2)
        assert unknown.value.body["code"] == "model_not_found"
        with pytest.raises(openai.BadRequestError) as many:
            client.chat.completions.create(model=model_dir, messages=QUESTION, n=5, max_tokens=2)
        assert many.value.body["param"] == "n"
        with pytest.raises(openai.BadRequestError) as long:
            client.chat.completions.create(model=model_dir, messages=[{"role": "user", "content": "Paris " * 80}],
                                           max_tokens=2)
        assert long.value.body["code"] == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=2, temperature=3)
        with pytest.raises(openai.BadRequestError) as structured:
            client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=2,
                                           response_format={"type": "json_schema"})  # no json_schema
        assert structured.value.body["param"] == "response_format"
        with pytest.raises(openai.BadRequestError) as bad_ids:
            client.completions.create(model=model_dir, prompt=[1, 2, 10**6], max_tokens=2)
        assert bad_ids.value.body["param"] == "prompt"
        malformed = httpx.post(f"{root}/v1/chat/completions", content=b"{not json",
                               headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "invalid_request_error"
        no_messages = httpx.post(f"{root}/v1/chat/completions", json={"model": model_dir})
        assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
        unknown_episode = httpx.post(f"{root}/agentmem/episodes/nope/reward", json={"reward": 1.0})
        assert unknown_episode.status_code == 404 and unknown_episode.json()["error"]["code"] == "episode_not_found"
        bad_parent = httpx.post(f"{root}/v1/chat/completions", headers={"X-Agentmem-Parent": "f" * 32},
                                json={"model": model_dir, "messages": QUESTION, "max_tokens": 2})
        assert bad_parent.status_code == 400 and bad_parent.json()["error"]["code"] == "parent_not_found"

        # a client that drops a stream: the server stays up, and the call is stored whole or not at all
        with httpx.stream("POST", f"{root}/v1/chat/completions",
                          json={"model": model_dir, "messages": QUESTION, "max_tokens": 30, "stream": True}) as r:
            next(r.iter_lines())
        ok = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=3, temperature=0,
                                            extra_body={"return_token_ids": True})
    server.close("finished")
    with sqlite_store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[server.run_id]))
    assert ok.id in {c.id for c in calls} and len(calls) in (1, 2)
    for c in calls:
        assert c.output_logprobs is not None and len(c.output_logprobs) == len(c.output_ids) > 0


def test_api_key_is_required_when_set(sqlite_store, model_dir):
    config = ServeConfig(model=model_dir, dtype="float32")
    server = build_server(sqlite_store, config, api_key="sekret")
    with running(server.app) as root:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{root}/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{root}/v1", api_key="sekret", max_retries=0)
        assert [m.id for m in good.models.list()] == [model_dir]
    server.close("finished")


def test_completions_with_token_ids_and_stop(sqlite_store, model_dir):
    server = serve(sqlite_store, model_dir)
    tok = tiny_tokenizer()
    prompt = tok("Question: where does Bob live? Answer:")["input_ids"]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        full = client.completions.create(model=model_dir, prompt=prompt, max_tokens=12, temperature=0, logprobs=2,
                                         extra_body={"return_token_ids": True})
        assert len(full.choices[0].logprobs.tokens) == len(full.choices[0].model_extra["token_ids"])
        assert [len(top) for top in full.choices[0].logprobs.top_logprobs] == [2] * len(full.choices[0].logprobs.tokens)
        chunks = [c for c in client.completions.create(model=model_dir, prompt=prompt, max_tokens=12, temperature=0,
                                                       logprobs=2, stream=True) if c.choices and c.choices[0].logprobs]
        assert [t for c in chunks for t in c.choices[0].logprobs.token_logprobs] == full.choices[0].logprobs.token_logprobs
        assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    server.close("finished")
    with sqlite_store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[server.run_id]))
    first = next(c for c in calls if c.id == full.id)
    assert first.prompt_ids.tolist() == prompt and first.output_ids.tolist() == full.choices[0].model_extra["token_ids"]
    assert first.kind == "completion"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rollout_through_the_server_stores_the_direct_ids(store, model_dir, temperature):
    from agentmem.config import AgentConfig, BackendKind, RolloutConfig
    from agentmem.jobs.rollout import run_rollout

    config = RolloutConfig(model=model_dir, episodes=2, group_size=2, chunk_tokens=48, env_knobs={"context_tokens": 100},
                           agent=AgentConfig(memory_tokens=6, answer_max_new_tokens=3, temperature=temperature))
    direct = run_rollout(store, config)
    server = build_server(store, ServeConfig(model=model_dir, dtype="float32", batch_window_ms=0))
    with running(server.app) as root:
        served = run_rollout(store, config.model_copy(update={"backend": BackendKind.openai,
                                                                     "base_url": [f"{root}/v1"]}))
    server.close("finished")

    def calls(run_id: str) -> dict:
        with store.session() as s:
            eps = {e.id: e for e in repo.list_episodes(s, run_id)}
            return {(eps[i.episode_id].task_id, eps[i.episode_id].sample_index, i.step): i
                    for i in repo.stream_invocations(s, run_ids=[run_id])}

    a, b, recorded = calls(direct.run_id), calls(served.run_id), calls(server.run_id)
    assert a.keys() == b.keys() and len(a) == len(recorded) > 0
    for key, inv in a.items():
        assert b[key].prompt_ids.tolist() == inv.prompt_ids.tolist()
        assert b[key].output_ids.tolist() == inv.output_ids.tolist()
        assert b[key].policy_version == inv.policy_version
        np.testing.assert_allclose(b[key].output_logprobs, inv.output_logprobs, atol=1e-5)
    assert sorted(i.output_ids.tolist() for i in recorded.values()) == sorted(i.output_ids.tolist() for i in a.values())


def _direct(model, context: list[int], output: list[int]) -> np.ndarray:
    ids = context + output
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return logp[len(context) - 1 : len(ids) - 1].gather(-1, torch.tensor(output)[:, None]).squeeze(-1).numpy()


def test_teacher_contexts_of_served_calls(store, model_dir):
    """persistent and persistent_chat read the episode's earlier calls in arrival order; privileged reads the
    text given once per episode; each score equals a direct forward pass over that context."""
    from transformers import AutoModelForCausalLM

    from agentmem.replay.privileged import privileged_ids

    server = serve(store, model_dir)
    turns = [[{"role": "system", "content": "Keep a memory."}, {"role": "user", "content": f"Chunk {i}: Bob lives in Oslo."}]
             for i in range(2)]
    with running(server.app) as root:
        given = httpx.post(f"{root}/agentmem/episodes/m/privileged", json={"text": "Bob lives in Oslo.",
                                                                          "answers": ["Oslo"], "task": "bob"})
        assert given.status_code == 200, given.text
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        for messages in turns:
            client.chat.completions.create(model=model_dir, messages=messages, max_tokens=5, temperature=0,
                                           extra_headers={"X-Agentmem-Episode": "m", "X-Agentmem-Kind": "memory_update"})
    server.close("finished")
    ep_id = episode_row_id(server.run_id, "m")
    for context in (TeacherContext.persistent, TeacherContext.persistent_chat, TeacherContext.privileged):
        run_score(store, ScoreConfig(run_ids=[server.run_id], teacher=model_dir, context=context))
    with store.session() as s:
        episode = repo.get_episode(s, ep_id)
        first, second = repo.episode_invocations(s, ep_id)
        scores = {c: repo.get_teacher_scores(s, [second.id], model_dir, c)[second.id].token_logprobs
                  for c in (TeacherContext.persistent, TeacherContext.persistent_chat, TeacherContext.privileged)}
    assert (episode.task_id, episode.gold_answers, episode.evidence) == ("bob", ["Oslo"], ["Bob lives in Oslo."])
    assert first.kind == "memory_update" and [first.step, second.step] == [0, 1]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = tiny_tokenizer()
    out = second.output_ids.tolist()
    flat = first.prompt_ids.tolist() + first.output_ids.tolist() + second.prompt_ids.tolist()
    np.testing.assert_allclose(scores[TeacherContext.persistent], _direct(model, flat, out), atol=1e-5)
    chat = [*turns[0], {"role": "assistant", "content": first.output_text}, turns[1][1]]
    np.testing.assert_allclose(scores[TeacherContext.persistent_chat], _direct(model, chat_ids(chat), out), atol=1e-5)
    privileged = privileged_ids(tok, episode) + second.prompt_ids.tolist()
    np.testing.assert_allclose(scores[TeacherContext.privileged], _direct(model, privileged, out), atol=1e-5)


def test_persistent_chat_of_a_multi_turn_served_call(store, tmp_path):
    """A served call whose request is itself a multi-turn chat (with tools, which its template renders):
    under persistent_chat the teacher reads this call's system message once, the earlier call's other
    messages and its reply, then this call's messages after its system message, rendered with this call's
    tools, as docs/serve.md says; each score equals a direct forward pass over that chat, and aligned still
    reads the call's own prompt."""
    from transformers import AutoModelForCausalLM

    tok = tool_tokenizer()
    model_dir = save_tiny(tmp_path / "tools", tokenizer=tok)
    server = serve(store, model_dir)
    first_messages = [{"role": "system", "content": "Keep a memory."},
                      {"role": "user", "content": "Chunk 0: Bob lives in Oslo."}]
    second_messages = [{"role": "system", "content": "Answer briefly."},
                       {"role": "user", "content": "Where does Bob live?"},
                       {"role": "assistant", "content": "In Oslo."},
                       {"role": "user", "content": "And the weather there?"}]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/talk/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(model=model_dir, messages=first_messages, max_tokens=6, temperature=0)
        client.chat.completions.create(model=model_dir, messages=second_messages, tools=WEATHER, max_tokens=6,
                                       temperature=0)
    server.close("finished")
    contexts = (TeacherContext.aligned, TeacherContext.persistent_chat)
    for context in contexts:
        run_score(store, ScoreConfig(run_ids=[server.run_id], teacher=model_dir, context=context))
    with store.session() as s:
        first, second = repo.episode_invocations(s, episode_row_id(server.run_id, "talk"))
        scores = {(c, inv.id): repo.get_teacher_scores(s, [inv.id], model_dir, c)[inv.id].token_logprobs
                  for c in contexts for inv in (first, second)}
    assert second.prompt_ids.tolist() == chat_ids(second_messages, WEATHER, tok)
    with store.session() as s:  # as sent, key order included (the template renders it): Postgres too
        assert json.dumps(serve_repo.get_serve_call(s, second.id).tools) == json.dumps(WEATHER)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    teacher_chat = [second_messages[0], first_messages[1], {"role": "assistant", "content": first.output_text},
                    *second_messages[1:]]
    teacher_ids = chat_ids(teacher_chat, WEATHER, tok)
    assert tok.decode(teacher_ids).count("# Tools") == 1 and tok.decode(teacher_ids).count("Keep a memory.") == 0
    out = second.output_ids.tolist()
    assert len(out) > 0 and len(teacher_ids) > second.prompt_tokens
    np.testing.assert_allclose(scores[TeacherContext.persistent_chat, second.id], _direct(model, teacher_ids, out),
                               atol=1e-5)
    np.testing.assert_allclose(scores[TeacherContext.aligned, second.id],
                               _direct(model, second.prompt_ids.tolist(), out), atol=1e-5)
    # the first call has no history: both contexts read exactly its own prompt
    np.testing.assert_allclose(scores[TeacherContext.persistent_chat, first.id],
                               _direct(model, chat_ids(first_messages, None, tok), first.output_ids.tolist()), atol=1e-5)
    np.testing.assert_array_equal(scores[TeacherContext.persistent_chat, first.id],
                                  scores[TeacherContext.aligned, first.id])


def test_tool_calls_come_back_as_openai_tool_calls(store):
    """A request with tools whose reply holds a Hermes <tool_call>: the response has message.tool_calls and
    finish_reason tool_calls, streamed as delta.tool_calls; the stored ids stay the sampled ids; a follow-up
    with the assistant's call and a tool message is rendered by the chat template (stored prompt ids)."""
    from agentmem.backends.scripted import ScriptedBackend

    tok = tool_tokenizer()
    call = '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    said = f"Let me look.\n{call}"
    backend = ScriptedBackend(tok, lambda prompt: "It is sunny in Oslo." if "sunny" in tok.decode(prompt) else said)
    server = build_server(store, ServeConfig(model="s"), backend=backend)
    ask = [{"role": "user", "content": "Weather in Oslo?"}]
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/episodes/w/v1", api_key="unused", max_retries=0)
        first = client.chat.completions.create(model="s", messages=ask, tools=WEATHER, logprobs=True)
        chunks = list(client.chat.completions.create(model="s", messages=ask, tools=WEATHER, stream=True))
        with client.chat.completions.stream(model="s", messages=ask, tools=WEATHER) as stream:
            assembled = stream.get_final_completion()
        plain = client.chat.completions.create(model="s", messages=ask)  # no tools: the reply is text
        unasked = client.chat.completions.create(model="s", messages=ask, tools=WEATHER, tool_choice="none")
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="s", messages=ask, tools=WEATHER, tool_choice="required")
        follow = [*ask, first.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": first.choices[0].message.tool_calls[0].id, "content": "sunny"}]
        answer = client.chat.completions.create(model="s", messages=follow, tools=WEATHER)
    server.close("finished")

    choice = first.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", "Let me look.")
    [tool_call] = choice.message.tool_calls
    assert (tool_call.type, tool_call.function.name) == ("function", "weather")
    assert tool_call.function.arguments == '{"city": "Oslo"}' and tool_call.id == f"call_{first.id}_0_0"
    assert len(choice.logprobs.content) == len(tok(said, add_special_tokens=False)["input_ids"]) + 1

    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me look."
    streamed = [t for d in deltas for t in d.tool_calls or []]
    assert [(t.index, t.id, t.type, t.function.name) for t in streamed] == [
        (0, f"call_{chunks[0].id}_0_0", "function", "weather"), (0, None, None, None)]
    assert "".join(t.function.arguments for t in streamed) == '{"city": "Oslo"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    got = assembled.choices[0]
    assert got.finish_reason == "tool_calls" and got.message.content == "Let me look."
    assert [(t.function.name, t.function.arguments) for t in got.message.tool_calls] == [("weather", '{"city": "Oslo"}')]

    for reply in (plain, unasked):
        assert (reply.choices[0].message.content, reply.choices[0].finish_reason) == (said, "stop")
        assert reply.choices[0].message.tool_calls is None
    assert refused.value.body["param"] == "tool_choice"
    assert answer.choices[0].message.content == "It is sunny in Oslo." and answer.choices[0].message.tool_calls is None

    with store.session() as s:
        calls = {c.id: c for c in repo.episode_invocations(s, episode_row_id(server.run_id, "w"))}
        sent = serve_repo.get_serve_call(s, answer.id)
    said_ids = tok(said, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert calls[first.id].output_ids.tolist() == said_ids and calls[first.id].output_text == said
    assert calls[assembled.id].output_ids.tolist() == said_ids
    # the follow-up: the assistant's call rendered with its arguments as an object, the tool result as the template says
    rendered = [*ask, {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": tool_call.id, "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
        follow[2]]
    assert calls[answer.id].prompt_ids.tolist() == chat_ids(rendered, WEATHER, tok)
    assert f"Let me look.\n{call}<|im_end|>" in calls[answer.id].prompt_text
    assert "<tool_response>\nsunny\n</tool_response>" in calls[answer.id].prompt_text
    assert sent.messages == rendered


def test_the_models_own_response_template_parses_tool_calls():
    """A tokenizer with a response_template (transformers' response parsing) is parsed with it, the rendered
    prompt as its prefix; a template without tool-call markup and without one gets no parsing."""
    import copy

    from agentmem.serve.tool_calls import ToolCallParser

    tok = copy.deepcopy(tool_tokenizer())
    tok.response_template = {"version": 1, "start_anchor": "<|im_start|>assistant\n", "defaults": {"role": "assistant"},
                             "fields": {"content": {"content": "text"},
                                        "tool_calls": {"open": "[CALL]", "close": "[/CALL]", "content": "json",
                                                       "repeats": True,
                                                       "transform": {"type": "function", "function": "{content}"}}}}
    parser = ToolCallParser.for_request(tok, WEATHER, "auto", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    reply = parser.parse('[CALL]{"name": "weather", "arguments": {"city": "Lyon"}}[/CALL]', "x")
    assert (reply.content, reply.finish_reason) == (None, "tool_calls")
    assert reply.tool_calls == [{"id": "call_x_0", "type": "function",
                                 "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]
    hermes = ToolCallParser.for_request(tool_tokenizer(), WEATHER, None, "")
    assert hermes.parse('<tool_call>{"name": "weather", "arguments": {"city": "Lyon"}}</tool_call>', "y") \
        .tool_calls[0]["function"]["arguments"] == '{"city": "Lyon"}'
    assert hermes.parse('<tool_call>{"name": "weather", "argu', "y").tool_calls == []  # cut short: text
    assert ToolCallParser.for_request(tiny_tokenizer(), WEATHER, None, "") is None  # no tool-call format known
    assert ToolCallParser.for_request(tool_tokenizer(), None, None, "") is None


def test_restart_with_the_same_run_name_continues_the_run(sqlite_store, model_dir):
    ids = []
    for _ in range(2):
        server = serve(sqlite_store, model_dir)
        with running(server.app) as root:
            client = openai.OpenAI(base_url=f"{root}/episodes/long/v1", api_key="unused", max_retries=0)
            ids.append(client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=3).id)
        server.close("interrupted")
        ids.append(server.run_id)
    assert ids[1] == ids[3]
    with sqlite_store.session() as s:
        calls = repo.episode_invocations(s, episode_row_id(ids[1], "long"))
        assert repo.get_run(s, ids[1]).status == "interrupted"
    assert [(c.id, c.step) for c in calls] == [(ids[0], 0), (ids[2], 1)]


def test_gateway_mode_records_what_the_upstream_sampled(sqlite_store, model_dir):
    from fake_vllm import fake_vllm

    from agentmem.backends.transformers_backend import TransformersBackend

    upstream = fake_vllm(TransformersBackend(model_dir, dtype="float32"))
    with running(upstream) as up:
        server = build_server(sqlite_store, ServeConfig(model=model_dir, upstream=f"{up}/v1", run_name="gw"))
        with running(server.app) as root:
            client = openai.OpenAI(base_url=f"{root}/episodes/g/v1", api_key="unused", max_retries=0)
            plain = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=6, temperature=0,
                                                   logprobs=True, extra_body={"return_token_ids": True})
            pair = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=4, n=2, seed=3)
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model=model_dir, messages=QUESTION, max_tokens=6, temperature=0, stream=True) if c.choices)
        server.close("finished")
    answers = upstream.state.answers
    assert len(answers) == 3 and [len(a) for a in answers] == [1, 2, 1]
    assert streamed == plain.choices[0].message.content and len(pair.choices) == 2
    with sqlite_store.session() as s:
        calls = {c.id: c for c in repo.stream_invocations(s, run_ids=[server.run_id])}
    first = calls[plain.id]
    assert first.prompt_ids.tolist() == chat_ids(QUESTION) == answers[0][0]["prompt_token_ids"]
    assert first.output_ids.tolist() == answers[0][0]["token_ids"] == plain.choices[0].model_extra["token_ids"]
    assert first.output_logprobs.tolist() == pytest.approx(answers[0][0]["logprobs"]["token_logprobs"], abs=1e-7)
    stored_pair = sorted(c.output_ids.tolist() for c in calls.values() if c.temperature == 1.0)
    assert stored_pair == sorted(a["token_ids"] for a in answers[1])
    assert first.policy_version is not None and len(calls) == 4
    with sqlite_store.session() as s:
        sent = serve_repo.get_serve_call(s, plain.id)
    expected = [np.nan] + [answers[0][0]["prompt_logprobs"][i][str(t)]["logprob"] for i, t in enumerate(chat_ids(QUESTION))
                           if i > 0]
    np.testing.assert_array_equal(sent.prompt_logprobs, np.asarray(expected, np.float32))
    assert sent.messages == QUESTION and sent.client == {"episode": "g", "task": "g", "kind": "chat"}


def test_the_example_agent_runs_against_the_server(sqlite_store, model_dir):
    server = serve(sqlite_store, model_dir)
    with running(server.app) as root:
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "serve_openai_agent.py"), "--server", root,
                               "--model", model_dir, "--samples", "2", "--max-tokens", "6"],
                              capture_output=True, text=True, timeout=300)
    server.close("finished")
    assert done.returncode == 0, done.stderr
    with sqlite_store.session() as s:
        episodes = repo.list_episodes(s, server.run_id)
        kinds = [c.kind for c in repo.episode_invocations(s, episodes[0].id)]
    assert len(episodes) == 4 and all(e.status is EpisodeStatus.answered and e.f1 is not None for e in episodes)
    assert sorted(e.sample_index for e in episodes if e.task_id == "Where does Bob live?") == [0, 1]
    assert kinds[-1] == "answer" and set(kinds[:-1]) == {"memory_update"}


def test_cli_refuses_bad_flags_with_one_line(tmp_path):
    db = f"sqlite:///{tmp_path / 'a.db'}"
    missing = am("serve", "--model", str(tmp_path / "nope"), "--db", db, "--device", "cpu")
    assert missing.returncode == 1 and missing.stderr.startswith("error: ") and str(tmp_path / "nope") in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    zero = am("serve", "--max-n", "0", "--db", db)
    assert zero.returncode == 2 and "--max-n" in zero.stderr
    relay = am("serve", "--backend", "openai", "--db", db)
    assert relay.returncode == 2 and relay.stderr.startswith("error: --backend") and "--upstream" in relay.stderr
    template = am("serve", "--chat-template", str(tmp_path / "none.jinja"), "--db", db)
    assert template.returncode == 2 and template.stderr.startswith("error: --chat-template")
    assert "chatml_tools" in template.stderr and len(template.stderr.strip().splitlines()) == 1


def test_stop_strings_cut_the_stored_ids_after_the_completing_token(sqlite_store):
    from agentmem.backends.scripted import ScriptedBackend
    from agentmem.serve.sampler import cut_at_stop

    tok = tiny_tokenizer()
    said = "Bob lives in Oslo. Alice lives in Lyon."
    ids = tok(said, add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids[:7]] == ["B", "ob", " liv", "es", " in", " Oslo", "."]
    assert cut_at_stop(tok, ids, ["Oslo"]) == (6, "Bob lives in ")
    assert cut_at_stop(tok, ids, [". A", "Lyon"]) == (8, "Bob lives in Oslo")  # the earliest stop wins
    assert cut_at_stop(tok, ids, ["Paris"]) is None

    server = build_server(sqlite_store, ServeConfig(model="scripted"), backend=ScriptedBackend(tok, lambda _: said))
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        cut = client.chat.completions.create(model="scripted", messages=QUESTION, max_tokens=40, stop=["Oslo"])
        whole = client.chat.completions.create(model="scripted", messages=QUESTION, max_tokens=40)
        short = client.chat.completions.create(model="scripted", messages=QUESTION, max_tokens=3)
        pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="scripted", messages=QUESTION, max_tokens=40, stop="Lyon", stream=True) if c.choices]
    server.close("finished")
    assert (cut.choices[0].message.content, cut.choices[0].finish_reason) == ("Bob lives in ", "stop")
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (said, "stop")
    assert (short.choices[0].message.content, short.choices[0].finish_reason) == ("Bob liv", "length")
    assert "".join(pieces) == "Bob lives in Oslo. Alice lives in "
    with sqlite_store.session() as s:
        calls = {c.id: c for c in repo.stream_invocations(s, run_ids=[server.run_id])}
    assert calls[cut.id].output_ids.tolist() == ids[:6] and calls[cut.id].output_logprobs.tolist() == [0.0] * 6
    assert calls[whole.id].output_ids.tolist() == [*ids, tok.eos_token_id]
    assert calls[short.id].output_ids.tolist() == ids[:3] and calls[short.id].policy_version is None


def test_privileged_context_from_a_file_at_score_time(sqlite_store, model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentmem.errors import ConfigError
    from agentmem.replay.privileged import privileged_ids

    server = serve(sqlite_store, model_dir)
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        for task in ("bob", "alice"):
            client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=4, temperature=0,
                                           extra_headers={"X-Agentmem-Task": task})
    server.close("finished")
    file = tmp_path / "privileged.jsonl"
    file.write_text(json.dumps({"task_id": "bob", "answers": ["Oslo"], "text": "Bob lives in Oslo."}) + "\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1: expected"):
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"answers": []}\n')
        run_score(sqlite_store, ScoreConfig(run_ids=[server.run_id], teacher=model_dir,
                                            context=TeacherContext.privileged, privileged_file=str(bad)))
    with pytest.raises(ValueError, match="--context privileged"):
        ScoreConfig(run_ids=["x"], privileged_file=str(file))
    run_score(sqlite_store, ScoreConfig(run_ids=[server.run_id], teacher=model_dir, context=TeacherContext.privileged,
                                        privileged_file=str(file)))
    with sqlite_store.session() as s:
        episodes = {e.task_id: e for e in repo.list_episodes(s, server.run_id)}
        calls = {t: repo.episode_invocations(s, e.id)[0] for t, e in episodes.items()}
        scores = {t: repo.get_teacher_scores(s, [c.id], model_dir, TeacherContext.privileged)[c.id].token_logprobs
                  for t, c in calls.items()}
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = tiny_tokenizer()
    bob = episodes["bob"].model_copy(update={"gold_answers": ["Oslo"], "evidence": ["Bob lives in Oslo."]})
    for task, episode in (("bob", bob), ("alice", episodes["alice"])):
        context = privileged_ids(tok, episode) + calls[task].prompt_ids.tolist()
        np.testing.assert_allclose(scores[task], _direct(model, context, calls[task].output_ids.tolist()), atol=1e-5)


class _SlowBackend:
    """A scripted backend that takes ``delay_s`` per call: a client can leave while its call generates."""

    name = "slow"

    def __init__(self, tokenizer, text: str, delay_s: float):
        from agentmem.backends.scripted import ScriptedBackend

        self.tokenizer, self.delay_s = tokenizer, delay_s
        self._inner = ScriptedBackend(tokenizer, lambda _: text)

    def generate(self, prompts, params):
        import time

        time.sleep(self.delay_s)
        return self._inner.generate(prompts, params)


def test_a_client_gone_before_its_stream_ends_has_nothing_stored(store):
    import time

    tok = tiny_tokenizer()
    server = build_server(store, ServeConfig(model="slow"), backend=_SlowBackend(tok, "Oslo.", 1.0))
    body = {"model": "slow", "messages": QUESTION, "max_tokens": 8, "stream": True}
    with running(server.app) as root:
        with httpx.stream("POST", f"{root}/episodes/gone/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            gone = response.headers["x-agentmem-invocation"]
        time.sleep(2.0)  # the call finished generating after its client left
        kept = openai.OpenAI(base_url=f"{root}/episodes/kept/v1", api_key="unused", max_retries=0).chat.completions \
            .create(model="slow", messages=QUESTION, max_tokens=8)
    server.close("finished")
    with store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[server.run_id]))
        episodes = repo.list_episodes(s, server.run_id)
    assert [c.id for c in calls] == [kept.id] and gone != kept.id
    assert [e.id for e in episodes] == [episode_row_id(server.run_id, "kept")]  # no episode row for the dropped call


def test_groups_fork_an_episode_and_prompt_lists_make_one_task_each(sqlite_store):
    from agentmem.backends.scripted import ScriptedBackend

    tok = tiny_tokenizer()
    server = build_server(sqlite_store, ServeConfig(model="s"), backend=ScriptedBackend(tok, lambda _: "Oslo."))
    with running(server.app) as root:
        forked = openai.OpenAI(base_url=f"{root}/episodes/E/v1", api_key="unused", max_retries=0)
        pair = forked.chat.completions.with_raw_response.create(model="s", messages=QUESTION, n=2)
        branch = openai.OpenAI(base_url=f"{root}/episodes/E.1/v1", api_key="unused", max_retries=0)
        more = branch.chat.completions.create(model="s", messages=QUESTION)
        assert httpx.post(f"{root}/agentmem/episodes/E.1/reward", json={"reward": 1.0}).status_code == 200
        listed = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0).completions.create(
            model="s", prompt=["Bob lives in", "Alice lives in"], extra_headers={"X-Agentmem-Episode": "L"})
    server.close("finished")
    rid = server.run_id
    assert pair.headers["x-agentmem-episode"] == f"{episode_row_id(rid, 'E.0')},{episode_row_id(rid, 'E.1')}"
    assert len(pair.headers["x-agentmem-invocation"].split(",")) == 2 and len(listed.choices) == 2
    with sqlite_store.session() as s:
        eps = {e.id: e for e in repo.list_episodes(s, rid)}
        branch_calls = repo.episode_invocations(s, episode_row_id(rid, "E.1"))
    e0, e1 = eps[episode_row_id(rid, "E.0")], eps[episode_row_id(rid, "E.1")]
    assert (e0.task_id, e0.sample_index, e0.status) == ("E", 0, EpisodeStatus.running)
    assert (e1.task_id, e1.sample_index, e1.status, e1.reward) == ("E", 1, EpisodeStatus.answered, 1.0)
    assert episode_row_id(rid, "E") not in eps
    assert [c.step for c in branch_calls] == [0, 1] and branch_calls[1].id == more.id
    assert {(eps[episode_row_id(rid, f"L.{i}")].task_id, eps[episode_row_id(rid, f"L.{i}")].question)
            for i in range(2)} == {("L:0", "Bob lives in"), ("L:1", "Alice lives in")}


def test_a_failing_backend_answers_500_and_stores_nothing(sqlite_store):
    class Broken:
        name, tokenizer = "broken", tiny_tokenizer()

        def generate(self, prompts, params):
            raise RuntimeError("out of memory")

    server = build_server(sqlite_store, ServeConfig(model="b"), backend=Broken())
    with running(server.app) as root:
        client = openai.OpenAI(base_url=f"{root}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="b", messages=QUESTION)
        assert "out of memory" in failed.value.body["message"] and failed.value.body["type"] == "server_error"
        events = [line for line in httpx.post(f"{root}/v1/chat/completions", json={
            "model": "b", "messages": QUESTION, "stream": True}).text.splitlines() if line.startswith("data: ")]
        assert len(events) == 1 and json.loads(events[0][6:])["error"]["type"] == "server_error"
    server.close("finished")
    with sqlite_store.session() as s:
        assert repo.count_invocations(s, [server.run_id]) == 0 and repo.list_episodes(s, server.run_id) == []


def test_the_cli_serves_records_and_stops_cleanly(tmp_path, model_dir):
    import signal
    import time

    from serve_helpers import free_port

    from store.engine import open_store

    db, port = f"sqlite:///{tmp_path / 'served.db'}", free_port()
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "AGENTMEM_API_KEY": "k3y"}
    proc = subprocess.Popen([sys.executable, "-m", "cli.app", "serve", "--model", model_dir, "--port", str(port),
                             "--db", db, "--run-name", "cli", "--device", "cpu"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        root = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{root}/health", headers={"api-key": "k3y"}).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.get(f"{root}/v1/models").status_code == 401  # $AGENTMEM_API_KEY is required
        client = openai.OpenAI(base_url=f"{root}/episodes/c/v1", api_key="k3y", max_retries=0)
        reply = client.chat.completions.create(model=model_dir, messages=QUESTION, max_tokens=3)
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/v1" in out and "bearer key required" in out
    store = open_store(db)
    with store.session() as s:
        run = repo.get_run(s, serve_run_id("cli"))
        calls = repo.episode_invocations(s, episode_row_id(run.id, "c"))
    store.dispose()
    assert run.kind is RunKind.serve and run.status == "interrupted" and [c.id for c in calls] == [reply.id]


class Counting:
    """A scripted backend that counts the prompts it generated for: a refused call must reach none."""

    def __init__(self, tok):
        from agentmem.backends.scripted import ScriptedBackend

        self.inner, self.tokenizer, self.name, self.prompts = ScriptedBackend(tok, lambda p: "Oslo"), tok, "c", 0

    def generate(self, prompts, params):
        self.prompts += len(prompts)
        return self.inner.generate(prompts, params)


def bounded_server(store, **options):
    backend = Counting(tiny_tokenizer())
    server = build_server(store, ServeConfig(model="c", batch_window_ms=0, chat_template="chatml_tools", **options),
                          backend=backend)
    return server, backend


def refused(response, param: str, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


def test_rewards_are_finite_and_f1_like_metrics_lie_in_0_1(store):
    """`1e999`, `-Infinity` and `NaN` were taken with a 200 (SQLite stored inf; NaN closed the episode with no
    reward, so the next reward got a 409) and `metrics.f1 = 7` was stored: each is now a 400 naming the field, the
    episode stays open, and a good reward then closes it."""
    server, _ = bounded_server(store)
    with TestClient(server.app) as client:
        assert client.post("/episodes/e/v1/chat/completions", json={"model": "c", "messages": QUESTION}).status_code == 200
        for raw in ("1e999", "-Infinity", "NaN"):
            sent = client.post("/agentmem/episodes/e/reward", content=f'{{"reward": {raw}}}',
                               headers={"content-type": "application/json"})
            assert "numbers must be finite" in refused(sent, "reward")
        assert refused(client.post("/agentmem/episodes/e/reward", json={"reward": 1, "metrics": {"f1": 7}}),
                       "metrics.f1") == "metrics.f1: must lie in [0, 1], got 7.0"
        assert refused(client.post("/agentmem/episodes/e/reward", json={"reward": 1, "metrics": {"em": -1}}),
                       "metrics.em") == "metrics.em: must lie in [0, 1], got -1.0"
        assert "unknown metric" in refused(client.post("/agentmem/episodes/e/reward",
                                                       json={"reward": 1, "metrics": {"bleu": 0.5}}), "metrics.bleu")
        with store.session() as s:
            ep = repo.get_episode(s, episode_row_id(server.run_id, "e"))
        assert (ep.reward, ep.f1, ep.status, ep.stop_reason) == (None, None, EpisodeStatus.running, None)
        ok = client.post("/agentmem/episodes/e/reward", json={"reward": -2.0, "metrics": {"em": 1.0}})
        assert ok.status_code == 200 and (ok.json()["reward"], ok.json()["f1"]) == (-2.0, None)  # F1 unknown
    server.close("finished")


def test_ids_headers_and_nul_are_refused_alike_on_both_databases(store):
    """An episode name or task over 255 characters, a kind over 32 and a NUL in a message gave a 500 on Postgres
    after the generation had run (its body carrying the SQL), and a 200 on SQLite: each is now a 400 naming the
    field and the limit on both, before anything is generated or stored."""
    server, backend = bounded_server(store)
    chat = {"model": "c", "messages": QUESTION}
    with TestClient(server.app) as client:
        long = client.post(f"/episodes/{'e' * 256}/v1/chat/completions", json=chat)
        assert refused(long, "episode") == ("episode is 256 characters long: at most 255 are stored "
                                            "(episodes.task_id is VARCHAR(255))")
        assert "255" in refused(client.post("/v1/chat/completions", json=chat, headers={"X-Agentmem-Task": "t" * 256}),
                                "X-Agentmem-Task")
        assert "255" in refused(client.post("/v1/chat/completions", json={**chat, "metadata": {"episode": "e" * 256}}),
                                "metadata.episode")
        assert refused(client.post("/v1/chat/completions", json=chat, headers={"X-Agentmem-Kind": "k" * 33}),
                       "X-Agentmem-Kind") == ("X-Agentmem-Kind is 33 characters long: at most 32 are stored "
                                              "(invocations.kind is VARCHAR(32))")
        assert "64" in refused(client.post("/v1/chat/completions", json=chat, headers={"X-Agentmem-Parent": "p" * 65}),
                               "X-Agentmem-Parent")
        # a group's episodes are named {episode}.{i}: the name with its suffix must fit
        assert "256 characters" in refused(client.post(f"/episodes/{'g' * 254}/v1/chat/completions",
                                                       json={**chat, "n": 2}), "episode")
        nul = client.post("/v1/chat/completions", json={"model": "c", "messages": [{"role": "user", "content": "a\x00"}]})
        assert refused(nul, "messages.0.content") == "messages.0.content: NUL characters (\\u0000) are not accepted"
        assert "NUL" in refused(client.post("/v1/completions", json={"model": "c", "prompt": "x", "user": "\x00"}),
                                "user")
        assert "NUL" in refused(client.post("/agentmem/episodes/a%00b/reward", json={"reward": 1}), "episode")
        assert "64" in refused(client.get(f"/agentmem/runs/{'r' * 65}/episodes"), "run_id")
        assert backend.prompts == 0
        with store.session() as s:
            assert repo.count_invocations(s, [server.run_id]) == 0 and repo.list_episodes(s, server.run_id) == []
        fits = client.post(f"/episodes/{'e' * 255}/v1/chat/completions", json=chat,
                           headers={"X-Agentmem-Kind": "k" * 32})
        assert fits.status_code == 200, fits.text
    server.close("finished")
    with store.session() as s:
        (ep,) = repo.list_episodes(s, server.run_id)
    assert ep.task_id == "e" * 255


def test_seeds_outside_64_bits_are_refused(sqlite_store):
    """A seed of 2**63 or more gave a 500 ("Overflow when unpacking long long"): a seed is a signed 64-bit
    integer, anything else a 400 naming it."""
    server, backend = bounded_server(sqlite_store)
    with TestClient(server.app) as client:
        for seed in (2**63, -(2**63) - 1, 10**30):
            sent = client.post("/v1/chat/completions", json={"model": "c", "messages": QUESTION, "seed": seed})
            assert refused(sent, "seed").startswith("seed: Input should be")
        assert backend.prompts == 0
        for seed in (2**63 - 1, -(2**63)):
            sent = client.post("/v1/completions", json={"model": "c", "prompt": "x", "seed": seed})
            assert sent.status_code == 200, sent.text
    server.close("finished")


def test_seed_at_the_64_bit_edge_samples_on_a_real_model(sqlite_store, model_dir):
    """The transformers backend seeds its generator with any signed 64-bit seed."""
    server = serve(sqlite_store, model_dir)
    with TestClient(server.app) as client:
        for seed in (2**63 - 1, -(2**63)):
            sent = client.post("/v1/chat/completions", json={"model": model_dir, "messages": QUESTION, "seed": seed,
                                                             "max_tokens": 2, "temperature": 1.0})
            assert sent.status_code == 200, sent.text
    server.close("finished")


def test_chat_roles_contents_and_tool_schemas_are_validated(sqlite_store):
    """`{"role": "bogus"}` was rendered into the prompt, a user message with `content: null` was taken, and a
    tool whose `parameters` is not a JSON schema (`"nope"`, `{"type": "strng"}`) was written into the prompt:
    each is a 400 naming the field now (the schema checked against its metaschema)."""
    server, backend = bounded_server(sqlite_store)

    def chat(**body):
        return client.post("/v1/chat/completions", json={"model": "c", "messages": QUESTION, **body})

    def tool(parameters, name="weather"):
        return [{"type": "function", "function": {"name": name, "parameters": parameters}}]

    with TestClient(server.app) as client:
        assert refused(chat(messages=[{"role": "bogus", "content": "x"}]), "messages.0.role").startswith(
            "messages.0.role: Input should be 'system', 'developer', 'user', 'assistant' or 'tool'")
        assert refused(chat(messages=[{"role": "user", "content": None}]), "messages.0.content") == (
            "messages.0.content: a user message needs content (only an assistant message with tool_calls may "
            "leave it out)")
        assert "only text parts" in refused(chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
                                            "messages.0.content.0")
        assert "only an assistant" in refused(chat(messages=[{"role": "user", "content": "x", "tool_calls": []}]),
                                              "messages.0.tool_calls")
        assert refused(chat(tools=tool("nope")), "tools.0.function.parameters") == (
            "tools.0.function.parameters: a JSON schema is an object, got str")
        assert "not a valid JSON schema: 'strng' is not valid" in refused(chat(tools=tool({"type": "strng"})),
                                                                          "tools.0.function.parameters.type")
        assert "arguments are an object" in refused(chat(tools=tool({"type": "string"})), "tools.0.function.parameters")
        assert "a function name is" in refused(chat(tools=tool({}, name="no spaces")), "tools.0.function.name")
        assert "a tool is" in refused(chat(tools=[{"type": "function"}]), "tools.0")
        assert "not a valid JSON schema" in refused(chat(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "strng"}}}), "response_format")
        assert refused(client.post("/v1/responses", json={"model": "c", "input": "hi", "tools": [
            {"type": "function", "name": "f", "parameters": "nope"}]}), "tools.0.parameters").endswith("got str")
        assert backend.prompts == 0
        called = chat(messages=[*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], tools=tool({"type": "object"}))
        assert called.status_code == 200, called.text
    server.close("finished")


def test_a_server_error_names_no_sql(sqlite_store, monkeypatch):
    """A store failure's 500 said the SQL and its bound parameters (the client's data, the schema): now its
    type and first line only."""
    import sqlalchemy as sa

    server, _ = bounded_server(sqlite_store)

    def fail(*_args, **_kwargs):
        raise sa.exc.DataError("INSERT INTO episodes (task_id) VALUES (?)", ("secret-task",),
                               Exception("value too long"))

    monkeypatch.setattr(server.recorder, "record", fail)
    with TestClient(server.app, raise_server_exceptions=False) as client:
        failed = client.post("/v1/chat/completions", json={"model": "c", "messages": QUESTION})
    server.close("finished")
    assert failed.status_code == 500
    assert failed.json()["error"]["message"] == ("the server failed on this call: DataError: (builtins.Exception) "
                                                 "value too long")


def test_a_body_over_the_limit_is_refused_before_it_is_parsed(sqlite_store):
    """There was no limit: a 10 MB body stalled the whole server for 18 s before its 400. A body over
    `--max-body-mb` is a 413 naming the limit, by its Content-Length or, sent in chunks, as soon as the bytes
    read pass it."""
    server, backend = bounded_server(sqlite_store, max_body_mb=0.01)
    big = json.dumps({"model": "c", "messages": [{"role": "user", "content": "x" * 20_000}]}).encode()
    with TestClient(server.app) as client:
        sized = client.post("/v1/chat/completions", content=big, headers={"content-type": "application/json"})
        assert refused(sized, "body", 413) == ("the request body is over 10485 bytes, the server's limit "
                                               "(agentmem serve --max-body-mb)")
        chunked = client.post("/v1/completions", content=iter([big[:8000], big[8000:]]),
                              headers={"content-type": "application/json"})
        assert refused(chunked, "body", 413).startswith("the request body is over 10485 bytes")
        assert refused(client.post("/agentmem/episodes/e/reward", content=b'{"reward": 1, "prediction": "' + b"x" * 20_000
                                   + b'"}', headers={"content-type": "application/json"}), "body", 413)
        deep = client.post("/v1/completions", content=b'{"model": "c", "prompt": "x", "metadata": ' + b"[" * 100
                           + b"]" * 100 + b"}", headers={"content-type": "application/json"})
        assert refused(deep, "metadata" + ".0" * 64) .endswith("nested more than 64 levels deep")
        assert backend.prompts == 0
        assert client.post("/v1/completions", json={"model": "c", "prompt": "x"}).status_code == 200
    server.close("finished")


def test_health_answers_while_a_long_request_is_read_and_rendered(sqlite_store):
    """Reading, validating, rendering and tokenizing a request run off the event loop: `/health` answers within
    1 s while a 1 MB chat of 25,000 messages is read and refused (its prompt is over the context length)."""
    server, _ = bounded_server(sqlite_store, context_length=512)
    body = json.dumps({"model": "c", "messages": [{"role": "user", "content": "hello there"}] * 25_000}).encode()
    waits: list[float] = []
    with running(server.app) as root:
        def post() -> None:
            answers.append(httpx.post(f"{root}/v1/chat/completions", content=body, timeout=120,
                                      headers={"content-type": "application/json"}))

        answers: list[httpx.Response] = []
        thread = threading.Thread(target=post)
        thread.start()
        while thread.is_alive():
            start = time.monotonic()
            assert httpx.get(f"{root}/health", timeout=5).status_code == 200
            waits.append(time.monotonic() - start)
            time.sleep(0.02)
    server.close("finished")
    assert answers[0].json()["error"]["code"] == "context_length_exceeded"
    assert len(waits) >= 5 and max(waits) < 1.0, (len(waits), max(waits))


def test_sampling_options_at_their_edges_sample(sqlite_store, model_dir):
    """Found by the fuzz (500s): a temperature of 1e-300 divided the logits past float32 (vLLM samples below 1e-5
    greedily, and so does the server now: stored at temperature 0), a repetition penalty of 1e-300 likewise (at
    least 0.01 now, a 400 below), and `include: 5` on /v1/responses raised a TypeError (a 400 naming it now)."""
    server = serve(sqlite_store, model_dir)
    with TestClient(server.app) as client:
        chat = {"model": model_dir, "messages": QUESTION, "max_tokens": 2}
        tiny = client.post("/episodes/t/v1/chat/completions", json={**chat, "temperature": 1e-300})
        assert tiny.status_code == 200, tiny.text
        assert "greater than or equal to 0.01" in refused(
            client.post("/v1/chat/completions", json={**chat, "repetition_penalty": 1e-300}), "repetition_penalty")
        assert "include" in refused(client.post("/v1/responses", json={"model": model_dir, "input": "hi",
                                                                      "include": 5}), "include")
    server.close("finished")
    with sqlite_store.session() as s:
        (call,) = repo.episode_invocations(s, episode_row_id(server.run_id, "t"))
    assert call.temperature == 0.0


def test_a_server_error_leaves_the_connection_open(sqlite_store):
    """A 500 reset the client's connection (the error went on past the handler that answered it): the next
    request on the same connection is served."""
    class Flaky:
        name, tokenizer = "flaky", tiny_tokenizer()

        def __init__(self):
            self.calls = 0

        def generate(self, prompts, params):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("out of memory")
            from agentmem.backends.scripted import ScriptedBackend

            return ScriptedBackend(self.tokenizer, lambda p: "Oslo").generate(prompts, params)

    server = build_server(sqlite_store, ServeConfig(model="f", batch_window_ms=0), backend=Flaky())
    with running(server.app) as root, httpx.Client(base_url=root) as client:
        failed = client.post("/v1/chat/completions", json={"model": "f", "messages": QUESTION})
        again = client.post("/v1/chat/completions", json={"model": "f", "messages": QUESTION})
    server.close("finished")
    assert failed.status_code == 500 and again.status_code == 200
