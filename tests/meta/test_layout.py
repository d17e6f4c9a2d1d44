"""The tests mirror the code: every ``tests/**/test_*.py`` is named after the module or package it tests, in the
folder that mirrors its place (``tests/agentmem/serve/test_gateway.py`` tests ``agentmem/serve/gateway.py``), or
lives in a named folder of suites that cross units. A name may add an aspect after the unit's name
(``test_privileged_hint.py`` tests ``replay/privileged.py``'s hint context)."""

from __future__ import annotations

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

# Still at the top of tests/: other test files import their helpers (move those into helpers.py, then the file).
PENDING = {
    "test_agent.py", "test_cli_store.py", "test_config.py", "test_distill.py", "test_envs.py", "test_eval.py",
    "test_memory_policy.py", "test_packed_attention.py", "test_prefix_rollout.py", "test_psd.py",
    "test_routed_memory.py", "test_scoring.py", "test_sft.py", "test_shared_prefix.py", "test_static_decode.py",
    "test_teachers.py", "test_train_loop.py", "test_view.py",
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
        return None if rel.name in PENDING else "at the top of tests/: put it in the folder that mirrors its unit"
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


def test_the_pending_list_names_only_files_that_are_still_pending():
    assert sorted(f for f in PENDING if not (TESTS / f).is_file()) == []
