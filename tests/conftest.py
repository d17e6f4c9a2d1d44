"""Shared fixtures, and the markers that tier the suite. One torch thread: with 2 cores and another busy
process, more threads thrash."""

from __future__ import annotations

import concurrent.futures.process
import multiprocessing
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _memory_policies_restored():
    """A memory policy a test registers stays registered for that test only: the registry is global, and a
    policy left in it shows up in every later test's list of known policies (tests/cli/test_app_errors.py)."""
    registry = sys.modules.get("agentmem.agent.registry")
    before = dict(registry._ADDED) if registry is not None else {}
    yield
    registry = sys.modules.get("agentmem.agent.registry")
    if registry is not None:
        registry._ADDED.clear()
        registry._ADDED.update(before)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not available: {SHARED_DATA} is absent")
    return SHARED_DATA


# ---- databases --------------------------------------------------------------------------------------
# Store tests run on SQLite and on a real Postgres server named by AGENTMEM_TEST_PG_URL (a server URL;
# each test gets a fresh database on it). Without the URL the Postgres cases skip, except under CI
# (CI=true), where a missing server is a failure: CI must never pass by skipping Postgres.

PG_URL_VAR = "AGENTMEM_TEST_PG_URL"


def _pg_server_url() -> str | None:
    url = os.environ.get(PG_URL_VAR)
    if not url:
        if os.environ.get("CI"):
            pytest.fail(f"{PG_URL_VAR} is not set under CI: .ci/run must start Postgres")
        pytest.skip(f"no Postgres server: set {PG_URL_VAR}=postgresql://USER@HOST:PORT/postgres")
    return url


def _fresh_pg_database(server_url: str):
    import uuid

    import sqlalchemy as sa

    from store.engine import resolve_url

    name = f"agentmem_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(resolve_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.engine.make_url(resolve_url(server_url)).set(database=name).render_as_string(hide_password=False)
    return admin, name, url


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    """An empty database (no schema) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    admin, name, url = _fresh_pg_database(_pg_server_url())
    yield url
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture
def store(db_url):
    """A migrated store on each backend."""
    from store.engine import make_engine, open_store
    from store.migrations import upgrade

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    s = open_store(db_url)
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One local Ray cluster for the whole test run (it takes seconds to start), 4 logical CPUs and a small
    object store; yields its address. Skips when the ``ray`` extra is not installed."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, object_store_memory=100 * 2**20, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def sqlite_store(tmp_path):
    """A migrated SQLite store, for tests that are not about the backend."""
    from store.engine import make_engine, open_store
    from store.migrations import upgrade

    url = f"sqlite:///{tmp_path / 'agentmem.db'}"
    upgrade(make_engine(url))
    s = open_store(url)
    yield s
    s.dispose()


@pytest.fixture
def stored(sqlite_store, tmp_path):
    """(store, run id, tiny student folder): a scripted rollout with F1 0, 0.8, 0, 0.8, for the SFT job's tests."""
    from job_fixtures import sft_run

    return sft_run(sqlite_store, tmp_path)


@pytest.fixture
def rolled(sqlite_store):
    """(store, run id, policy): a sampled tiny-llama rollout with rewards 0 and 1, for the distill job's tests."""
    from job_fixtures import distill_run

    return distill_run(sqlite_store)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """(database URL, what was seeded, tokenizer folder): the viewer's store, written once, then only read."""
    from view_helpers import seed_view

    return seed_view(tmp_path_factory)


@pytest.fixture
def captured(monkeypatch) -> dict:
    """Every job the CLI starts patched to keep its config under the job's name here and raise
    ``helpers.Called``; no store is opened or checked."""
    from helpers import Called

    seen: dict = {}

    def job(name):
        def fake(store, config, *args, **kwargs):
            seen[name] = config
            raise Called

        return fake

    for name in ("distill", "train", "score", "sft", "rollout", "replay"):
        monkeypatch.setattr(f"agentmem.jobs.{name}.run_{name}", job(name))
    monkeypatch.setattr("store.engine.open_store", lambda *a, **k: None)
    monkeypatch.setattr("cli.common.preflight", lambda *a, **k: None)  # no store to check ids in
    from cli.plan import Plan

    for name in ("agent_plan", "score_plan"):  # no store to read the planned calls and rates from
        monkeypatch.setattr(f"cli.plan.{name}", lambda *a, **k: Plan(None, None, None, ""))
    return seen


@pytest.fixture
def tokenizer_folder(tmp_path) -> str:
    """A model folder with a config and a tokenizer but no weights: an oracle rollout loads only these, and
    anything that loads weights fails."""
    from agentmem.testing.tiny_models import tiny_llama, tiny_tokenizer

    folder = tmp_path / "tokenizer-only"
    tiny_tokenizer().save_pretrained(folder)
    tiny_llama().config.save_pretrained(folder)
    return str(folder)


# ---- markers ---------------------------------------------------------------------------------------
# Besides the marks written on tests (slow, browser, bench_smoke, postgres), two are given here at collection:
# ``postgres`` to every case of the ``db_url`` / ``store`` fixtures' Postgres parameter, and ``subprocess`` to
# every test whose code, or the code of a fixture or helper function it uses (from tests/ or
# agentmem.testing), reaches ``subprocess``, ``multiprocessing`` or a process pool.

SPAWNERS = (subprocess, multiprocessing, concurrent.futures.process)
SPAWNER_NAMES = {"subprocess", "multiprocessing", "Popen", "ProcessPoolExecutor"}
TESTS = Path(__file__).resolve().parent
TESTING = (TESTS, Path(__file__).resolve().parents[1] / "agentmem" / "testing")


def _ours(file: str | None) -> bool:
    """Whether ``file`` is in tests/ or agentmem.testing (whose functions' bodies are searched too)."""
    return file is not None and any(Path(file).resolve().is_relative_to(root) for root in TESTING)


def _spawns(fn, seen: set) -> bool:
    """Whether ``fn``'s code (nested functions and our helpers it names included) names a process spawner."""
    fn = getattr(fn, "__wrapped__", fn)
    if not isinstance(fn, types.FunctionType) or fn in seen or not _ours(fn.__code__.co_filename):
        return False
    seen.add(fn)
    codes, names = [fn.__code__], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    if names & SPAWNER_NAMES:  # also a spawner imported inside the function
        return True
    values = [fn.__globals__.get(name) for name in names]
    ours = [v for v in values if isinstance(v, types.ModuleType) and _ours(getattr(v, "__file__", None))]
    values += [getattr(module, name, None) for module in ours for name in names]  # faults.make_world
    return any(any(v is m for m in SPAWNERS) or (isinstance(v, types.FunctionType) and _spawns(v, seen))
               for v in values)


def pytest_collection_modifyitems(config, items):
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("db_url") == "postgres":
            item.add_marker(pytest.mark.postgres)
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
        seen: set = set()
        if any(_spawns(fn, seen) for fn in (getattr(item, "function", None), *fixtures)):
            item.add_marker(pytest.mark.subprocess)
