"""Resumable benchmark runs: finished phases by name in a JSON file, and a timestamped progress line.

A benchmark with long phases (the learning and memory benchmarks) keeps ``{"plan": ..., "phases": {...}}`` in
``WORK/state.json``, written atomically after every phase; run again on the same folder, a killed run goes on
at its first unfinished phase. A folder made by another plan is refused."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any


class State:
    """Finished phases, by name, in ``path`` (written after every phase)."""

    def __init__(self, path: Path, plan: Any):
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {"plan": asdict(plan), "phases": {}}
        if self.data["plan"] != asdict(plan):
            raise SystemExit(f"{path} was made by another plan; use a new --work folder")

    def get(self, name: str):
        return self.data["phases"].get(name)

    def put(self, name: str, value) -> None:
        self.data["phases"][name] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def once(self, name: str, make):
        """The phase's stored value, made (and stored) first when it is not there."""
        if self.get(name) is None:
            self.put(name, make())
        return self.get(name)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
