"""`agentmem rollout` end to end through the CLI on a tiny model: SIGKILL mid-run, then --resume. Its output: a
narrow query that runs (question, gold as text, prediction, F1, calls, status, stop reason), and for a rollout (or
its resumption) of the untrained default model a last line saying that a score near 0 is expected and which
commands show learning."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentmem.jobs.rollout import RolloutResult
from agentmem.records import Episode, EpisodeStatus
from agentmem.testing.tiny_models import save_tiny
from cli.app import main
from cli.rollout import UNTRAINED_NOTE, rollout
from store.engine import open_store

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}


def cli(*args: str, **kw):
    return [sys.executable, "-m", "cli.app", *args]


def count(url: str, sql: str) -> int:
    if not Path(url.removeprefix("sqlite:///")).exists():  # never create the file the CLI is about to create
        return 0
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return c.execute(sa.text(sql)).scalar() or 0
    except sa.exc.OperationalError:
        return 0
    finally:
        engine.dispose()


def test_rollout_sigkill_then_resume(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    url = f"sqlite:///{tmp_path / 'run.db'}"
    args = ["rollout", "--model", model, "--dtype", "float32", "--episodes", "12", "--group-size", "2",
            "--chunk-tokens", "48", "--memory-tokens", "24", "--answer-tokens", "6", "--batch", "4",
            "--knob", "context_tokens=160", "--knob", "distractors=1", "--threads", "1", "--db", url]
    proc = subprocess.Popen(cli(*args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and count(url, "select count(*) from invocations") < 4:
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    before = count(url, "select count(*) from invocations")
    assert before >= 4
    assert count(url, "select count(*) from episodes where status = 'running'") > 0
    run_id = sa.create_engine(url).connect().execute(sa.text("select id from runs")).scalar()

    done = subprocess.run(cli("rollout", "--resume", run_id[:8], "--db", url), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"run_id={run_id}" in done.stdout
    assert count(url, "select count(*) from episodes") == 24
    assert count(url, "select count(*) from episodes where status = 'running'") == 0
    # every episode has exactly one call per chunk plus the answer: nothing duplicated, nothing missing
    assert count(url, "select count(*) from episodes e where (select count(*) from invocations i "
                      "where i.episode_id = e.id) != e.n_chunks + 1") == 0
    out = subprocess.run(cli("sql", "select run_id, status from episode_summary", "--format", "json", "--db", url),
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    rows = json.loads(out.stdout)
    assert len(rows) == 24 and {r["run_id"] for r in rows} == {run_id}
    runs = subprocess.run(cli("runs", "--db", url), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert "finished" in runs.stdout


def test_rollout_bad_inputs_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    unknown = subprocess.run(cli("rollout", "--env", "nope", "--db", url), cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=120)
    assert unknown.returncode == 2 and "unknown environment 'nope'; known: synthetic, " in unknown.stderr
    for args, needle, code in [
        (["--env", "hotpotqa"], "needs a data file", 2),  # the command line itself is incomplete
        (["--env", "hotpotqa", "--data", str(tmp_path / "missing.json")], "missing.json", 1),
        (["--model", str(tmp_path)], str(tmp_path), 1),
        (["--resume", "nosuchrun"], "no run with id", 1),
    ]:
        proc = subprocess.run(cli("rollout", *args, "--db", url), cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == code, (args, proc.stdout, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and needle in last, (args, proc.stderr)
        assert "Traceback" not in proc.stderr


def run_cli(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """``agentmem ARGS`` in this process: the exit code and what it printed."""
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["agentmem", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return code, capsys.readouterr().out


def test_rollout_suggests_a_narrow_query_that_runs(tmp_path, capsys, monkeypatch):
    model = save_tiny(tmp_path / "model")
    db = str(tmp_path / "store.db")
    code, out = run_cli(capsys, monkeypatch, "rollout", "--policy", "oracle", "--model", model, "--episodes", "2",
                    "--knob", "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens", "24", "--db", db)
    assert code == 0
    lines = out.strip().splitlines()
    run_id = lines[0].removeprefix("run_id=")
    assert lines[1].startswith("plan: 2 episodes, about ") and lines[1].endswith(" calls, time shown once calls run")
    assert lines[-1].endswith(f" --db {db}")
    query = lines[-1].removeprefix("inspect: agentmem sql ").removesuffix(f" --db {db}").strip('"')
    assert query == ("select question, gold->>0 as gold, prediction, f1, n_calls, status, "
                     f"stop_reason from episode_summary where run_id = '{run_id}'")
    assert UNTRAINED_NOTE not in out  # an oracle rollout of a named model is not the untrained quick start
    code, table = run_cli(capsys, monkeypatch, "sql", "--db", db, "--format", "csv", query)
    assert code == 0
    rows = list(csv.reader(io.StringIO(table)))
    assert rows[0] == ["question", "gold", "prediction", "f1", "n_calls", "status", "stop_reason"]
    assert len(rows) == 3 and all(r[5] == "answered" and r[6] == "answered" for r in rows[1:])
    assert all(r[1] == r[2] and not r[1].startswith("[") for r in rows[1:])  # the oracle's answer is the gold, as text


def test_the_suggested_query_holds_nothing_bash_expands_in_double_quotes():
    from cli.paste import sql_command
    from cli.rollout import summary_query

    assert sql_command(summary_query("r"), "postgresql://u@h:5432/d") == (
        'agentmem sql "select question, gold->>0 as gold, prediction, f1, n_calls, status, stop_reason from '
        "episode_summary where run_id = 'r'\" --db postgresql://u@h:5432/d")
    with pytest.raises(ValueError, match="bash would expand it"):
        sql_command("select json_extract(gold, '$[0]') from episodes")


def test_untrained_default_rollout_ends_with_the_expected_score_note(tmp_path, capsys, monkeypatch):
    """The job itself is patched out (the default model is not loaded here): the CLI's last line is the note."""
    episode = Episode(run_id="r" * 32, env="synthetic", task_id="t", question="q?", f1=0.0, em=0.0, sub_em=0.0,
                      status=EpisodeStatus.truncated)
    monkeypatch.setattr("agentmem.jobs.rollout.run_rollout",
                        lambda store, config, *a, **k: RolloutResult("r" * 32, [episode], 0, None, config))
    code, out = run_cli(capsys, monkeypatch, "rollout", "--db", str(tmp_path / "store.db"), "--device", "cpu")
    assert code == 0
    assert out.strip().splitlines()[-1] == UNTRAINED_NOTE
    assert "agentmem rollout --policy oracle" in UNTRAINED_NOTE and "docs/learning.md" in UNTRAINED_NOTE


def test_resumed_untrained_default_rollout_ends_with_the_note_too(tmp_path, capsys, monkeypatch):
    """``rollout --resume RUN`` has no config of its own: the note follows the resumed run's stored one, which the
    job's result carries (the CLI reads it back only for the plan it prints before the job starts)."""
    from agentmem.config import PolicySource, RolloutConfig

    episode = Episode(run_id="r" * 32, env="synthetic", task_id="t", question="q?", f1=0.0, em=0.0, sub_em=0.0,
                      status=EpisodeStatus.truncated)
    monkeypatch.setattr("cli.common.preflight", lambda *a, **k: None)
    monkeypatch.setattr("cli.rollout._is_replay", lambda *a: False)
    open_store(str(tmp_path / "store.db"), create=True)
    for stored, noted in ((RolloutConfig(), True), (RolloutConfig(policy=PolicySource.oracle), False)):
        monkeypatch.setattr("agentmem.jobs.rollout.load_rollout_config", lambda store, run_id, c=stored: (run_id, c))
        monkeypatch.setattr("agentmem.jobs.rollout.run_rollout",
                            lambda *a, c=stored, **k: RolloutResult("r" * 32, [episode], 0, None, c))
        code, out = run_cli(capsys, monkeypatch, "rollout", "--resume", "r" * 32, "--db", str(tmp_path / "store.db"),
                        "--device", "cpu")
        assert code == 0
        assert (out.strip().splitlines()[-1] == UNTRAINED_NOTE) is noted


def test_rollout_help_gives_a_measured_time_not_a_guess():
    doc = rollout.__doc__
    assert "a few minutes" not in doc
    assert "measured" in doc


@pytest.fixture(autouse=True)
def _no_db_env(monkeypatch):
    monkeypatch.delenv("AGENTMEM_DB", raising=False)


def test_run_id_is_the_first_line_before_the_tokenizer_loads(tmp_path, capsys, monkeypatch):
    """The run's row (and its printed id, then its plan) comes before the job loads the model's tokenizer, which
    on a fresh machine means before the default model is prepared; the plan counted the calls with the
    tokenizer of this model folder before the row, printing nothing."""
    import agentmem.model_refs as policy_models

    model = save_tiny(tmp_path / "model")
    db = str(tmp_path / "store.db")
    loaded = policy_models.load_tokenizer
    seen: list[str] = []

    def load_tokenizer(path):
        seen.append(capsys.readouterr().out)  # what was printed when the tokenizer started loading
        return loaded(path)

    monkeypatch.setattr(policy_models, "load_tokenizer", load_tokenizer)
    code, out = run_cli(capsys, monkeypatch, "rollout", "--policy", "oracle", "--model", model, "--episodes", "1",
                        "--knob", "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens", "24", "--db", db)
    assert code == 0
    assert len(seen) == 2 and seen[0] == "", seen  # the plan's count, then the job's
    assert seen[1].startswith("run_id=") and seen[1].splitlines()[1].startswith("plan: 1 episode, about ")


def test_dtype_auto_prints_its_choice_right_after_the_run_id(tmp_path, capsys, monkeypatch):
    """`--dtype auto` measures before the run is written (its config stores the concrete choice) and prints the
    choice after `run_id=` and the plan, before the job loads the run's tokenizer or weights."""
    import agentmem.model_refs as policy_models
    from agentmem.backends.dtype_choice import DTypeChoice
    from store import repository as repo

    model = save_tiny(tmp_path / "model")
    db = str(tmp_path / "store.db")
    monkeypatch.setattr(policy_models, "auto_dtype", lambda store, ref: DTypeChoice("bfloat16", "measured"))
    loaded = policy_models.load_tokenizer
    seen: list[str] = []

    def load_tokenizer(path):
        seen.append(capsys.readouterr().out)
        return loaded(path)

    monkeypatch.setattr(policy_models, "load_tokenizer", load_tokenizer)
    code, _ = run_cli(capsys, monkeypatch, "rollout", "--policy", "oracle", "--model", model, "--episodes", "1",
                      "--dtype", "auto", "--knob", "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens",
                      "24", "--db", db)
    assert code == 0 and len(seen) == 2 and seen[0] == ""
    first, plan, second = seen[1].splitlines()
    assert plan.startswith("plan: 1 episode, about ")
    run_id = first.removeprefix("run_id=")
    assert second == "--dtype auto: bfloat16 (measured)"
    with open_store(db).session() as s:
        assert repo.get_run(s, run_id).config["dtype"] == "bfloat16"


def test_a_data_file_of_the_wrong_shape_is_refused_before_any_row(tmp_path, capsys, monkeypatch):
    """A data file that is no HotpotQA file is read and refused before the run row, the database file or its
    lock is written (``envs.check_data`` in the CLI's preflight), with one error line and no run id."""
    model = save_tiny(tmp_path / "model")
    db = tmp_path / "store.db"
    data = tmp_path / "hotpot.json"
    data.write_text(json.dumps({"not": "a list of questions"}))
    code, out = run_cli(capsys, monkeypatch, "rollout", "--env", "hotpotqa", "--data", str(data), "--model", model,
                        "--episodes", "1", "--db", f"sqlite:///{db}")
    assert (code, out) == (1, "")
    assert not db.exists() and not (tmp_path / "store.db.lock").exists()
