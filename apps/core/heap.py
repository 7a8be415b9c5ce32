"""Give the C heap's free memory back to the OS after a periodic task.

A periodic pass (rollups, compaction, a detector window) allocates and frees tens of MB of
numpy buffers and database results. glibc keeps freed heap memory for reuse, and after the
first large buffer it frees it raises its mmap threshold (up to 32 MiB), so later buffers of
that size come from the heap too: in a 3-minute soak the periodic worker's children held
38 MiB of free heap each while what was in use stayed at 28 MiB (docs/faults.md, 10).
`malloc_trim(0)` returns it: the free pages of every arena, not only the heap's top.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (AttributeError, OSError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def heap_trim() -> bool:
    """Release the C heap's free pages to the OS; True when some were (False: none free,
    or no glibc)."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
