"""The catalogue of bad input (docs/reliability.md): every case prints one ``error:`` line, exits 1 and
changes nothing in the store.

Each case runs the real CLI entry point (``cli.app.main``) in this process against a SQLite store that holds
one finished oracle run; the store's every table is read before and after and must be equal.
"""

from __future__ import annotations

import copy
import json
import sqlite3
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentmem.testing.tiny_models import save_tiny, tiny_tokenizer
from cli.app import main
from store.engine import open_store
from store.migrations import downgrade

HOTPOT = [{"_id": "a", "question": "q?", "answer": "x", "type": "bridge", "level": "easy",
           "supporting_facts": [["T", 0]], "context": [["T", ["x is here."]]]}]


def cli(capsys, *args: str) -> tuple[int, list[str]]:
    """(exit code, stderr lines) of ``agentmem ARGS``."""
    capsys.readouterr()
    argv = sys.argv
    sys.argv = ["agentmem", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = argv
    return code, capsys.readouterr().err.strip().splitlines()


def snapshot(db: Path) -> dict[str, list[tuple]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        con.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with one oracle run (sampled by model folder ``a``), data files and model folders."""
    root = tmp_path_factory.mktemp("bad")
    model_a = save_tiny(root / "model_a")
    tok = copy.deepcopy(tiny_tokenizer())
    tok.add_tokens(["<only-in-b>"])
    model_b = root / "model_b"
    save_tiny(model_b)
    tok.save_pretrained(model_b)
    (root / "not_a_model").mkdir()
    (root / "not_a_model" / "README.txt").write_text("weights elsewhere")
    db = root / "store.db"
    (root / "empty.json").write_text("")
    (root / "truncated.json").write_text(json.dumps(HOTPOT)[:-20])
    (root / "missing.json").write_text(json.dumps([{k: v for k, v in HOTPOT[0].items() if k != "context"}]))
    (root / "squad.json").write_text(json.dumps({"version": "1.1", "data": []}))
    (root / "a_folder.db").mkdir()
    old = root / "old.db"
    return {"root": root, "db": db, "model_a": model_a, "model_b": str(model_b), "old": old}


@pytest.fixture(scope="module")
def run_id(world):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "cli.app", "rollout", "--policy", "oracle", "--model", world["model_a"],
                           "--episodes", "2", "--knob", "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens",
                           "24", "--db", str(world["db"])], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rid = proc.stdout.split("run_id=")[1].split()[0]
    open_store(str(world["old"]), create=True).dispose()
    from store.engine import make_engine

    downgrade(make_engine(f"sqlite:///{world['old']}"), "0003")
    # a second run whose id shares a 6-character prefix with ``rid``: ``rid[:6]`` is ambiguous
    con = sqlite3.connect(world["db"])
    con.execute("INSERT INTO runs (id, kind, config, status, created_at) SELECT ?, kind, config, status, created_at "
                "FROM runs WHERE id = ?", (rid[:6] + "0" * (len(rid) - 6), rid))
    con.commit()
    con.close()
    return rid


# (case id, argv with {db} {root} {run} {model_a} {model_b} {old} placeholders, the expected line's start or part)
CASES = [
    ("unreachable-postgres", "runs --db postgresql://postgres@127.0.0.1:1/agentmem", "cannot reach database"),
    ("malformed-url", "runs --db foo://bar",
     "unknown database kind 'foo' in foo://bar: give sqlite:///PATH or postgresql://USER@HOST/DB"),
    ("folder-as-sqlite", "runs --db {root}/a_folder.db", "is a directory, not a SQLite database file"),
    ("missing-database", "runs --db {root}/nothing.db", "no database at"),
    ("read-only-database", "sql --write --db sqlite:///file:{db}?mode=ro&uri=true delete from eval_results",
     "is read-only"),
    ("schema-out-of-date", "runs --db {old}", "is at revision 0003, code expects"),
    ("empty-data-file", "rollout --env hotpotqa --data {root}/empty.json --policy oracle --model {model_a} --db {db}",
     "empty.json: the file is empty"),
    ("truncated-data-file",
     "rollout --env hotpotqa --data {root}/truncated.json --policy oracle --model {model_a} --db {db}",
     "(the file ends early: truncated?)"),
    ("record-missing-field",
     "rollout --env hotpotqa --data {root}/missing.json --policy oracle --model {model_a} --db {db}",
     "missing.json: record 0 (_id 'a'): missing field 'context'"),
    ("another-benchmark-file",
     "rollout --env hotpotqa --data {root}/squad.json --policy oracle --model {model_a} --db {db}",
     "(the file looks like squad data: use --env squad)"),
    ("not-a-model-folder", "rollout --model {root}/not_a_model --db {db}", "is not a model folder"),
    ("vocabulary-mismatch", "score --run {run} --teacher {model_b} --db {db}", "whose vocabulary differs"),
    ("episodes-zero", "rollout --episodes 0 --db {db}", "--episodes: Input should be greater than or equal to 1"),
    ("episodes-negative", "rollout --episodes -2 --db {db}", "--episodes: Input should be greater than or equal to 1"),
    ("negative-temperature", "rollout --sample-temperature -0.5 --db {db}", "--sample-temperature: Input should be greater than or equal to 0"),
    ("group-size-zero", "rollout --group-size 0 --db {db}", "--group-size: Input should be greater than or equal to 1"),
    ("unknown-id", "score --run 0123456789abcdef --teacher {model_a} --db {db}", "no run with id"),
    ("ambiguous-id", "score --run {run6} --teacher {model_a} --db {db}", "is ambiguous"),
    ("write-without-flag", "sql --db {db} delete from runs", "the database is opened read-only; pass --write"),
    ("attach-without-flag", "sql --db {db} attach database '{root}/attached.db' as a",
     "the database is opened read-only; pass --write"),
    ("vacuum-into-without-flag", "sql --db {db} vacuum into '{root}/vacuumed.db'",
     "the database is opened read-only; pass --write"),
    ("pragma-write-without-flag", "sql --db {db} pragma journal_mode=delete",
     "the database is opened read-only; pass --write"),
    ("query-only-off-without-flag", "sql --db {db} pragma query_only=OFF",
     "the database is opened read-only; pass --write"),
    ("load-extension-without-flag", "sql --db {db} select load_extension('{root}/ext')",
     "the database is opened read-only; pass --write"),
    ("sql-syntax-error", "sql --db {db} selec * from runs", "syntax error"),
    ("unknown-memory-option", "rollout --memory-option nope=1 --policy oracle --model {model_a} --db {db}",
     "memory policy 'overwrite': bad --memory-option (nope: unknown option); known: none"),
]

# The cases wrong in the command line itself (exit code 2); the others are found in the world (exit code 1).
USAGE = {"episodes-zero", "episodes-negative", "negative-temperature", "group-size-zero", "unknown-memory-option",
         "malformed-url"}


def _argv(template: str, world, run: str) -> list[str]:
    head, _, sql = template.partition(" --db ")
    fill = {"db": str(world["db"]), "root": str(world["root"]), "run": run, "run6": run[:6],
            "model_a": world["model_a"], "model_b": world["model_b"], "old": str(world["old"])}
    if template.startswith("sql"):
        # sql FLAGS --db URL STATEMENT...: the statement is one argument
        db, _, statement = sql.partition(" ")
        return [*head.format(**fill).split(), "--db", db.format(**fill), statement.format(**fill)]
    return [*template.format(**fill).split()]


@pytest.mark.parametrize(("case", "template", "needle"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_changes_nothing(capsys, world, run_id, case, template, needle):
    before = snapshot(world["db"])
    code, lines = cli(capsys, *_argv(template, world, run_id))
    assert code == (2 if case in USAGE else 1), (case, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert snapshot(world["db"]) == before
    for made in ("nothing.db", "attached.db", "vacuumed.db"):  # a refused statement creates no file
        assert not (world["root"] / made).exists(), made


# Read-only SQL on both backends: each statement is refused with the same line and changes nothing.
READ_ONLY_SQL = ["delete from runs", "insert into runs (id, kind, config, status, created_at) "
                 "select id || 'x', kind, config, status, created_at from runs", "drop table runs",
                 "create table extra (a integer)"]


@pytest.mark.postgres
@pytest.mark.parametrize("statement", READ_ONLY_SQL, ids=["delete", "insert", "drop", "create"])
def test_sql_without_write_is_refused_on_both_backends(capsys, store, statement):
    url = store.url
    with store.session() as s:
        before = s.execute(sa.text("select id, status from runs")).all()
    code, lines = cli(capsys, "sql", "--db", url, statement)
    assert (code, lines) == (1, ["error: SQL failed: the database is opened read-only; pass --write to change it"])
    code, lines = cli(capsys, "sql", "--db", url, "select count(*) as n from runs")
    assert code == 0
    with store.session() as s:
        assert s.execute(sa.text("select id, status from runs")).all() == before


# Each environment's data file is read and its shape checked before anything is written: a run row, the default
# database file or its lock file. (needle's file is any plain text: it is broken when empty or not UTF-8.)
BROKEN = {"not-json": '{"a": [1, 2', "wrong-shape": '{"a": 1}'}
BROKEN_TEXT = {"empty": "", "not-utf8": b"\xff\xfe\x00text"}


def _broken_cases() -> list[tuple[str, str]]:
    from envs import env_names

    return [(env, kind) for env in env_names() if env != "synthetic"
            for kind in (BROKEN_TEXT if env == "needle" else BROKEN)]


@pytest.mark.parametrize(("env", "kind"), _broken_cases())
@pytest.mark.parametrize("job", ["rollout", "eval"])
def test_a_broken_data_file_creates_nothing(capsys, monkeypatch, tmp_path, job, env, kind):
    content = {**BROKEN, **BROKEN_TEXT}[kind]
    data = tmp_path / "data.json"
    data.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTMEM_DB", raising=False)
    code, lines = cli(capsys, job, "--env", env, "--data", "data.json", "--device", "cpu")
    assert (code, len(lines)) == (1, 1), lines
    assert lines[0].startswith("error: data.json: "), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]  # no agentmem.db, no agentmem.db.lock


# Stored rows a job cannot read or train on (another schema's values, broken arrays, a reward stored before the
# store checked its bounds): (case, SQL that writes the row, the line's part). sft died on the first with a
# 60-line traceback (`ValueError: rewards must be finite`) and left a `failed` run behind.
BAD_ROWS = [
    ("infinite-reward", "UPDATE episodes SET reward = 1e999 WHERE run_id = '{run}'", "has reward inf, not a finite"),
    ("f1-above-one", "UPDATE episodes SET f1 = 7 WHERE run_id = '{run}'", "has f1 7.0, outside [0, 1]"),
    ("unknown-status", "UPDATE episodes SET status = 'paused' WHERE run_id = '{run}'",
     "has status 'paused', which this version does not read"),
    ("unknown-finish-reason", "UPDATE invocations SET finish_reason = 'weird'",
     "has finish_reason 'weird', which this version does not read"),
    ("broken-ids", "UPDATE invocations SET output_ids = x'010203'", "output_ids holds 3 bytes, not whole"),
]


@pytest.mark.parametrize(("case", "statement", "needle"), BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
@pytest.mark.parametrize("job", ["sft", "distill", "score", "export"])
def test_a_bad_stored_row_is_one_line_naming_run_and_row(capsys, world, run_id, tmp_path, job, case, statement,
                                                         needle):
    import shutil

    db = tmp_path / "store.db"
    shutil.copy(world["db"], db)
    con = sqlite3.connect(db)
    con.execute(statement.format(run=run_id))
    con.commit()
    con.close()
    before = snapshot(db)
    model = world["model_a"]
    argv = {"sft": ["sft", "--run", run_id, "--student", model, "--steps", "1"],
            "distill": ["distill", "--run", run_id, "--student", model, "--teacher", model, "--steps", "1"],
            "score": ["score", "--run", run_id, "--teacher", model],
            "export": ["export", "--run", run_id, "--out", str(tmp_path / "calls.parquet")]}[job]
    code, lines = cli(capsys, *argv, "--out" if job in ("sft", "distill") else "--db",
                      *([str(tmp_path / "ckpt"), "--db"] if job in ("sft", "distill") else []), str(db))
    assert (code, len(lines)) == (1, 1), lines
    assert lines[0].startswith(f"error: run {run_id}: ") and needle in lines[0], lines[0]
    assert lines[0].endswith("fix the row (agentmem sql --write) or leave its run out")
    assert snapshot(db) == before  # no run row, no score, nothing
    assert not (tmp_path / "calls.parquet").exists() and not (tmp_path / "ckpt").exists()
