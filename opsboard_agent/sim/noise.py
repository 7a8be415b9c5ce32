"""Keyed, order-independent noise: the same (seed, key) always gives the same number.

The model draws every random value through these, keyed by what it describes (run, rank,
step, metric, sample time), so a value never depends on the order things were generated
in — advancing the model in one call or in a hundred gives bit-identical output.
"""

from __future__ import annotations

import hashlib

_SCALE = float(1 << 64)


def _digest(seed: int, key: tuple[object, ...], size: int) -> bytes:
    return hashlib.blake2b(repr((seed, *key)).encode(), digest_size=size).digest()


def unit(seed: int, *key: object) -> float:
    """Uniform in [0, 1)."""
    return int.from_bytes(_digest(seed, key, 8), "big") / _SCALE


def jitter(seed: int, *key: object) -> float:
    """Uniform in [-1, 1)."""
    return 2.0 * unit(seed, *key) - 1.0


def hexdigest(seed: int, *key: object) -> str:
    """32 hex characters (the format of `torchcheck`'s BLAKE2b checksums)."""
    return _digest(seed, key, 16).hex()
