"""Screenshots of every `agentmem view` page, for docs/viewer.md.

    python scripts/viewer_screenshots.py --db sqlite:///agentmem.db [--out docs/viewer]

It imports agentmem as installed (`pip install -e .`), like every other script.

Serves the store read-only on a free local port, picks the pages to show (the newest scored rollout, its
episode with the most calls, the newest distill run) and has headless Chromium save a 1280-wide PNG of each.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import uvicorn

from agentmem.records import RunKind
from agentmem.view.app import create_app
from store import repository as repo
from store.engine import open_read_only

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def pages(store) -> list[tuple[str, str, int]]:
    """(name, path, window height) of each page to show."""
    with store.session() as s:
        runs = [r.run for r in repo.list_runs(s)]
        rollouts = [r for r in runs if r.kind is RunKind.rollout]
        scored = [r for r in rollouts if repo.teacher_score_keys(
            s, [i.id for e in repo.list_episodes(s, r.id) for i in repo.episode_invocations(s, e.id)])]
        run = (scored or rollouts)[0]
        stats = repo.list_episode_stats(s, run.id, sort="calls", descending=True)
        distill = next(r for r in runs if r.kind in (RunKind.distill, RunKind.sft))
    episode = stats[0].episode.id
    return [("runs", "/", 700), ("run", f"/runs/{run.id}", 1000), ("episode", f"/episodes/{episode}", 2000),
            ("episode-kl", f"/episodes/{episode}?metric=reverse_kl", 1400),
            ("compare", f"/episodes/{episode}/compare", 1400), ("training", f"/runs/{distill.id}/training", 1100),
            ("evals", "/evals", 900)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--out", default="docs/viewer")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or sys.exit("no chromium on PATH (apt-get install -y chromium)")
    store = open_read_only(args.db)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(store), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        for name, path, height in pages(store):
            png = out / f"{name}.png"
            subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                            f"--window-size=1280,{height}", f"http://127.0.0.1:{port}{path}"],
                           check=True, capture_output=True, timeout=120)
            print(f"{png}  <- {path}")
    server.should_exit = True


if __name__ == "__main__":
    main()
