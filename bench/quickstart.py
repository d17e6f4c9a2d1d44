"""The README's two learning paths, measured: does a new user who runs the README's three commands see learning?

It runs exactly the README's commands (``README_COMMANDS``, checked against README.md by
tests/bench/test_quickstart.py) through the ``agentmem`` command line, each in its own process as a user would, on the
default model, in a fresh folder (``WORK/agentmem.db``, ``WORK/checkpoints``):

  agentmem rollout --policy oracle --episodes 64 --level 2          # run_id=ORACLE
  agentmem sft --run ORACLE                                         # checkpoint=CKPT
  agentmem eval --model CKPT --env synthetic --level 2 --episodes 64

and evaluates the base model on the same held-out tasks (``eval --model default``, the same flags and seed),
then prints the paired difference of the per-task F1 (the checkpoint's minus the base's) with a bootstrap 95%
interval that resamples the tasks (``envs.metrics.cluster_bootstrap``). The last line:
``base_f1= sft_f1= gain= gain_lo= gain_hi= minutes=`` (minutes: the wall time of the four commands, model
loads included; the base model's evaluation is not one of them). ``WORK/quickstart.json`` keeps every figure and
each command's wall time; ``--resume`` goes on in the folder of a killed run.

With ``--real``, the README's path onto real text (``REAL_COMMANDS``): the oracle's calls on SQuAD v1.1's gold
paragraphs, ``sft``, then ``eval`` on HotpotQA's two gold paragraphs, against the base model on the same questions.
It reads the official dev files (``--squad``, ``--hotpot``; default: ``../shared/data``'s copies, the first 103
HotpotQA questions), and its last line is the same keys.

  .venv/bin/python -m bench.quickstart --work quickstart          # about 12 min on 2 idle cores (docs/benchmarks.md)
  .venv/bin/python -m bench.quickstart --real --work quickstart-real
  .venv/bin/python -m bench.quickstart --smoke --work /tmp/qs     # every command on a tiny model, in seconds
  .venv/bin/python -m bench.quickstart --real --smoke --work /tmp/qsr
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# the README's learning path, word for word (the placeholders are the ids the commands before print)
README_COMMANDS = (
    "agentmem rollout --policy oracle --episodes 64 --level 2",
    "agentmem sft --run ORACLE_RUN",
    "agentmem eval --model CHECKPOINT --env synthetic --level 2 --episodes 64",
)
# the README's path onto real text (the files as a user downloads them; DATA_FILES maps them to this run's)
REAL_COMMANDS = (
    "agentmem rollout --env squad --data path/to/dev-v1.1.json --knob docs=1 --policy oracle --episodes 64",
    "agentmem sft --run ORACLE_RUN",
    "agentmem eval --model CHECKPOINT --env hotpotqa --data path/to/hotpot_dev_distractor_v1.json --knob docs=2 "
    "--episodes 64",
)
DATA_FILES = {"path/to/dev-v1.1.json": "squad", "path/to/hotpot_dev_distractor_v1.json": "hotpot"}
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SHARED_FILES = {"squad": SHARED / "squad" / "dev-v1.1.json",
                "hotpot": SHARED / "hotpotqa" / "hotpot_dev_distractor_v1_first103.json"}
# what the README's commands are in --smoke: the same commands on a tiny random model, a few tasks, one step
SMOKE_SIZES = {"--episodes": "3"}


def agentmem() -> list[str]:
    """The command line a user runs: the ``agentmem`` script beside this interpreter (a venv's), else the module."""
    script = Path(sys.executable).with_name("agentmem")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.app"]


def command(line: str, smoke: bool, model: str | None, files: dict[str, str] | None = None, **ids: str) -> list[str]:
    """A README command as argv: its placeholders filled with ``ids`` and its data files with ``files`` (a
    ``DATA_FILES`` kind -> path); in --smoke, the tiny ``model`` given and the sizes cut."""
    args = line.split()[1:]
    args = [ids.get(a, a) for a in args]
    args = [(files or {}).get(DATA_FILES[a], a) if a in DATA_FILES else a for a in args]
    if smoke:
        args = [SMOKE_SIZES.get(args[i - 1], a) if i else a for i, a in enumerate(args)]
        if args[0] == "rollout":
            args += ["--model", model or ""]
        elif args[0] == "sft":
            args += ["--student", model or "", "--steps", "1"]
    return args


def run(args: list[str], work: Path, log: list[dict]) -> str:
    """Run one ``agentmem`` command in ``work``; its stdout (stderr goes to the terminal: the bars, the notes)."""
    started = time.perf_counter()
    env = {**os.environ, "AGENTMEM_DB": f"sqlite:///{work / 'agentmem.db'}"}
    print("$ agentmem " + " ".join(args), flush=True)
    proc = subprocess.run(agentmem() + args, cwd=work, env=env, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    sys.stdout.write(proc.stdout)
    log.append({"command": "agentmem " + " ".join(args), "seconds": round(seconds, 1)})
    if proc.returncode:
        raise SystemExit(f"agentmem {args[0]} exited {proc.returncode}")
    print(f"  ({seconds:.0f} s)", flush=True)
    return proc.stdout


def printed(key: str, out: str) -> str:
    """The value of the first ``key=VALUE`` a command printed."""
    match = re.search(rf"(?:^|\s){key}=(\S+)", out)
    if not match:
        raise SystemExit(f"no {key}= in the command's output:\n{out}")
    return match.group(1)


def finished(db: Path, kind: str, **config: str) -> tuple[str, float] | None:
    """(id, wall seconds) of the latest finished ``kind`` run of ``db`` whose config has ``config``'s values, or
    None: a step a killed benchmark already did (``--resume``)."""
    if not db.exists():
        return None
    where = "".join(f" and json_extract(config, '$.{k}') = ?" for k in config)
    with sqlite3.connect(db) as con:
        row = con.execute("select id, (julianday(finished_at) - julianday(created_at)) * 86400 from runs "
                          f"where kind = ? and status = 'finished'{where} order by created_at desc limit 1",
                          (kind, *config.values())).fetchone()
    return None if row is None else (row[0], float(row[1]))


def last_checkpoint(db: Path, run_id: str) -> str:
    with sqlite3.connect(db) as con:
        return con.execute("select id from checkpoints where run_id = ? order by step desc limit 1",
                           (run_id,)).fetchone()[0]


def step(line: list[str], key: str, work: Path, log: list[dict], done: tuple[str, float] | None) -> str:
    """Run one command and return the ``key=`` value it printed, or take ``done``'s run (``--resume``)."""
    if done is None:
        return printed(key, run(line, work, log))
    print(f"$ agentmem {' '.join(line)}  (done before: {done[0]}, {done[1]:.0f} s of run time)", flush=True)
    log.append({"command": "agentmem " + " ".join(line), "seconds": round(done[1], 1), "resumed": True})
    return done[0]


def f1_by_task(db: Path, run_id: str) -> dict[str, float]:
    with sqlite3.connect(db) as con:
        rows = con.execute("select task_id, coalesce(f1, 0) from episodes where run_id = ?", (run_id,)).fetchall()
    return {task: float(f1) for task, f1 in rows}


def smoke_files(folder: Path) -> dict[str, str]:
    """Three SQuAD and three HotpotQA questions in their official layouts, for ``--real --smoke``."""
    squad = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": f"{name} lives in {city}. The weather there is mild.",
         "qas": [{"id": f"s{i}", "question": f"Where does {name} live?",
                  "answers": [{"text": city, "answer_start": len(f"{name} lives in ")}]}]}
        for i, (name, city) in enumerate([("Ana", "Oslo"), ("Bo", "Lima"), ("Cy", "Rome")])]}]}
    hotpot = [{"_id": f"h{i}", "question": f"Where was {name} born?", "answer": city, "type": "bridge",
               "level": "easy", "supporting_facts": [[name, 0], [city, 0]],
               "context": [[name, [f"{name} was born in {city}."]], [city, [f"{city} is a city."]]]}
              for i, (name, city) in enumerate([("Dee", "Kyiv"), ("Eli", "Riga"), ("Fay", "Bern")])]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dev-v1.1.json").write_text(json.dumps(squad))
    (folder / "hotpot.json").write_text(json.dumps(hotpot))
    return {"squad": str(folder / "dev-v1.1.json"), "hotpot": str(folder / "hotpot.json")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="quickstart", help="a fresh folder for the database and checkpoints")
    parser.add_argument("--smoke", action="store_true", help="every command on a tiny random model, a few tasks")
    parser.add_argument("--real", action="store_true", help="the README's path onto real text (REAL_COMMANDS)")
    parser.add_argument("--squad", help="SQuAD v1.1's dev-v1.1.json (default: ../shared/data's)")
    parser.add_argument("--hotpot", help="HotpotQA's hotpot_dev_distractor_v1.json (default: ../shared/data's copy)")
    parser.add_argument("--resume", action="store_true",
                        help="go on in a --work folder a killed run left: each command whose run finished there is "
                             "taken (its stored run time counted), the others run")
    args = parser.parse_args()
    from envs.metrics import cluster_bootstrap

    work = Path(args.work).resolve()
    db = work / "agentmem.db"
    if db.exists() and not args.resume:
        raise SystemExit(f"{work} holds a database already: give a fresh --work folder, or --resume")
    work.mkdir(parents=True, exist_ok=True)
    model = None
    if args.smoke:
        from agentmem.testing.tiny_models import save_tiny

        model = save_tiny(work / "tiny")
    files = None
    if args.real:
        files = smoke_files(work / "data") if args.smoke else {
            kind: str(Path(given or SHARED_FILES[kind]).resolve()) for kind, given in (("squad", args.squad),
                                                                                       ("hotpot", args.hotpot))}
        missing = [path for path in files.values() if not Path(path).is_file()]
        if missing:
            raise SystemExit(f"no such file: {', '.join(missing)} (give --squad and --hotpot: the official dev files)")
    log: list[dict] = []
    rollout, sft, evaluate = REAL_COMMANDS if args.real else README_COMMANDS
    oracle = step(command(rollout, args.smoke, model, files), "run_id", work, log,
                  finished(db, "rollout", policy="oracle"))
    done = finished(db, "sft", out="checkpoints")  # the README's (sft's default folder)
    ckpt = step(command(sft, args.smoke, model, files, ORACLE_RUN=oracle), "checkpoint", work, log,
                done and (last_checkpoint(db, done[0]), done[1]))
    trained = step(command(evaluate, args.smoke, model, files, CHECKPOINT=ckpt), "run_id", work, log,
                   finished(db, "eval", model=ckpt))
    minutes = sum(c["seconds"] for c in log) / 60  # the README's three commands
    base_model = model or "default"
    base = step(command(evaluate, args.smoke, model, files, CHECKPOINT=base_model), "run_id", work, log,
                finished(db, "eval", model=base_model))
    before, after = f1_by_task(db, base), f1_by_task(db, trained)
    if not before or sorted(before) != sorted(after):
        raise SystemExit("the two evaluations read different tasks: not a paired comparison")
    tasks = sorted(before)
    a, b = np.array([[after[t] for t in tasks]]), np.array([[before[t] for t in tasks]])
    gain, lo, hi = cluster_bootstrap({"heldout": a}, {"heldout": b})
    figures = {"base_f1": float(b.mean()), "sft_f1": float(a.mean()), "gain": gain, "gain_lo": lo, "gain_hi": hi,
               "minutes": minutes}
    (work / "quickstart.json").write_text(json.dumps({**figures, "tasks": len(tasks), "checkpoint": ckpt,
                                                      "commands": log, "smoke": args.smoke, "real": args.real,
                                                      "files": files}, indent=2) + "\n")
    size = sum(p.stat().st_size for p in (work / "checkpoints").rglob("*") if p.is_file()) / 1e9
    print(f"{len(tasks)} held-out tasks; checkpoints on disk: {size:.2f} GB in {work / 'checkpoints'}")
    if args.smoke:
        shutil.rmtree(work / "checkpoints", ignore_errors=True)
    print(" ".join(f"{k}={v:.3f}" if k != "minutes" else f"{k}={v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
