"""A writer whose transaction stays open: it took its transaction id before a reader's
pass and commits after it (the case the change logs' watermark exists for)."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def held_open(write: Callable[[], None]) -> Iterator[None]:
    """`write()` in a transaction of another thread, left open for the block's duration and
    committed when it ends (before the block's exit returns)."""
    written, release = threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with transaction.atomic():
                write()
                written.set()
                assert release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert written.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(30)
