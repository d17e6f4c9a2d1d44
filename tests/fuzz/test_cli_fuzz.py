"""The command line and its `--config` files under property-based input (Hypothesis): every job command's flags
(read from the command itself: its options, their choices, flags that do not exist, values of every kind) and
config files of random keys, types and nesting, in YAML and TOML, whole or cut short.

Each run of `cli.app.main` (in this process, the jobs themselves patched to stop where they would begin) ends in
one of: the job is reached; exit 0 (help, a command that only reads); or exactly one `error:` line with exit code 2
for a command line (or config file) that is wrong and 1 for a world that disagrees, never a traceback, and then
nothing left behind: no run row, no file. An unknown flag is always exit 2 naming it; a config file's error names
the file."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
import typer
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from agentmem.config import AgentConfig, RolloutConfig
from agentmem.jobs.rollout import run_rollout
from agentmem.testing.tiny_models import save_tiny
from cli.app import app, main
from store.engine import open_store

JOBS = {"rollout": ("rollout", "run_rollout"), "eval": ("eval", "run_eval"), "score": ("score", "run_score"),
        "distill": ("distill", "run_distill"), "sft": ("sft", "run_sft"), "train": ("train", "run_train")}
PATCHED = [*(f"agentmem.jobs.{m}.{f}" for m, f in JOBS.values()), "agentmem.jobs.rollout.run_replay",
           "agentmem.jobs.replay.run_replay", "agentmem.jobs.eval.run_sweep", "agentmem.jobs.export.run_export",
           "agentmem.jobs.ray_train.fit"]  # distill --ray: the group Ray Train would start
UNKNOWN = "--no-such-flag"
# examples per command: the CLI checks a job's inputs (its model's tokenizer, its tasks) in about a second, so the
# fast tier fuzzes one job's flags and one job's config files a little, the slow tier every job more
FAST, SLOW = 8, 40


class Reached(Exception):
    """A patched job was called: the command line and everything checked before it passed."""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A SQLite store with one finished oracle run of a tiny model (whose folder is given as every model)."""
    root = tmp_path_factory.mktemp("cli-fuzz")
    model = save_tiny(root / "tiny")
    url = f"sqlite:///{root / 'store.db'}"
    store = open_store(url, create=True)
    run = run_rollout(store, RolloutConfig(model=model, policy="oracle", env_knobs={"level": 1}, chunk_tokens=48,
                                           episodes=2, agent=AgentConfig(memory_tokens=16, answer_max_new_tokens=4)))
    store.dispose()
    return {"root": root, "model": model, "url": url, "db": root / "store.db", "run": run.run_id}


def _command(name: str):
    group = typer.main.get_command(app)
    return group.commands[name]


def values(world, option) -> st.SearchStrategy[str]:
    """What a flag may be given: its choices, numbers at and past their ranges, ids and paths of this world, text."""
    choices = [m.value for m in option.bare_type] if isinstance(option.bare_type, type) and issubclass(
        option.bare_type, enum.Enum) else []
    anything = st.sampled_from(["0", "1", "-1", "3", "0.5", "-2.5", "1e999", "nan", "10000000000000000000000", "",
                                "x", "default", "none", "a=b", "KEY=1", "hops=3", "level=9", "ü", "../nowhere",
                                "a,b", "true", world["run"], world["run"][:6], world["model"], str(world["db"])])
    return st.one_of(st.sampled_from(choices), anything) if choices else anything


def argv(world, name: str) -> st.SearchStrategy[list[str]]:
    """A command line of job ``name``: some of its options with values (flags alone), maybe an unknown flag or a
    stray argument, always on this world's store."""
    options = [p for p in _command(name).params if p.opts and not p.hidden and p.name not in ("db", "help")
               and "--help" not in p.opts and p.name not in ("help_all", "config", "report_to", "fsdp")]

    def option(p) -> st.SearchStrategy[list[str]]:
        flag = st.sampled_from(list(p.opts) + list(getattr(p, "secondary_opts", []) or []))
        if p.is_flag:
            return flag.map(lambda f: [f])
        return st.tuples(flag, values(world, p)).map(list)

    picked = st.lists(st.sampled_from(options), max_size=4, unique_by=lambda p: p.name).flatmap(
        lambda ps: st.tuples(*[option(p) for p in ps]) if ps else st.just(()))
    extra = st.sampled_from([[], [], [], [UNKNOWN, "1"], ["stray"]])
    return st.tuples(picked, extra).map(lambda t: [name, *[x for part in t[0] for x in part], *t[1],
                                                   "--db", world["url"]])


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm", ".lock"))}


def runs(db: Path) -> int:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM runs")).scalar_one())
    finally:
        engine.dispose()


def run_cli(capsys, args: list[str]) -> tuple[str, int | None, list[str]]:
    """(outcome, exit code, stderr lines): outcome ``reached``, ``exit`` or the name of any other exception."""
    capsys.readouterr()
    old, sys.argv = sys.argv, ["agentmem", *args]
    try:
        main()
        outcome, code = "exit", 0
    except Reached:
        outcome, code = "reached", None
    except SystemExit as exc:
        outcome, code = "exit", exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # noqa: BLE001  a traceback: what the property forbids
        outcome, code = f"{type(exc).__name__}: {exc}", None
    finally:
        sys.argv = old
    return outcome, code, capsys.readouterr().err.strip().splitlines()


def check(world, capsys, args: list[str]) -> tuple[int | None, list[str]]:
    before_files, before_runs = files(world["root"]), runs(world["db"])
    outcome, code, lines = run_cli(capsys, args)
    assert outcome in ("reached", "exit"), (args, outcome, lines[-5:])
    assert not any("Traceback" in line for line in lines), (args, lines)
    if code:
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
        assert code in (1, 2), (args, code, lines)
        assert runs(world["db"]) == before_runs, args  # no run row left behind
        assert files(world["root"]) == before_files, (args, files(world["root"]) - before_files)  # nor a file
    if UNKNOWN in args:
        assert code == 2 and UNKNOWN in lines[0], (args, lines)
    return code, lines


@pytest.fixture
def patched(monkeypatch, world):
    def reached(*_args, **_kwargs):
        raise Reached

    for target in PATCHED:
        module, _, name = target.rpartition(".")
        monkeypatch.setattr(f"{module}.{name}", reached, raising=False)
    monkeypatch.chdir(world["root"])
    monkeypatch.setenv("AGENTMEM_DB", world["url"])
    monkeypatch.delenv("AGENTMEM_DEBUG", raising=False)


def tiers(jobs: list[str], fast: str) -> list:
    return [pytest.param(job, FAST, id=f"{job}-fast") for job in [fast]] + [
        pytest.param(job, SLOW, marks=pytest.mark.slow, id=job) for job in jobs]


@pytest.mark.parametrize(("job", "examples"), tiers(sorted(JOBS), "score"))
def test_every_flag_of_a_job_ends_in_one_line_or_the_job(world, capsys, patched, job, examples):
    @seed(0)
    @settings(max_examples=examples, database=None, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(argv(world, job))
    def run(args: list[str]) -> None:
        check(world, capsys, args)

    run()


# ---- config files ---------------------------------------------------------------------------------------------

KEYS = ["episodes", "seed", "env", "agent", "memory_tokens", "temperature", "optim", "lr", "steps", "teacher",
        "model", "run_ids", "loss", "epsiodes", "agent.memory_tokens", "", "x y", "1"]
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**20), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(["", "x", "default", "1e999", "synthetic", "aligned"]))
CONFIGS = st.recursive(LEAVES, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                      st.dictionaries(st.sampled_from(KEYS), kids, max_size=4)),
                       max_leaves=8)


def toml_of(data) -> str:
    """``data`` (a mapping) as TOML, leaves as JSON values (TOML's own for these): nested mappings as tables."""
    lines, tables = [], []
    for key, value in (data or {}).items() if isinstance(data, dict) else []:
        if isinstance(value, dict):
            tables.append((key, value))
        elif value is not None:
            lines.append(f'"{key}" = {json.dumps(value)}')
    for key, table in tables:
        lines.append(f'["{key}"]')
        lines += [f'"{k}" = {json.dumps(v)}' for k, v in table.items() if v is not None and not isinstance(v, dict)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("job", "examples"), tiers(["rollout", "distill", "sft", "train"], "sft"))
def test_a_config_file_of_any_content_ends_in_one_line_or_the_job(world, capsys, patched, job, examples):
    """Random keys, types and nesting, YAML and TOML, whole or cut short: the job, or one line naming the file
    (exit 2: a config file is part of the command line)."""

    @seed(0)
    @settings(max_examples=examples, database=None, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(CONFIGS, st.sampled_from(["yaml", "toml"]), st.integers(0, 3), st.integers(0, 10_000))
    def run(data, kind: str, damage: int, at: int) -> None:
        text = yaml.safe_dump(data) if kind == "yaml" else toml_of(data)
        if damage == 1:
            text = text[: at % (len(text) + 1)]  # cut short
        elif damage == 2:
            text = text.replace(":", ": :", 1) if kind == "yaml" else text.replace("=", "= =", 1)
        path = world["root"] / f"fuzz.{kind}"
        path.write_text(text)
        try:
            for args in (["config", "show", job, "--config", str(path)], [job, "--config", str(path)]):
                code, lines = check(world, capsys, [*args, "--db", world["url"]] if args[0] == job else args)
                if code and ("--config" in lines[0] or str(path) in lines[0]):  # the file's error names it
                    assert code == 2 and lines[0].startswith(f"error: --config {path}"), (text, lines)
        finally:
            path.unlink()

    run()
