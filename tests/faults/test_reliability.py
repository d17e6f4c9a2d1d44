"""Reliability of the store and the model layer: the run lifecycle and liveness, race-free checkpoint
registration, concurrent creation of a new SQLite store, missing and read-only databases, backend errors."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from helpers import agentmem

from agentmem.errors import BackendError
from agentmem.records import utcnow
from agentmem.testing.store_records import make_run
from store import repository as repo
from store.engine import open_store
from store.errors import NotFound, ReadOnlyDatabase, SchemaOutOfDate, StoreUnavailable
from store.migrations import current_revision, head_revision

# ---- the run lifecycle ------------------------------------------------------------------------------


def test_start_heartbeat_finish_claim(store):
    with store.session() as s:
        started = repo.start_run(s, make_run())
        s.commit()
    assert (started.pid, started.host, started.status) == (os.getpid(), socket.gethostname(), "running")
    with store.session() as s:
        assert repo.get_run(s, started.id) == started
        repo.heartbeat(s, started.id)
        s.commit()
        assert repo.get_run(s, started.id).heartbeat_at > started.heartbeat_at
        repo.finish_run(s, started.id, status="failed", error="ValueError: bad chunk")
        s.commit()
        failed = repo.get_run(s, started.id)
        assert (failed.status, failed.error) == ("failed", "ValueError: bad chunk")
        assert failed.finished_at is not None
        (summary,) = repo.list_runs(s)
        assert summary.liveness == ""
        claimed = repo.claim_run(s, started.id[:8])  # abbreviated, as `--resume` accepts
        s.commit()
        assert claimed == repo.get_run(s, started.id)
        assert (claimed.status, claimed.error, claimed.finished_at, claimed.pid) == ("running", None, None, os.getpid())
        assert claimed.heartbeat_at > failed.heartbeat_at
        repo.finish_run(s, started.id)  # the old signature: finished, no error
        s.commit()
        assert (repo.get_run(s, started.id).status, repo.get_run(s, started.id).error) == ("finished", None)
        with pytest.raises(NotFound, match="no run with id 'nosuchrun'"):
            repo.heartbeat(s, "nosuchrun")


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_liveness_tells_killed_stale_and_unknown_runs(store):
    now = utcnow()
    live = make_run(pid=os.getpid(), host=socket.gethostname(), heartbeat_at=now)
    killed = make_run(pid=_gone_pid(), host=socket.gethostname(), heartbeat_at=now)
    stale = make_run(pid=1, host="elsewhere", heartbeat_at=now - timedelta(minutes=11))
    remote = make_run(pid=1, host="elsewhere", heartbeat_at=now - timedelta(minutes=1))
    unknown = make_run()
    ended = make_run(status="finished", pid=_gone_pid(), host=socket.gethostname())
    runs = [live, killed, stale, remote, unknown, ended]
    with store.session() as s:
        for run in runs:
            repo.insert_run(s, run)
        s.commit()
        liveness = {summary.run.id: summary.liveness for summary in repo.list_runs(s)}
    assert [liveness[r.id] for r in runs] == ["live", "dead", "stale", "live", "unknown", ""]


def test_runs_command_says_a_run_was_killed(tmp_path):
    db = str(tmp_path / "a.db")
    st = open_store(db, create=True)
    killed = make_run(pid=_gone_pid(), host=socket.gethostname())
    with st.session() as s:
        repo.insert_run(s, killed)
        repo.start_run(s, make_run())
        s.commit()
    st.dispose()
    out = agentmem("runs", "--db", db)
    assert out.returncode == 0, out.stderr
    assert f"running (killed: pid {killed.pid} is gone)" in out.stdout
    assert out.stdout.count("running") == 2


# ---- checkpoints ------------------------------------------------------------------------------------


def test_concurrent_registration_gives_one_checkpoint(store):
    """Threads register the same paths at once (each its own connection): one row per path, the same
    checkpoint for everyone."""
    paths = [f"/models/m{i}" for i in range(10)]
    start = threading.Barrier(4)
    got: list[list[str]] = []

    def register() -> None:
        start.wait()
        ids = []
        for path in paths:
            with store.session() as s:
                ids.append(repo.register_checkpoint(s, path, "base").id)
                s.commit()
        got.append(ids)

    threads = [threading.Thread(target=register) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == 4 and got[0] == got[1] == got[2] == got[3]
    assert got[0] == [repo.checkpoint_id_for_path(p) for p in paths]
    with store.session() as s:
        assert s.execute(sa.text("select count(*) from checkpoints")).scalar() == len(paths)
        assert repo.find_checkpoint_by_path(s, paths[0]).id == got[0][0]


def test_registration_returns_the_earliest_row_for_a_path(store):
    from agentmem.records import Checkpoint

    old = Checkpoint(path="/models/a", base_model="base", created_at=utcnow() - timedelta(days=1))
    with store.session() as s:
        repo.insert_checkpoint(s, old)
        assert repo.register_checkpoint(s, "/models/a", "base") == old
        s.commit()
        assert s.execute(sa.text("select count(*) from checkpoints")).scalar() == 1


# ---- opening SQLite files ---------------------------------------------------------------------------


def test_missing_sqlite_file_raises_and_creates_nothing(tmp_path):
    db = tmp_path / "typo.db"
    with pytest.raises(StoreUnavailable, match=rf"no database at {db}: create it with `agentmem db upgrade"):
        open_store(str(db))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [None, b""], ids=["new", "empty"])
def test_create_migrates_a_new_or_empty_file(tmp_path, content):
    db = tmp_path / "a.db"
    if content is not None:
        db.write_bytes(content)
    st = open_store(str(db), create=True)
    assert current_revision(st.engine) == head_revision()
    st.dispose()


def test_create_never_migrates_a_file_with_tables(tmp_path):
    db = tmp_path / "other.db"
    engine = sa.create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.exec_driver_sql("create table notes (x integer)")
    engine.dispose()
    with pytest.raises(SchemaOutOfDate, match="has no agentmem schema"):
        open_store(str(db), create=True)


def _create(db: str, start) -> None:
    start.wait()
    open_store(db, create=True).dispose()


@pytest.mark.parametrize("content", [None, b""], ids=["new", "empty"])
def test_two_processes_create_one_file_at_once(tmp_path, content):
    db = tmp_path / "a.db"
    if content is not None:
        db.write_bytes(content)
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(3)
    procs = [ctx.Process(target=_create, args=(str(db), start)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    st = open_store(str(db))
    assert current_revision(st.engine) == head_revision()
    st.dispose()


def test_read_only_file_is_refused_at_open_for_writing(tmp_path, monkeypatch):
    db = tmp_path / "a.db"
    open_store(str(db), create=True).dispose()
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != db)  # as for a file of mode 0444
    with pytest.raises(ReadOnlyDatabase, match=rf"^database {db} is read-only: make the file writable"):
        open_store(str(db), create=True)
    open_store(str(db)).dispose()  # reading is fine


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a folder whatever its mode")
def test_read_only_folder_is_refused_at_open_for_writing(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ReadOnlyDatabase, match=f"its folder {folder} is not writable"):
            open_store(str(folder / "a.db"), create=True)
    finally:
        folder.chmod(0o755)


def test_a_folder_given_as_database_is_one_line(tmp_path):
    with pytest.raises(StoreUnavailable, match=rf"^{tmp_path} is a directory, not a SQLite database file"):
        open_store(str(tmp_path))


def test_first_write_to_a_read_only_database_names_it(tmp_path):
    db = tmp_path / "a.db"
    open_store(str(db), create=True).dispose()
    st = open_store(f"sqlite:///file:{db}?mode=ro&uri=true")
    with st.session() as s:
        assert repo.list_runs(s) == []
        with pytest.raises(ReadOnlyDatabase, match=rf"^database file:{db} is read-only"):
            repo.start_run(s, make_run())
    st.dispose()


# ---- backends ---------------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_vllm_is_one_line():
    from agentmem.backends.registry import make_backend

    with pytest.raises(BackendError) as err:
        make_backend("vllm", "/models/x")
    assert str(err.value) == ("the vllm backend needs the vllm package: pip install -e '.[vllm]' on a GPU machine")


def test_unknown_backend_raises_backend_error():
    from agentmem.backends.registry import make_backend

    with pytest.raises(BackendError, match="unknown backend 'tgi': choose one of transformers, vllm"):
        make_backend("tgi", "/models/x")
