"""Evaluation: a greedy rollout stored as an `eval` run, summarised exactly into one eval_results row,
plotted to a PNG, and driven end to end through `agentmem eval`."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import register_policy
from job_fixtures import eval_config

from agentmem.backends.scripted import ScriptedBackend
from agentmem.backends.transformers_backend import TransformersBackend
from agentmem.config import AgentConfig, EvalConfig
from agentmem.jobs.eval import run_eval
from agentmem.jobs.rollout import build_env
from agentmem.plots import plot_eval_results, series
from agentmem.records import EpisodeStatus, EvalResult, RunKind
from agentmem.testing.tiny_models import save_tiny, tiny_llama, tiny_tokenizer
from store import repository as repo

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_eval_config_is_a_greedy_single_sample_rollout():
    from pydantic import ValidationError

    from agentmem.config import RolloutConfig

    assert isinstance(EvalConfig(), RolloutConfig) and EvalConfig().agent.temperature == 0
    with pytest.raises(ValidationError, match="group_size must be 1"):
        EvalConfig(group_size=2)
    with pytest.raises(ValidationError, match="temperature must be 0"):
        EvalConfig(agent=AgentConfig(temperature=1.0))


def test_run_eval_exact_means_failures_count_zero(sqlite_store):
    tok = tiny_tokenizer()
    config = eval_config()
    probe = ScriptedBackend(tok, lambda p: "")
    tasks = build_env(config, probe.tokenizer).tasks(config.episodes)
    right, wrong, broken = tasks[:2], tasks[2], tasks[3]

    def respond(prompt):
        text = tok.decode(prompt)
        if broken.question in text:
            raise RuntimeError("backend exploded")
        if "Reply with the short answer" not in text:
            return "note"
        return next((t.answers[0] for t in right if t.question in text), "qqqq")

    backend = ScriptedBackend(tok, respond)
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    row = run_eval(sqlite_store, config, backend=backend, policy=policy)

    with sqlite_store.session() as s:
        episodes = {e.task_id: e for e in repo.list_episodes(s, row.run_id)}
        run = repo.get_run(s, row.run_id)
        (stored,) = repo.list_eval_results(s, [row.run_id])
    assert run.kind is RunKind.eval and run.status == "finished"
    assert run.config["agent"]["temperature"] == 0.0 and run.config["group_size"] == 1
    assert episodes[broken.task_id].status is EpisodeStatus.failed and episodes[broken.task_id].f1 is None
    assert episodes[wrong.task_id].f1 == 0.0
    assert all(episodes[t.task_id].f1 == 1.0 for t in right)
    # by hand: two of four episodes right, the failed one counts 0
    by_hand = sum(e.f1 or 0.0 for e in episodes.values()) / 4
    assert by_hand == row.f1 == row.em == row.sub_em == 0.5
    assert stored == row
    assert (row.checkpoint_id, row.model, row.env, row.step, row.n_episodes) == (policy.id, "/models/tiny",
                                                                                 "synthetic", 0, 4)
    for name in ("f1", "em", "sub_em"):
        lo, hi = getattr(row, f"{name}_ci")
        assert 0.0 <= lo <= getattr(row, name) <= hi <= 1.0
    assert row.f1_ci[0] < row.f1_ci[1]
    # context tokens: the input length, every chunk of every task (the episode that failed at once too: it is
    # what the memory policy was given, whatever it read)
    count = [sum(len(tok(c, add_special_tokens=False)["input_ids"]) for c in t.chunks) for t in tasks]
    assert row.metrics["context_tokens"] == pytest.approx(sum(count) / 4)
    assert row.metrics["base_model"] == "tiny"
    assert row.metrics["episodes_by_status"] == {"answered": 3, "failed": 1}


def test_greedy_eval_is_reproducible(sqlite_store):
    tok = tiny_tokenizer()
    model = tiny_llama()
    config = eval_config(episodes=3, answer_max_new_tokens=6)
    policy = register_policy(sqlite_store, "/models/tiny", "tiny")
    rows = [run_eval(sqlite_store, config, backend=TransformersBackend.from_model(model, tok), policy=policy, step=7)
            for _ in range(2)]
    outputs = []
    with sqlite_store.session() as s:
        for row in rows:
            invs = list(repo.stream_invocations(s, run_ids=[row.run_id]))
            assert {i.temperature for i in invs} == {0.0}
            eps = sorted(repo.list_episodes(s, row.run_id), key=lambda e: e.task_id)
            outputs.append(([(e.task_id, e.prediction) for e in eps],
                            sorted((i.step, i.output_ids.tolist()) for i in invs)))
    assert rows[0].run_id != rows[1].run_id
    assert outputs[0] == outputs[1]
    assert (rows[0].f1, rows[0].f1_ci, rows[0].step) == (rows[1].f1, rows[1].f1_ci, 7)


def result(step, f1, base="base-a", context=120, created=0, model="/ckpt") -> EvalResult:
    return EvalResult(run_id="r", model=model, env="synthetic", step=step, n_episodes=4, f1=f1, em=f1, sub_em=f1,
                      f1_ci=(max(0.0, f1 - 0.1), min(1.0, f1 + 0.1)),
                      metrics={"base_model": base, "context_tokens": float(context),
                               "env_knobs": {"context_tokens": context}},
                      created_at=datetime(2025, 1, 1, tzinfo=timezone.utc) + timedelta(seconds=created))


def test_series_groups_lines_and_keeps_latest():
    results = [result(10, 0.3), result(0, 0.1), result(10, 0.4, created=5), result(0, 0.2, base="base-b"),
               result(None, 0.9)]
    lines = series(results, "step")
    assert list(lines) == ["base-a · context 120", "base-b · context 120"]
    assert [(x, r.f1) for x, r in lines["base-a · context 120"]] == [(0.0, 0.1), (10.0, 0.4)]
    by_context = series([result(5, 0.5, context=100), result(5, 0.4, context=400)], "context_tokens")
    assert [(x, r.f1) for x, r in by_context["ckpt · step 5"]] == [(100.0, 0.5), (400.0, 0.4)]


def test_plot_writes_png(tmp_path):
    results = [result(s, f, base=b, context=c) for s, f, b, c in
               [(0, 0.1, "a", 120), (10, 0.3, "a", 120), (20, 0.5, "a", 120), (0, 0.2, "b", 400)]]
    for by in ("step", "context_tokens"):
        path = plot_eval_results(results, tmp_path / "plots" / f"{by}.png", by=by)
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 1000
    with pytest.raises(ValueError, match="no eval results"):
        plot_eval_results([result(None, 0.5)], tmp_path / "none.png", by="step")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.app", *args]


def test_cli_eval_prints_table_writes_row_and_plot(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    png = tmp_path / "f1.png"
    proc = subprocess.run(
        cli("eval", "--model", model, "--dtype", "float32", "--episodes", "2", "--chunk-tokens", "48",
            "--memory-tokens", "8", "--answer-tokens", "4", "--knob", "context_tokens=100", "--knob",
            "distractors=1", "--threads", "1", "--plot", str(png), "--db", url),
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    for needle in ("F1", "substring EM", "95% interval", "run_id=", f"plot: {png}"):
        assert needle in proc.stdout, (needle, proc.stdout)
    assert png.read_bytes()[:8] == PNG_MAGIC
    engine = sa.create_engine(url)
    with engine.connect() as c:
        kinds = c.execute(sa.text("select kind from runs")).scalars().all()
        n_rows, run_id = c.execute(sa.text("select count(*), max(run_id) from eval_results")).one()
    engine.dispose()
    assert kinds == ["eval"] and n_rows == 1 and f"run_id={run_id}" in proc.stdout


def test_cli_eval_bad_inputs_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, needle in [(["--model", str(empty)], str(empty))]:
        proc = subprocess.run(cli("eval", *args, "--db", url), cwd=ROOT, env=ENV, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, proc.stderr)
    bad = subprocess.run(cli("eval", "--plot-by", "colour", "--db", url), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "unknown plot by 'colour'; known: step, context_tokens" in bad.stderr


def test_eval_config_is_greedy_and_strict():
    config = eval_config()
    assert (config.agent.temperature, config.group_size, config.seed) == (0.0, 1, 1000)
    with pytest.raises(ValueError):
        EvalConfig(temperature=1.0)  # not a field: the agent's temperature is, and it must be 0


def test_eval_reports_the_empty_output_rate_and_length_per_kind(sqlite_store):
    """Updates that stop at once (end-of-sequence only) and answers of known length: the eval row's
    ``empty_rate``, ``empty_by_kind`` and ``out_len_by_kind`` are the exact shares and means."""
    tok = tiny_tokenizer()
    config = eval_config()
    answer = "blue river"
    backend = ScriptedBackend(tok, lambda p: answer if "Reply with the short answer" in tok.decode(p) else "")
    row = run_eval(sqlite_store, config, backend=backend, policy=register_policy(sqlite_store, "/m/tiny", "tiny"))
    with sqlite_store.session() as s:
        calls = list(repo.stream_invocations(s, run_ids=[row.run_id]))
    updates = [c for c in calls if c.kind == "memory_update"]
    answers = [c for c in calls if c.kind == "answer"]
    assert updates and answers and all(c.output_ids.tolist() == [tok.eos_token_id] for c in updates)
    assert row.metrics["empty_rate"] == pytest.approx(len(updates) / len(calls))
    assert row.metrics["empty_by_kind"] == {"answer": 0.0, "memory_update": 1.0}
    length = len(tok.encode(answer, add_special_tokens=False)) + 1
    assert row.metrics["out_len_by_kind"] == {"answer": pytest.approx(length), "memory_update": 1.0}


def test_empty_after_evidence_counts_updates_that_drop_what_was_read():
    """Only rewrite calls (a policy's declared ``rewrite_kind``: overwrite's and teacher's updates, not routed's)
    made once a fact was read count; of those, blank and ``(empty)`` memories are the dropped ones: 3 of the 4
    that qualify here."""
    import numpy as np

    from agentmem.jobs.eval import empty_after_evidence
    from agentmem.records import Fact, Invocation, Task

    task = Task(task_id="t", env="synthetic", question="q?", chunks=["a", "b", "c"], answers=["x"],
                facts=[Fact(text="Ann lives in Oslo.", chunk=1)])

    def call(chunk, memory, kind="memory_update", policy="overwrite", episode="e"):
        return Invocation(episode_id=episode, step=chunk or 0, kind=kind, memory_policy=policy,
                          prompt_ids=np.array([1]), output_ids=np.array([2]), output_logprobs=None,
                          memory_after=memory, chunk_index=chunk)

    calls = [call(0, "(empty)"),            # nothing read yet: the oracle writes (empty) too
             call(1, "(empty)"),            # the fact was just read: dropped
             call(2, " "),                  # blank: dropped
             call(2, "Ann lives in Oslo."),  # kept
             call(2, "(empty)", policy="teacher"),  # the teacher policy's update: dropped
             call(2, "(empty)", kind="answer"), call(2, "(empty)", policy="log"),  # other calls
             call(2, "(empty)", policy="routed"), call(2, "(empty)", policy="not-installed"),
             call(2, "(empty)", episode="unknown")]
    assert empty_after_evidence(calls, {"e": task}) == pytest.approx(3 / 4)
    assert empty_after_evidence(calls[:1], {"e": task}) is None
    no_facts = task.model_copy(update={"facts": []})
    assert empty_after_evidence(calls, {"e": no_facts}) is None


def test_first_read_skips_splits_evidence_reads_from_other_reads():
    """Only overwrite updates that read a chunk with an empty memory count, split by whether a fact is complete
    in that chunk: here 1 of 2 evidence reads and 2 of 3 other reads write an empty memory."""
    import numpy as np

    from agentmem.jobs.eval import first_read_skips
    from agentmem.records import Fact, Invocation, Task

    task = Task(task_id="t", env="synthetic", question="q?", chunks=["a", "b", "c", "d"], answers=["x"],
                facts=[Fact(text="Ann lives in Oslo.", chunk=1), Fact(text="Oslo is cold.", chunk=3)])

    def call(chunk, before, after, kind="memory_update", policy="overwrite", episode="e"):
        return Invocation(episode_id=episode, step=chunk, kind=kind, memory_policy=policy,
                          prompt_ids=np.array([1]), output_ids=np.array([2]), output_logprobs=None,
                          memory_before=before, memory_after=after, chunk_index=chunk)

    calls = [call(0, "(empty)", "(empty)"),              # other read, skipped
             call(0, "", "Bob is tall."),                # other read (blank memory), written
             call(2, "(empty)", " "),                    # other read, blank: skipped
             call(1, "(empty)", "Ann lives in Oslo."),   # evidence read, written
             call(3, "", "(empty)"),                     # evidence read (second fact), skipped
             call(2, "Ann lives in Oslo.", "(empty)"),   # memory held something: not a first read
             call(1, "(empty)", "(empty)", kind="answer"), call(1, "(empty)", "(empty)", policy="log"),
             call(1, "(empty)", "(empty)", episode="unknown")]
    assert first_read_skips(calls, {"e": task}) == {"evidence": pytest.approx(1 / 2), "other": pytest.approx(2 / 3)}
    assert first_read_skips(calls[:1], {"e": task}) == {"other": 1.0}
    assert first_read_skips(calls, {"e": task.model_copy(update={"facts": []})}) is None


@pytest.mark.parametrize(("update", "want"), [("(empty)", 1.0), ("the note", 0.0)])
def test_eval_row_holds_empty_after_evidence(sqlite_store, update, want):
    tok = tiny_tokenizer()
    backend = ScriptedBackend(tok, lambda p: "blue" if "Reply with the short answer" in tok.decode(p) else update)
    row = run_eval(sqlite_store, eval_config(), backend=backend,
                   policy=register_policy(sqlite_store, "/m/tiny", "tiny"))
    assert row.metrics["empty_after_evidence"] == want
    # every update of the scripted policy writes the same: it skips evidence and other first reads alike, or neither
    assert set(row.metrics["empty_at_first_read"].values()) == {want}
