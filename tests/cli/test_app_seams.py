"""The CLI's error boundary and the job lifecycle: fixed choices fail at parse time listing the allowed
values, config validation names the field, a bad flag costs no model load and leaves no run behind, and a
job that dies marks its run failed (or interrupted) with the error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentmem.backends.scripted import ScriptedBackend
from agentmem.config import AgentConfig, RolloutConfig
from agentmem.jobs.rollout import run_rollout
from agentmem.records import Checkpoint
from agentmem.testing.tiny_models import tiny_tokenizer
from store import repository as repo

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1", "AGENTMEM_DEBUG": ""}


def am(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,allowed", [
    (["distill", "--run", "r", "--loss", "typo"], ["'reverse_kl'", "'forward_kl'", "'jsd'"]),
    (["distill", "--run", "r", "--weighting", "typo"], ["'token'", "'call'", "'episode'"]),
    (["distill", "--run", "r", "--teacher-source", "typo"], ["'model'", "'shards'", "'scores'"]),
    (["score", "--run", "r", "--teacher-context", "typo"], ["'aligned'", "'persistent'", "'privileged'"]),
    (["rollout", "--backend", "typo"], ["'transformers'", "'vllm'"]),
    (["rollout", "--dtype", "typo"], ["'float32'", "'bfloat16'"]),
    (["train", "--rl", "typo"], ["'grpo'", "'none'"]),
    (["eval", "--device", "typo"], ["'auto'", "'cpu'", "'cuda'"]),
    (["eval", "--plot-by", "typo"], ["'step'", "'context_tokens'"]),
])
def test_fixed_choices_fail_at_parse_time(tmp_path, args, allowed):
    db = tmp_path / "x.db"
    proc = am(*args, "--db", str(db))
    assert proc.returncode == 2, proc.stderr
    assert " 'typo'" in proc.stderr and all(f" {a.strip(chr(39))}" in proc.stderr for a in allowed), proc.stderr
    assert proc.stderr.startswith("error: unknown ") and "; known: " in proc.stderr, proc.stderr
    assert not db.exists()


def test_validation_error_names_the_field_before_anything_loads(tmp_path):
    db = tmp_path / "x.db"
    proc = am("rollout", "--episodes", "0", "--db", str(db))
    assert proc.returncode == 2  # a value that fails its check is a usage error
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: --episodes: ") and "greater than or equal to 1" in line
    assert not db.exists()  # validated before the store is opened or a model loads
    nested = am("rollout", "--top-p", "0", "--db", str(db))
    assert nested.returncode == 2 and "error: --top-p: " in nested.stderr
    debug = am("--debug", "rollout", "--episodes", "0", "--db", str(db))
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ValidationError" in debug.stderr


def _config(**kw) -> RolloutConfig:
    return RolloutConfig(model="tiny", episodes=2, chunk_tokens=48,
                         env_knobs={"context_tokens": 120, "distractors": 1, "hops": 1},
                         agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4), **kw)


def _policy(store) -> Checkpoint:
    ckpt = Checkpoint(path="/models/tiny", base_model="tiny")
    with store.session() as s:
        repo.insert_checkpoint(s, ckpt)
        s.commit()
    return ckpt


class FailingSink:
    def invocations(self, invocations):
        raise RuntimeError("disk full")

    def episodes_finished(self, episodes):
        pass


class InterruptingSink(FailingSink):
    def invocations(self, invocations):
        raise KeyboardInterrupt


def test_a_job_that_dies_marks_its_run_failed_with_the_error(sqlite_store):
    tok = tiny_tokenizer()
    with pytest.raises(RuntimeError, match="disk full"):
        run_rollout(sqlite_store, _config(), backend=ScriptedBackend(tok, lambda p: "m"),
                    policy=_policy(sqlite_store), sink=FailingSink())
    with sqlite_store.session() as s:
        (summary,) = repo.list_runs(s)
    assert summary.run.status == "failed" and summary.run.error == "RuntimeError: disk full"
    assert summary.run.finished_at is not None and summary.run.pid == os.getpid()


def test_an_interrupted_job_is_marked_interrupted_and_resumes(sqlite_store):
    tok = tiny_tokenizer()
    policy = _policy(sqlite_store)
    with pytest.raises(KeyboardInterrupt):
        run_rollout(sqlite_store, _config(), backend=ScriptedBackend(tok, lambda p: "m"), policy=policy,
                    sink=InterruptingSink())
    with sqlite_store.session() as s:
        (summary,) = repo.list_runs(s)
    assert summary.run.status == "interrupted"
    done = run_rollout(sqlite_store, None, resume=summary.run.id[:8], backend=ScriptedBackend(tok, lambda p: "m"),
                       policy=policy)
    with sqlite_store.session() as s:
        run = repo.get_run(s, done.run_id)
    assert run.id == summary.run.id and run.status == "finished" and run.error is None
    assert all(e.status.value == "answered" for e in done.episodes)


def test_unknown_run_id_leaves_no_run_behind(sqlite_store):
    from store.errors import NotFound

    with pytest.raises(NotFound):
        run_rollout(sqlite_store, None, resume="abcdef12", backend=ScriptedBackend(tiny_tokenizer(), lambda p: "m"),
                    policy=_policy(sqlite_store))
    with sqlite_store.session() as s:
        assert repo.list_runs(s) == []
