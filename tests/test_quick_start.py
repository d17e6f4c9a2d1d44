"""The quick start's first result: a rollout suggests a narrow query that runs (question,
gold as text, prediction, F1, calls, status, stop reason), and a rollout (or its resumption) of the untrained default model ends with one line saying
that a score near 0 is expected and which commands show learning."""

from __future__ import annotations

import csv
import io
import sys

import pytest

from agentmem.jobs.rollout import RolloutResult
from agentmem.records import Episode, EpisodeStatus
from agentmem.testing.tiny_models import save_tiny
from cli.app import main
from cli.rollout import UNTRAINED_NOTE, rollout
from store.engine import open_store


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str]:
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
    code, out = cli(capsys, monkeypatch, "rollout", "--policy", "oracle", "--model", model, "--episodes", "2",
                    "--knob", "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens", "24", "--db", db)
    assert code == 0
    lines = out.strip().splitlines()
    run_id = lines[0].removeprefix("run_id=")
    query = lines[-1].removeprefix("inspect: agentmem sql ").strip('"')
    assert query == ("select question, json_extract(gold, '$[0]') as gold, prediction, f1, n_calls, status, "
                     f"stop_reason from episode_summary where run_id = '{run_id}'")
    assert UNTRAINED_NOTE not in out  # an oracle rollout of a named model is not the untrained quick start
    code, table = cli(capsys, monkeypatch, "sql", "--db", db, "--format", "csv", query)
    assert code == 0
    rows = list(csv.reader(io.StringIO(table)))
    assert rows[0] == ["question", "gold", "prediction", "f1", "n_calls", "status", "stop_reason"]
    assert len(rows) == 3 and all(r[5] == "answered" and r[6] == "answered" for r in rows[1:])
    assert all(r[1] == r[2] and not r[1].startswith("[") for r in rows[1:])  # the oracle's answer is the gold, as text


def test_postgres_query_takes_the_gold_as_text_in_its_own_dialect():
    from cli.rollout import summary_query

    assert summary_query("r", "postgresql://u@h:5432/d").startswith("select question, gold->>0 as gold, ")


def test_untrained_default_rollout_ends_with_the_expected_score_note(tmp_path, capsys, monkeypatch):
    """The job itself is patched out (the default model is not loaded here): the CLI's last line is the note."""
    episode = Episode(run_id="r" * 32, env="synthetic", task_id="t", question="q?", f1=0.0, em=0.0, sub_em=0.0,
                      status=EpisodeStatus.truncated)
    monkeypatch.setattr("agentmem.jobs.rollout.run_rollout",
                        lambda *a, **k: RolloutResult("r" * 32, [episode], 0, None))
    code, out = cli(capsys, monkeypatch, "rollout", "--db", str(tmp_path / "store.db"), "--device", "cpu")
    assert code == 0
    assert out.strip().splitlines()[-1] == UNTRAINED_NOTE
    assert "agentmem rollout --policy oracle" in UNTRAINED_NOTE and "docs/learning.md" in UNTRAINED_NOTE


def test_resumed_untrained_default_rollout_ends_with_the_note_too(tmp_path, capsys, monkeypatch):
    """``rollout --resume RUN`` has no config of its own: the note follows the resumed run's stored one."""
    from agentmem.config import PolicySource, RolloutConfig

    episode = Episode(run_id="r" * 32, env="synthetic", task_id="t", question="q?", f1=0.0, em=0.0, sub_em=0.0,
                      status=EpisodeStatus.truncated)
    monkeypatch.setattr("agentmem.jobs.rollout.run_rollout",
                        lambda *a, **k: RolloutResult("r" * 32, [episode], 0, None))
    monkeypatch.setattr("cli.common.preflight", lambda *a, **k: None)
    monkeypatch.setattr("cli.rollout._is_replay", lambda *a: False)
    open_store(str(tmp_path / "store.db"), create=True)
    for stored, noted in ((RolloutConfig(), True), (RolloutConfig(policy=PolicySource.oracle), False)):
        monkeypatch.setattr("agentmem.jobs.rollout.load_rollout_config", lambda store, run_id, c=stored: (run_id, c))
        code, out = cli(capsys, monkeypatch, "rollout", "--resume", "r" * 32, "--db", str(tmp_path / "store.db"),
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
