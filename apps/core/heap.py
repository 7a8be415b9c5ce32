"""Memory of the periodic passes: the C heap's free memory given back to the OS after a
task, and the cyclic garbage collector paused while a pass builds its window.

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
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager


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


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block: a burst of allocation that makes no
    cycles worth finding. A detector pass makes ~150 k tuples, lists and floats (StepRows,
    series points), freed by reference counting when it ends; each 700 of them started a
    collection, and the older generations' collections walked the whole heap of a Django
    process: half a 256-rank pass's CPU (200 ms with, 104 without; docs/performance.md).
    Cycles made meanwhile wait for the next collection after the block. Drop the burst's
    objects inside the block: freed after it, the collector's first run walks them all once
    more (17 ms of a 120 ms pass, docs/performance-history.md). Process-wide: a
    thread's block that ends while another's runs turns it back on early, which costs
    only speed."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
