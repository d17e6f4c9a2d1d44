"""Length sweeps: `agentmem eval --docs N,M` / `--sweep KNOB=V1,V2` evaluate one model at each length,
one eval run and one eval_results row per value, each equal to a plain evaluation at that value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentmem.config import AgentConfig, EvalConfig
from agentmem.errors import ConfigError
from agentmem.jobs.eval import sweep_configs
from agentmem.testing.tiny_models import save_tiny

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}


def config(**knobs) -> EvalConfig:
    return EvalConfig(model="tiny", episodes=2, chunk_tokens=48, env_knobs={"distractors": 1, **knobs},
                      agent=AgentConfig(memory_tokens=8, answer_max_new_tokens=4, temperature=0.0, seed=1000))


def test_sweep_configs_set_the_knob_in_order_and_keep_the_rest():
    configs = sweep_configs(config(), "context_tokens", [300, 100])
    assert [c.env_knobs for c in configs] == [{"distractors": 1, "context_tokens": 300},
                                              {"distractors": 1, "context_tokens": 100}]
    assert {c.model_dump_json(exclude={"env_knobs"}) for c in configs} == {config().model_dump_json(exclude={"env_knobs"})}
    assert [c.env_knobs for c in sweep_configs(config(context_tokens=100), "context_tokens", [100])] == [
        {"distractors": 1, "context_tokens": 100}]


@pytest.mark.parametrize("knob, values, message", [
    ("docs", [50, 100], "environment 'synthetic' has no knob 'docs' to sweep; its knobs: "),
    ("context_tokens", [], "needs at least one value"),
    ("context_tokens", [100, 200, 100], r"repeats a value: \[100, 200, 100\]"),
])
def test_sweep_configs_refuse_bad_sweeps(knob, values, message):
    with pytest.raises(ConfigError, match=message):
        sweep_configs(config(), knob, values)


def test_a_swept_knob_also_fixed_to_another_value_is_refused():
    with pytest.raises(ConfigError, match=r"context_tokens is swept \(\[100, 200\]\) and also set as a knob"):
        sweep_configs(config(context_tokens=300), "context_tokens", [100, 200])


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.app", "eval", *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=300)


COMMON = ("--dtype", "float32", "--episodes", "2", "--chunk-tokens", "48", "--memory-tokens", "8",
          "--answer-tokens", "4", "--knob", "distractors=1", "--threads", "1")


def test_cli_sweep_stores_one_row_per_length_equal_to_plain_evals(tmp_path):
    model = save_tiny(tmp_path / "tiny")
    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    png = tmp_path / "sweep.png"
    proc = cli("--model", model, *COMMON, "--sweep", "context_tokens=200,60", "--plot", str(png), "--db", url)
    assert proc.returncode == 0, proc.stderr
    assert "length sweep" in proc.stdout and f"plot: {png}" in proc.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    plain = cli("--model", model, *COMMON, "--knob", "context_tokens=60", "--db", url)
    assert plain.returncode == 0, plain.stderr
    engine = sa.create_engine(url)
    with engine.connect() as c:
        rows = c.execute(sa.text("select e.run_id, e.f1, e.em, e.sub_em, e.metrics from eval_results e "
                                 "join runs r on r.id = e.run_id order by r.created_at")).all()
        outputs = {run: c.execute(sa.text(
            "select i.output_ids from invocations i join episodes e on e.id = i.episode_id "
            "where e.run_id = :r order by e.task_id, i.step"), {"r": run}).scalars().all() for run, *_ in rows}
    engine.dispose()
    metrics = [json.loads(m) if isinstance(m, str) else m for *_, m in rows]
    assert [m["env_knobs"]["context_tokens"] for m in metrics] == [200, 60, 60]
    assert metrics[0]["context_tokens"] > metrics[1]["context_tokens"] == metrics[2]["context_tokens"]
    # the sweep's context_tokens=60 evaluation is the plain evaluation at 60: same scores, same calls
    assert rows[1][1:4] == rows[2][1:4]
    assert outputs[rows[1][0]] == outputs[rows[2][0]] and outputs[rows[1][0]]


@pytest.mark.parametrize("args, needle", [
    (("--docs", "50,x"), "--docs expects comma-separated integers, got '50,x'"),
    (("--docs", "50,100"), "environment 'synthetic' has no knob 'docs' to sweep"),
    (("--sweep", "50,100"), "--sweep expects KNOB=V1,V2,..., got '50,100'"),
    (("--docs", "5", "--sweep", "context_tokens=5"), "give --docs or --sweep, not both"),
])
def test_cli_bad_sweeps_are_one_line_and_create_nothing(tmp_path, args, needle):
    db = tmp_path / "x.db"
    proc = cli(*args, "--db", f"sqlite:///{db}")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)  # the command line is wrong
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not db.exists()
