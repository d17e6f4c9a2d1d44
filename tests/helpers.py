"""Small helpers shared by tests that drive jobs with injected models: no torch at import time (the
helpers that need a model are in ``model_helpers.py``, a job's small configs and stored runs in
``job_fixtures.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agentmem.backends.scripted import ScriptedBackend
from agentmem.model_refs import ModelRef, register
from agentmem.records import Checkpoint
from envs import load_env

ROOT = Path(__file__).resolve().parents[1]

# The synthetic task the job tests roll out: short, one distractor, one hop.
SYNTH = {"context_tokens": 120, "distractors": 1, "hops": 1}

# A rollout config exactly as runs stored it before ``prompt_layout`` existed and before SamplingContext.
OLD_ROLLOUT = {
    "env": "synthetic", "data": None, "env_knobs": {}, "model": "default", "policy": "model",
    "backend": "transformers", "base_url": None, "dtype": "float32", "episodes": 2, "group_size": 1, "seed": 0,
    "chunk_tokens": 512, "agent": {"memory_tokens": 256, "answer_max_new_tokens": 32, "max_chunks": None,
                                   "temperature": 1.0, "top_p": 1.0, "memory_policy": "overwrite",
                                   "memory_options": {}, "max_batch": 8, "seed": 0},
    "context": "privileged",
}


def agentmem(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``agentmem ARGS`` run as a command (from the repository root unless ``cwd``), with no default
    database, one torch thread and no debug tracebacks."""
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "AGENTMEM_DEBUG": ""}
    return subprocess.run([sys.executable, "-m", "cli.app", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)


def register_policy(store, path: str, base_model: str) -> Checkpoint:
    """The checkpoint row of a model that samples (as a job registers it), without loading anything."""
    return register(store, ModelRef(base_model, path, base_model))


class KilledBackend(ScriptedBackend):
    """A scripted backend that dies (as a kill would: ``KeyboardInterrupt``) after ``left`` batched calls."""

    left = 0

    def generate(self, prompts, params):
        self.left -= 1
        if self.left < 0:
            raise KeyboardInterrupt
        return super().generate(prompts, params)


def stored_calls(store, run_id: str):
    """A run's episodes and invocations, as stored."""
    from store import repository as repo

    with store.session() as s:
        return repo.list_episodes(s, run_id), list(repo.stream_invocations(s, run_ids=[run_id]))


def canonical_calls(episodes, invs, *fields: str) -> list[tuple]:
    """The calls as comparable rows, free of ids and times: sorted by (task, sample), step and kind, then
    ``fields`` of each invocation (arrays as lists). Two runs of the same tasks give equal lists when they
    stored the same calls."""
    key = {e.id: (e.task_id, e.sample_index) for e in episodes}

    def value(inv, name):
        v = getattr(inv, name)
        return v.tolist() if hasattr(v, "tolist") else v

    return sorted((key[i.episode_id], i.step, i.kind, *(value(i, f) for f in fields)) for i in invs)


def run_main(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``agentmem ARGS`` run in this process through ``cli.app.main``."""
    import sys

    from cli.app import main

    monkeypatch.setattr(sys, "argv", ["agentmem", *args])
    monkeypatch.delenv("AGENTMEM_DEBUG", raising=False)
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


class Called(Exception):
    """Raised by a job the ``captured`` fixture patched, with what it was given: the CLI got that far."""


def user_content(inv) -> str:
    """The user message of a stored prompt, cut out of its text by hand for ChatML."""
    return inv.prompt_text.split("<|im_start|>user\n", 1)[1].rsplit("<|im_end|>\n<|im_start|>assistant\n", 1)[0]


def tiny_env(tok, **knobs):
    """The synthetic environment of ``SYNTH`` (``knobs`` on top), counting tokens with ``tok``."""
    return load_env("synthetic", seed=0, chunk_tokens=48,
                    count_tokens=lambda s: len(tok(s, add_special_tokens=False)["input_ids"]), **(SYNTH | knobs))


class LogprobBackend(ScriptedBackend):
    """Scripted text; the route call's one token gets log-prob ``route_logprob(prompt text)``."""

    def __init__(self, tokenizer, responses, route_logprob):
        super().__init__(tokenizer, responses)
        self.route_logprob = route_logprob

    def generate(self, prompts, params):
        gens = super().generate(prompts, params)
        out = []
        for prompt, gen in zip(prompts, gens, strict=True):
            text = self.tokenizer.decode(prompt)
            if "Reply yes or no." in text:
                gen = type(gen)(gen.output_ids, [self.route_logprob(text)] * len(gen.output_ids),
                                gen.finish_reason, gen.latency_s)
            out.append(gen)
        return out
