"""The tests mirror the code: every ``tests/**/test_*.py`` is named after the module or package it tests, in the
folder that mirrors its place (``tests/agentmem/serve/test_gateway.py`` tests ``agentmem/serve/gateway.py``), or
lives in a named folder of suites that cross units. A name may add an aspect after the unit's name
(``test_privileged_hint.py`` tests ``replay/privileged.py``'s hint context). No test file imports another: what
tests share lives in the helper modules at the top of ``tests/`` (``helpers.py``, ``model_helpers.py``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent

# Suites that cross units, each in its own folder.
CROSS_UNIT = {
    "bench_smoke": "every benchmark's --smoke run",
    "clients": "agent frameworks' clients against agentmem serve (examples/)",
    "docs": "the docs' links and commands, run as pasted",
    "e2e": "the CLI end to end as a user runs it: processes, signals, the wheel, torchrun",
    "faults": "kills, restarts, a full disk, missing and read-only stores",
    "fuzz": "property-based input to the command line and to agentmem serve",
    "golden": "stored outputs pinned byte for byte",
    "meta": "checks of the test suite itself",
    "plugin_demo": "plug-ins installed beside agentmem, through every job",
}

def unit_names(folder: Path) -> set[str]:
    """The names a test file in the mirror of ``folder`` may take after: its modules, subpackages and itself."""
    names = {folder.name}
    for p in folder.iterdir():
        if p.suffix == ".py" and p.stem != "__init__":
            names.add(p.stem)
        elif p.is_dir() and (p / "__init__.py").is_file():
            names.add(p.name)
    return names


def misplaced(path: Path) -> str | None:
    rel = path.relative_to(TESTS)
    unit = path.stem.removeprefix("test_")
    if len(rel.parts) == 1:
        return "at the top of tests/: put it in the folder that mirrors its unit"
    if rel.parts[0] in CROSS_UNIT:
        return None
    code = ROOT.joinpath(*rel.parts[:-1])
    if not code.is_dir():
        return f"{code.relative_to(ROOT)}/ does not exist, and {rel.parts[0]}/ is no cross-unit suite"
    names = unit_names(code)
    if any(unit == n or unit.startswith(n + "_") for n in names):
        return None
    return f"names no module or package of {code.relative_to(ROOT)}/ ({', '.join(sorted(names))})"


def test_every_test_file_maps_to_a_unit_or_a_cross_unit_suite():
    wrong = {str(p.relative_to(TESTS)): why for p in sorted(TESTS.rglob("test_*.py")) if (why := misplaced(p))}
    assert wrong == {}


def test_no_test_file_imports_another():
    found = {str(p.relative_to(TESTS)): names for p in sorted(TESTS.rglob("test_*.py"))
             if (names := re.findall(r"^\s*(?:from|import) (test_\w+)", p.read_text(), re.M))}
    assert found == {}
