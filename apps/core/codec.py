"""Numeric sequences as compact bytes, for columnar storage of sealed (compacted) data.

One codec for every compacted stream (sample chunks in apps/telemetry, step reports): pcodec
(https://github.com/pcodec/pcodec), lossless, with automatic delta and float modes.

Why pcodec, measured on 600-point series (a 10-minute chunk at 1 Hz), bytes per series:

    series                               raw arrays   pcodec   Gorilla (dod + XOR)
    offsets, every 1000 ms                   2,400        39         85
    offsets, 1 s ± 3 ms jitter               2,400       314        632
    utilisation, integer 0–100, noisy        4,800       471        669
    temperature, integer, slow walk          4,800       154        185
    power, 2 decimals, noisy                 4,800     1,122      4,109
    constant (memory total)                  4,800        28         83
    bench values (x.5 cycling 0–100)         4,800        76      1,424

Gorilla's XOR loses whenever values are decimal-quantised (most GPU counters: 2 decimals,
integers stored as floats), which pcodec's float modes find; delta-of-delta ties with
pcodec's delta encoding only on perfectly regular timestamps. Decoding 600 values takes
≈ 8 µs, encoding ≈ 80 µs: cheap next to a database round trip.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pcodec import ChunkConfig, standalone

# Default level (8) and automatic mode and delta detection: level 12 saved < 1 % above.
_CONFIG = ChunkConfig()
_INT32 = np.iinfo(np.int32)


def ints_encode(values: Sequence[int] | np.ndarray) -> bytes:
    """Integers (e.g. millisecond offsets, steps) as bytes; lossless. Stored as int32 when
    they fit (a smaller header), else int64."""
    array = np.asarray(values, dtype=np.int64)
    if array.size and _INT32.min <= array.min() and array.max() <= _INT32.max:
        array = array.astype(np.int32)
    return standalone.simple_compress(np.ascontiguousarray(array), _CONFIG)


def ints_decode(blob: bytes) -> np.ndarray:
    """The int64 array `ints_encode` was given."""
    array = standalone.simple_decompress(bytes(blob))
    return np.empty(0, dtype=np.int64) if array is None else array.astype(np.int64, copy=False)


def floats_encode(values: Sequence[float] | np.ndarray) -> bytes:
    """Float64 values as bytes; lossless, bit for bit (NaN and ±inf included)."""
    array = np.ascontiguousarray(np.asarray(values, dtype=np.float64))
    return standalone.simple_compress(array, _CONFIG)


def floats_decode(blob: bytes) -> np.ndarray:
    """The float64 array `floats_encode` was given."""
    array = standalone.simple_decompress(bytes(blob))
    return np.empty(0, dtype=np.float64) if array is None else array
