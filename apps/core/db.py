"""Direct psycopg cursors for the hot paths, on Django's own connection and transaction."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection


def server_cursor() -> psycopg.Cursor:
    """A cursor with server-side parameter binding (Django's default cursor binds on the
    client, quoting a bytea payload into the SQL text as hex: slow for an 80 KB batch).
    `execute(..., binary=True)` also fetches bytea in binary, without hex decoding."""
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)


@contextmanager
def query_logged(database: Any, sql: str) -> Iterator[None]:
    """Put a statement run on a direct psycopg cursor of `database` (a Django connection) in
    its query log, as Django's own cursors do whenever queries are logged (DEBUG, and
    CaptureQueriesContext in tests): the pinned query counts see it too."""
    started = time.monotonic()
    try:
        yield
    finally:
        if database.queries_logged:
            database.queries_log.append(
                {"sql": sql, "time": f"{time.monotonic() - started:.3f}", "alias": database.alias}
            )
