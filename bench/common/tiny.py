"""The tiny random model of the benchmarks' ``--smoke`` modes: ``agentmem.testing.tiny_models`` (the tests'
tokenizer and config), saved as a model folder, so a smoke run exercises every path in seconds without the
default model."""

from __future__ import annotations

from pathlib import Path

from agentmem.testing.tiny_models import save_tiny


def tiny_model(folder: Path, name: str = "tiny") -> str:
    """The model folder ``folder/name``, made on first use (a folder that holds one already is reused)."""
    out = folder / name
    return str(out) if (out / "config.json").exists() else save_tiny(out)
