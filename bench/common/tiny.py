"""The tiny random model of the benchmarks' ``--smoke`` modes: the tests' ``tiny_models`` (their tokenizer and
config), saved as a model folder, so a smoke run exercises every path in seconds without the default model."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"


def tiny_model(folder: Path, name: str = "tiny") -> str:
    """The model folder ``folder/name``, made on first use (a folder that holds one already is reused)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from tiny_models import save_tiny

    out = folder / name
    return str(out) if (out / "config.json").exists() else save_tiny(out)
