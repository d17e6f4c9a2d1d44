"""Compact binary encoding of token ids and log-probs.

Each column has one fixed dtype, so the bytes are the raw little-endian array with no header: int32 for
token ids, float32 for log-probs. ``decode(encode(a)) == a`` exactly, including empty arrays.
"""

from __future__ import annotations

import numpy as np

IDS = np.dtype("<i4")
FLOATS = np.dtype("<f4")


def encode(arr: np.ndarray, dtype: np.dtype) -> bytes:
    return np.ascontiguousarray(arr, dtype=dtype).tobytes()


def decode(data: bytes | memoryview | None, dtype: np.dtype) -> np.ndarray:
    if not data:
        return np.zeros(0, dtype=dtype.newbyteorder("="))
    return np.frombuffer(bytes(data), dtype=dtype).astype(dtype.newbyteorder("="), copy=False)
