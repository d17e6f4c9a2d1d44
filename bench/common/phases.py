"""Resumable benchmark runs: finished phases by name in a JSON file, and a timestamped progress line.

A benchmark with long phases (the learning and memory benchmarks) keeps ``{"plan": ..., "phases": {...}}`` in
``WORK/state.json``, written atomically after every phase; run again on the same folder, a killed run goes on
at its first unfinished phase. A folder made by another plan is refused; the plan's ``free`` fields (the
learning benchmark's arm subset and seed count) may differ, since phases are named by what they depend on. A
knob added to the plan after the folder was made matches when the new plan leaves it at its default (the folder's
phases were made without it, i.e. as the default does).

Several processes may share one state file (the learning benchmark's ``--jobs``): every ``put`` takes an
exclusive lock on ``state.json.lock``, re-reads the file and merges its one phase in, so no process's phase
is lost to another's write; ``get`` reads the phases as of the last merge."""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any


class State:
    """Finished phases, by name, in ``path`` (written after every phase)."""

    def __init__(self, path: Path, plan: Any, free: tuple[str, ...] = ()):
        self.path = path
        self.plan = asdict(plan)
        with self._locked():
            self.data = self._read()
            for f in fields(plan):  # knobs newer than the folder, left at their default
                if f.name not in self.data["plan"] and self.plan[f.name] == _default(f):
                    self.data["plan"][f.name] = self.plan[f.name]
            folder, now = _without(self.data["plan"], free), _without(self.plan, free)
            if folder != now:
                differ = "; ".join(f"{k}: folder {folder.get(k, '(made before the knob)')!r}, now {now.get(k)!r}"
                                   for k in sorted(set(folder) | set(now)) if folder.get(k, MISSING) != now.get(k, MISSING))
                raise SystemExit(f"{path} was made by another plan ({differ}); give the folder's values or use a "
                                 "new --work folder")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.exists() else {"plan": self.plan, "phases": {}}

    def refresh(self) -> None:
        """Take in the phases other processes have written since."""
        with self._locked():
            self.data = self._read()

    def get(self, name: str):
        return self.data["phases"].get(name)

    def put(self, name: str, value) -> None:
        with self._locked():
            self.data = self._read()
            self.data["phases"][name] = value
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1))
            tmp.replace(self.path)

    def once(self, name: str, make):
        """The phase's stored value, made (and stored) first when it is not there."""
        if self.get(name) is None:
            self.put(name, make())
        return self.get(name)


def _default(f: Any) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else MISSING


def _without(plan: dict, keys: tuple[str, ...]) -> dict:
    return {k: v for k, v in plan.items() if k not in keys}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)
