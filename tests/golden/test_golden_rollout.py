"""Stored outputs of a seeded scripted rollout are pinned byte for byte.

The fixture ``scripted_rollout.json`` beside it was written by this test (``AGENTMEM_WRITE_GOLDEN=1``) on the
code before the memory-policy seam existed; the loop, the overwrite policy and its prompts must keep
producing exactly these rows. Ids and times are left out (random or clock-bound); everything a replay or a
person reads is in: token ids, log-probs, texts, memory before/after, chunk, kind, finish reason, outcome.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from agentmem.backends.scripted import ScriptedBackend
from agentmem.testing.scripted_worker import respond
from agentmem.testing.tiny_models import tiny_tokenizer
from store import repository as repo

GOLDEN = Path(__file__).parent / "scripted_rollout.json"
SYNTH = {"context_tokens": 160, "distractors": 2, "hops": 2}


def _digest(a) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def _canonical(store, run_id: str) -> dict:
    with store.session() as s:
        episodes = sorted(repo.list_episodes(s, run_id), key=lambda e: (e.task_id, e.sample_index))
        order = {e.id: (e.task_id, e.sample_index) for e in episodes}
        invs = sorted(repo.stream_invocations(s, run_ids=[run_id]), key=lambda i: (order[i.episode_id], i.step))
    return {
        "episodes": [
            {k: getattr(e, k) if not hasattr(getattr(e, k), "value") else getattr(e, k).value
             for k in ("task_id", "sample_index", "question", "gold_answers", "evidence", "prediction", "reward",
                       "f1", "em", "sub_em", "status", "stop_reason", "error", "n_chunks")}
            for e in episodes
        ],
        "invocations": [
            {"task": order[i.episode_id][0], "sample": order[i.episode_id][1], "step": i.step,
             "kind": str(getattr(i.kind, "value", i.kind)), "prompt_ids": _digest(i.prompt_ids),
             "output_ids": i.output_ids.tolist(), "output_logprobs": _digest(i.output_logprobs),
             "prompt_text": i.prompt_text, "output_text": i.output_text, "memory_before": i.memory_before,
             "memory_after": i.memory_after, "chunk_text": i.chunk_text, "chunk_index": i.chunk_index,
             "finish_reason": i.finish_reason.value, "temperature": i.temperature}
            for i in invs
        ],
    }


def _rollout(store):
    from agentmem.config import AgentConfig, RolloutConfig
    from agentmem.jobs.rollout import run_rollout
    from agentmem.model_refs import ModelRef, register

    tok = tiny_tokenizer()
    config = RolloutConfig(model="tiny", episodes=3, group_size=2, chunk_tokens=48, env_knobs=SYNTH, seed=5,
                           agent=AgentConfig(memory_tokens=12, answer_max_new_tokens=6, max_batch=4, seed=5,
                                             prompt_layout="memory-first"))
    policy = register(store, ModelRef("tiny", "/models/tiny", "tiny"))
    return run_rollout(store, config, backend=ScriptedBackend(tok, respond(tok)), policy=policy).run_id


def test_scripted_rollout_is_byte_identical(sqlite_store):
    got = _canonical(sqlite_store, _rollout(sqlite_store))
    if os.environ.get("AGENTMEM_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    assert len(got["invocations"]) == len(want["invocations"]) > 6
    for g, w in zip(got["invocations"], want["invocations"], strict=True):
        assert g == w
    assert got["episodes"] == want["episodes"]
