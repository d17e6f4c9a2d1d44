"""The CLI's console: ``$COLUMNS`` sets its width on a pipe too (``show episode`` wraps its panels at it); without
it, a pipe gets long lines that are not cut."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from agentmem.testing.store_records import make_episode, make_invocation, make_run
from cli.app import main
from cli.console import console
from store import repository as repo
from store.engine import open_store


def test_columns_sets_the_width_on_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == 250  # pytest's stdout is not a terminal
    monkeypatch.setenv("COLUMNS", "60")
    assert console().width == console(stderr=True).width == 60
    monkeypatch.setenv("COLUMNS", "wide")  # not a number: as if unset
    assert console().width == 250


def test_show_episode_wraps_at_columns(tmp_path, capsys, monkeypatch):
    db = str(tmp_path / "store.db")
    store = open_store(db, create=True)
    run = make_run()
    ep = make_episode(run)
    inv = make_invocation(ep, 0, np.random.default_rng(0), 4, 2)
    inv = inv.model_copy(update={"output_text": "word " * 40, "memory_after": "fact " * 40})
    with store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [inv])
        s.commit()
    store.dispose()
    widths = {}
    for columns in ("50", "120"):
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setattr(sys, "argv", ["agentmem", "show", "episode", ep.id, "--db", db])
        capsys.readouterr()
        with pytest.raises(SystemExit) as done:
            main()
        assert done.value.code in (0, None)
        lines = capsys.readouterr().out.splitlines()
        assert any("memory_update" in line for line in lines)
        widths[columns] = max(len(line) for line in lines)
    assert widths == {"50": 50, "120": 120}
