"""Every benchmark runs (issue 23, item 6): each ``bench/*.py`` with ``--smoke`` runs every phase in seconds
on a tiny random model and exits 0, so no benchmark can go stale when the code it measures changes. New
benchmarks are picked up by the glob (``bench/*.py``; helpers they share live in ``bench/common/``); each must
have a ``--smoke`` flag. ``scripts/test.sh`` runs these with
the rest of the suite (marker ``bench_smoke``: ``pytest -m bench_smoke`` runs them alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXEMPT: set[str] = set()

REPO = Path(__file__).resolve().parents[1]
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py"))


def test_every_benchmark_has_a_smoke_flag():
    missing = [name for name in BENCHES if name not in EXEMPT and "--smoke" not in (REPO / "bench" / name).read_text()]
    assert missing == []


@pytest.mark.bench_smoke
@pytest.mark.parametrize("name", BENCHES)
def test_bench_smoke_runs(name, tmp_path):
    if name in EXEMPT:
        pytest.skip(f"{name}: exempt ({', '.join(sorted(EXEMPT))} get their --smoke elsewhere)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "AGENTMEM_DB": "", "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / name), "--smoke"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"bench/{name} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), f"bench/{name} --smoke printed nothing"
    last = proc.stdout.strip().splitlines()[-1]
    if name == "learning.py":  # the last line, every key present
        keys = [kv.split("=")[0] for kv in last.split()]
        assert keys == ["warm_minus_base", "aligned_minus_warm", "aligned_minus_persistent", "opd_rl_minus_rl",
                        "rl_live_fraction", "hotpot_trained_minus_base", "seeds"], last


@pytest.mark.bench_smoke
def test_generation_without_batch_one_leaves_the_bandwidth_fraction_empty(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "generation.py"), "--smoke", "--batches", "8"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("new_vs_old_b8=") and last.endswith(" bandwidth_fraction_b1="), last
