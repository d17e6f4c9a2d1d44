"""Small helpers shared by tests that drive jobs with injected models."""

from __future__ import annotations

from agentmem.backends.scripted import ScriptedBackend
from agentmem.model_refs import ModelRef, register
from agentmem.records import Checkpoint


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
