"""Change logs read by transaction-id watermark: which rows a writer touched, for readers that
keep a window between passes (the detectors' windows kept by each periodic worker).

A log is a table with `xid bigint DEFAULT pg_current_xact_id()`, `at timestamptz DEFAULT
clock_timestamp()` and the log's own columns, beside a one-row horizon table. Writers append
in the transaction that stored the rows; readers never delete.

Why transaction ids and not a serial or a time: ids are handed out before commit, and a
transaction that began earlier may commit later, so "rows after the last one I saw" misses
it. A reader instead remembers the oldest transaction still running when its pass began
(`pg_snapshot_xmin`, its watermark) and next time reads every change whose writer's id is at
or above it: a writer below it had finished before that pass read anything, so its rows were
read then (or by an earlier pass, by the same argument); a writer at or above it may not
have committed then, and is read now. Some changes are read twice: reloading is idempotent.

The log is pruned after its `keep_s`; the prune raises the horizon (the highest id it
deleted), and a reader whose watermark is not above it reloads its window whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from django.db import connection

# Long enough for any live reader (a kept window older than a minute is reloaded whole).
CHANGES_KEEP_S = 120.0


class ChangeSnapshot(NamedTuple):
    """Where a reader stands: the oldest transaction still running now (the next pass's
    watermark) and the prune horizon (a watermark at or below it has lost changes)."""

    xmin: int
    horizon: int

    def covers(self, watermark: int | None) -> bool:
        """Whether the log still holds every change since `watermark`."""
        return watermark is not None and watermark > self.horizon


@dataclass(frozen=True)
class ChangeLog:
    table: str
    horizon_table: str

    def snapshot(self) -> ChangeSnapshot:
        """Take before reading anything the changes will be compared with."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint,"
                f" (SELECT xid FROM {self.horizon_table} WHERE id = 1)"
            )
            xmin, horizon = cursor.fetchone()
        return ChangeSnapshot(xmin, horizon or 0)

    def rows_since(
        self, *, columns: str, key: str, ids: list[int], xid: int, tail: str = ""
    ) -> list[tuple]:
        """`columns` of the rows for the `key` column's `ids` written by transactions with
        ids at or above `xid`, then `tail` (a GROUP BY or ORDER BY)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {columns} FROM {self.table} WHERE xid >= %s AND {key} = ANY(%s) {tail}",
                [xid, ids],
            )
            return cursor.fetchall()

    def prune(self, *, keep_s: float = CHANGES_KEEP_S) -> None:
        """Drop the rows older than `keep_s`, raising the horizon past them."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH gone AS (DELETE FROM {self.table}"
                "  WHERE at < clock_timestamp() - make_interval(secs => %s) RETURNING xid)"
                f" UPDATE {self.horizon_table}"
                "  SET xid = greatest(xid, (SELECT max(xid) FROM gone))"
                " WHERE id = 1 AND EXISTS (SELECT FROM gone)",
                [keep_s],
            )
