"""Every benchmark runs: each ``bench/NAME.py`` runs as ``python -m bench.NAME --smoke``, every phase in seconds
on a tiny random model, and exits 0, so no benchmark can go stale when the code it measures changes. New
benchmarks are picked up by the globs (``bench/*.py``, and ``bench/*/__main__.py`` for a benchmark that is a
package; helpers they share live in ``bench/common/``); each must have a ``--smoke`` flag. ``scripts/test.sh`` runs these with the rest of the suite (marker ``bench_smoke``:
``pytest -m bench_smoke`` runs them alone; ``scripts/test.sh --fast`` leaves them out).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXEMPT: set[str] = set()

REPO = Path(__file__).resolve().parents[2]
BENCHES = sorted([p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__"]
                 + [p.parent.name for p in (REPO / "bench").glob("*/__main__.py")])


def source(name: str) -> str:
    """The text that holds benchmark ``name``'s flags: ``bench/NAME.py``, or a package's ``__main__.py``."""
    path = REPO / "bench" / f"{name}.py"
    return (path if path.exists() else REPO / "bench" / name / "__main__.py").read_text()


def bench(name: str, *args: str) -> list[str]:
    """The command that runs benchmark ``name`` (``python -m bench.NAME ARGS``)."""
    return [sys.executable, "-m", f"bench.{name}", *args]


def bench_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """One torch thread, no hub, no default store; temporary files and the import path pinned to the checkout."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
            "AGENTMEM_DB": "", "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO), **extra}


def test_every_benchmark_has_a_smoke_flag():
    missing = [name for name in BENCHES if name not in EXEMPT and "--smoke" not in source(name)]
    assert missing == []


@pytest.mark.bench_smoke
@pytest.mark.parametrize("name", BENCHES)
def test_bench_smoke_runs(name, tmp_path):
    if name in EXEMPT:
        pytest.skip(f"{name}: exempt ({', '.join(sorted(EXEMPT))} get their --smoke elsewhere)")
    proc = subprocess.run(bench(name, "--smoke"), cwd=tmp_path, env=bench_env(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"bench.{name} --smoke exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip(), f"bench.{name} --smoke printed nothing"
    last = proc.stdout.strip().splitlines()[-1]
    if name == "learning":  # the benchmark's last line, every key present
        keys = [kv.split("=")[0] for kv in last.split()]
        assert keys == ["gap_hint", "recovery_hint", "opd_minus_sft_more", "opd_minus_seqkd", "opd_rl_minus_rl", "seeds",
                        "minutes_per_seed"], last


@pytest.mark.bench_smoke
def test_generation_without_batch_one_leaves_the_bandwidth_fraction_empty(tmp_path):
    proc = subprocess.run(bench("generation", "--smoke", "--batches", "8"), cwd=tmp_path, env=bench_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("new_vs_old_b8=") and last.endswith(" bandwidth_fraction_b1="), last


@pytest.mark.bench_smoke
def test_workers_ray_smoke_prints_its_keys(tmp_path):
    pytest.importorskip("ray")
    # Ray's sockets live under its temp folder, and a Unix socket's path has at most 107 bytes: not under tmp_path
    proc = subprocess.run(bench("workers", "--ray", "--smoke"), cwd=tmp_path, env=bench_env(tmp_path, RAY_TMPDIR="/tmp"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    keys = [kv.split("=")[0] for kv in last.split()]
    assert keys == ["ray_vs_plain_2", "scale_2_vs_1", "lost", "duplicates", "restart_s"], last
    assert " lost=0 duplicates=0 " in last, last
