"""Migrations must work from a non-editable wheel install, not only from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_db_upgrade_from_installed_wheel(tmp_path):
    dist, site, work = tmp_path / "dist", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(ROOT)], check=True, timeout=300)
    (wheel,) = dist.glob("agentmem-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, timeout=300)
    assert (site / "store" / "migrations" / "versions" / "0001_initial.py").is_file()
    assert (site / "store" / "migrations" / "versions" / "0002_run_liveness_memory_policy.py").is_file()
    for name in ("templates/base.html", "templates/episode.html", "templates/report.html", "static/style.css"):
        assert (site / "agentmem" / "view" / name).is_file(), name  # the viewer's non-Python files ship
    env = {**os.environ, "PYTHONPATH": str(site), "AGENTMEM_DB": ""}
    code = ("import store.migrations as m, cli.app as a; print(m.script_location()); a.main()")
    run = lambda *args: subprocess.run([sys.executable, "-c", code, *args], cwd=work, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    up = run("db", "upgrade", "--db", "sqlite:///installed.db")
    assert up.returncode == 0, up.stderr
    where = up.stdout.splitlines()[0]
    assert where == str(site / "store" / "migrations"), where
    from store.migrations import head_revision

    assert f"at revision {head_revision()}" in up.stdout and head_revision() != "0001"
    assert "up to date" in run("db", "current", "--db", "sqlite:///installed.db").stdout
