"""Helpers the benchmarks share: resumable phases (``phases``) and the smoke modes' tiny model (``tiny``)."""
