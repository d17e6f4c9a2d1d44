"""Export to a Hugging Face dataset round-trips ids and log-probs exactly; ``agentmem export`` prints one line
and no progress bar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest

from agentmem.jobs.export import export_invocations
from agentmem.records import SamplingContext
from agentmem.testing.store_records import make_episode, make_invocation, make_run
from agentmem.testing.tiny_models import save_tiny
from store import repository as repo


@pytest.mark.parametrize("name", ["calls.parquet", "calls_dir"])
def test_export_round_trip(sqlite_store, tmp_path, name):
    rng = np.random.default_rng(0)
    run = make_run()
    ep = make_episode(run)
    invs = [make_invocation(ep, s, rng, 20 + s, 5 + s) for s in range(3)]
    # a privileged call (PSD off-policy) and a call that branched from another (ReOPD) keep their links
    invs[1] = invs[1].model_copy(update={"sampled_context": SamplingContext.privileged,
                                         "privileged_ids": np.array([7, 8, 9], np.int32)})
    invs[2] = invs[2].model_copy(update={"parent_invocation_id": invs[0].id})
    with sqlite_store.session() as s:
        repo.insert_run(s, run)
        repo.insert_episodes(s, [ep])
        repo.insert_invocations(s, invs)
        s.commit()
    out = tmp_path / name
    export_invocations(sqlite_store, [run.id[:8]], out)
    back = datasets.Dataset.from_parquet(str(out)) if out.suffix else datasets.load_from_disk(str(out))
    assert back.num_rows == 3 and back["step"] == [0, 1, 2]
    for row, inv in zip(back, invs, strict=True):
        assert row["invocation_id"] == inv.id and row["run_id"] == run.id
        assert row["prompt_ids"] == inv.prompt_ids.tolist()
        assert np.asarray(row["output_logprobs"], np.float32).tobytes() == inv.output_logprobs.tobytes()
        assert row["gold_answers"] == ep.gold_answers
    assert back["sampled_context"] == ["aligned", "privileged", "aligned"]
    assert back["privileged_ids"] == [None, [7, 8, 9], None]
    assert back["parent_invocation_id"] == [None, None, invs[0].id]


def test_export_prints_no_progress_bar(tmp_path):
    model = save_tiny(tmp_path / "model")
    db = str(tmp_path / "e.db")
    env = {**os.environ, "AGENTMEM_DB": "", "OMP_NUM_THREADS": "1"}

    def agentmem(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "cli.app", *args], cwd=Path(__file__).resolve().parents[3],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc

    out = agentmem("rollout", "--policy", "oracle", "--model", model, "--episodes", "1", "--knob",
                   "context_tokens=120", "--chunk-tokens", "64", "--memory-tokens", "24", "--db", db).stdout
    run_id = out.splitlines()[0].removeprefix("run_id=")
    done = agentmem("export", "--run", run_id, "--out", str(tmp_path / "calls.parquet"), "--db", db)
    assert done.stderr == ""
    assert done.stdout.startswith("wrote ") and done.stdout.strip().endswith("calls.parquet")
