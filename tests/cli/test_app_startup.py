"""A bad id, a missing data file, a wrong model, an unknown knob, memory policy or option, an environment's
missing (or needless) data file, a bad database URL or a config file's misspelt key answers before torch,
transformers or datasets load: each case runs the real CLI entry point in one fresh interpreter, in order,
and records which heavy modules each case imported and how long it took. ``agentmem --help`` and every command's
``--help`` load none of them either.

The seconds are printed (``pytest -s``) for the record; the assertion is on the imports, which is what makes
an error slow (torch and transformers take 2-10 s to import, the rest of the CLI path well under 1 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from store.engine import open_store

HEAVY = ("torch", "transformers", "datasets")
REPO = Path(__file__).resolve().parents[2]

COMMANDS = ["rollout", "replay-audit", "worker", "score", "distill", "sft", "eval", "train", "export", "sql",
            "runs", "show", "report", "view", "memories", "models", "db", "config show train", "config schema"]

# (case, argv after `agentmem`, part of the one error line)
ERRORS = [
    ("score-unknown-run", "score --run 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("score-unknown-teacher", "score --run {run} --teacher ./no_such_model --db {db}", "does not exist"),
    ("rollout-missing-data", "rollout --env hotpotqa --data {root}/nope.json --db {db}", "nope.json: no such file"),
    ("rollout-bad-resume", "rollout --resume 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("rollout-bad-model", "rollout --model ./no_such_model --db {db}", "does not exist"),
    ("distill-unknown-run", "distill --run 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("distill-bad-resume", "distill --resume 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("sft-unknown-run", "sft --run 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("sft-bad-resume", "sft --resume {run} --db {db}", "is a rollout run, not a sft run"),
    ("eval-bad-model", "eval --model ./no_such_model --db {db}", "does not exist"),
    ("eval-missing-data", "eval --env hotpotqa --data {root}/nope.json --db {db}", "nope.json: no such file"),
    ("train-bad-resume", "train --resume 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("worker-unknown-run", "worker --run 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("export-unknown-run", "export --run 0123456789ab --out {root}/x.parquet --db {db}", "no run with id"),
    ("memories-unknown-run", "memories build --run 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    ("rollout-missing-config", "rollout --config {root}/nope.yaml --db {db}", "nope.yaml: no such file"),
    ("train-bad-config-field", "config show train --rounds 0", "--rounds: Input should be greater than or equal to 1"),
    ("replay-unknown-run", "rollout --replay-from 0123456789ab --db {db}", "no run with id '0123456789ab'"),
    # the checks of an environment, a memory policy and a database URL, before any model
    ("rollout-unknown-knob", "rollout --knob nosuch=3 --db {db}", "synthetic: unknown knob(s) nosuch; known: "),
    ("rollout-unknown-memory", "rollout --memory nosuch --db {db}", "unknown memory policy 'nosuch'; known: "),
    ("rollout-unknown-memory-option", "rollout --memory-option foo=bar --db {db}",
     "memory policy 'overwrite': bad --memory-option (foo: unknown option); known: none"),
    ("rollout-env-needs-data", "rollout --env hotpotqa --db {db}", "hotpotqa: needs a data file: give --data FILE"),
    ("rollout-env-takes-no-data", "rollout --env synthetic --data {db} --db {db}",
     "synthetic: takes no data file (--data)"),
    ("eval-env-needs-data", "eval --env squad --db {db}", "squad: needs a data file: give --data FILE"),
    ("train-env-needs-data", "train --env hotpotqa --db {db}", "hotpotqa: needs a data file: give --data FILE"),
    ("eval-unknown-knob", "eval --knob nosuch=3 --db {db}", "synthetic: unknown knob(s) nosuch"),
    ("rollout-unknown-database-kind", "rollout --db bogus://x",
     "unknown database kind 'bogus' in bogus://x: give sqlite:///PATH or postgresql://USER@HOST/DB"),
    ("rollout-sqlite-missing-folder", "rollout --db {root}/no_folder/a.db",
     "no_folder/a.db': its folder does not exist"),
    ("sft-db-missing-folder", "sft --run {run} --db {root}/no_folder/a.db", "no_folder/a.db': its folder does not exist"),
    ("sft-without-run", "sft --db {db}", "--run is required"),
    ("rollout-config-unknown-key", "rollout --config {root}/typo.yaml --db {db}",
     "typo.yaml, line 3: unknown key agent.memory_tokns (did you mean agent.memory_tokens?)"),
]
# The cases wrong in the command line itself (exit code 2); the others are found in the world: a missing file,
# run, model or database folder (exit code 1).
USAGE = {"train-bad-config-field", "rollout-unknown-knob", "rollout-unknown-memory", "rollout-unknown-memory-option",
         "rollout-env-needs-data", "rollout-env-takes-no-data", "eval-env-needs-data", "train-env-needs-data",
         "eval-unknown-knob", "sft-without-run", "rollout-config-unknown-key", "rollout-unknown-database-kind"}

# Runs in the fresh interpreter: each case calls ``cli.app.main`` and reports exit code, stderr, seconds and
# the heavy modules that appeared during it.
PROBE = r"""
import contextlib, io, json, sys, time
HEAVY = {heavy!r}
out = []
t0 = time.perf_counter()
from cli.app import main
base = time.perf_counter() - t0
for case, argv in json.loads(sys.argv[1]):
    before = {{m for m in HEAVY if m in sys.modules}}
    err, std = io.StringIO(), io.StringIO()
    sys.argv = ["agentmem", *argv]
    t = time.perf_counter()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    seconds = time.perf_counter() - t
    new = sorted({{m for m in HEAVY if m in sys.modules}} - before)
    out.append({{"case": case, "code": code, "err": err.getvalue(), "seconds": seconds, "heavy": new}})
print(json.dumps({{"import_seconds": base, "cases": out}}))
"""


def probe(cases: list[tuple[str, list[str]]], cwd: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), json.dumps(cases)], cwd=cwd,
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    db = root / "store.db"
    store = open_store(str(db), create=True)
    from agentmem.records import Episode, Invocation, Run, RunKind
    from store import repository as repo

    run = Run(kind=RunKind.rollout, config={})
    with store.session() as s:
        repo.start_run(s, run)
        ep = Episode(run_id=run.id, env="synthetic", task_id="t", question="q?", gold_answers=["a"])
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, [Invocation(episode_id=ep.id, step=0, kind="answer", prompt_ids=[1, 2],
                                               output_ids=[3], output_logprobs=[-0.5], prompt_text="p",
                                               output_text="a")])
        s.commit()
    store.dispose()
    (root / "typo.yaml").write_text("episodes: 2\nagent:\n  memory_tokns: 3\n")
    return {"root": root, "db": db, "run": run.id}


def test_help_loads_no_heavy_module(world):
    cases = [("--help", ["--help"])] + [(c, [*c.split(), "--help"]) for c in COMMANDS]
    result = probe(cases, world["root"])
    print(f"\nimport cli.app: {result['import_seconds']:.2f} s")
    for r in result["cases"]:
        print(f"agentmem {r['case'].removeprefix('--help')} --help: {r['seconds']:.2f} s")
        assert r["code"] == 0, r
        assert r["heavy"] == [], r
    assert result["import_seconds"] < 5.0  # under 1 s on an idle machine; a loaded CI box gets slack


def test_bad_input_answers_before_heavy_imports(world):
    fill = {"db": str(world["db"]), "root": str(world["root"]), "run": world["run"]}
    cases = [(case, template.format(**fill).split()) for case, template, _ in ERRORS]
    result = probe(cases, world["root"])
    needles = {case: needle for case, _, needle in ERRORS}
    for r in result["cases"]:
        print(f"{r['case']}: {r['seconds']:.2f} s")
        lines = r["err"].strip().splitlines()
        assert r["code"] == (2 if r["case"] in USAGE else 1), r
        assert len(lines) == 1 and lines[0].startswith("error: ") and needles[r["case"]] in lines[0], r
        assert r["heavy"] == [], r
        assert r["seconds"] < 5.0, r  # under 1.5 s on an idle machine; a loaded CI box gets slack
