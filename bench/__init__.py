"""Benchmarks: each runs as ``python -m bench.NAME`` from the repository root (``--smoke`` for a seconds-long run
of every phase); the helpers they share are in ``bench.common``."""
