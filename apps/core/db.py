"""Direct psycopg cursors for the hot paths, on Django's own connection and transaction."""

import psycopg
from django.db import connection


def server_cursor() -> psycopg.Cursor:
    """A cursor with server-side parameter binding (Django's default cursor binds on the
    client, quoting a bytea payload into the SQL text as hex: slow for an 80 KB batch).
    `execute(..., binary=True)` also fetches bytea in binary, without hex decoding."""
    connection.ensure_connection()
    return psycopg.Cursor(connection.connection)
