"""Query plans under the worst case, for the history tests and the page benchmark alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def prepared_generic_plans() -> Iterator[None]:
    """Django's connection, but with server-side binding, every statement prepared at once
    and generic plans forced: the worst case should psycopg's prepare_threshold be set."""
    import psycopg
    from django.db import connection

    connection.ensure_connection()
    raw = connection.connection
    factory, threshold = raw.cursor_factory, raw.prepare_threshold
    raw.cursor_factory, raw.prepare_threshold = psycopg.Cursor, 0
    raw.execute("SET plan_cache_mode = force_generic_plan")
    try:
        yield
    finally:
        raw.execute("RESET plan_cache_mode")
        raw.execute("DEALLOCATE ALL")  # psycopg forgets its prepared statements too
        raw.cursor_factory, raw.prepare_threshold = factory, threshold
