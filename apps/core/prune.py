"""Retention: deleting what has expired, in bounded batches (docs/operations.md, Retention).

Every batch is one statement in a transaction of its own, so a pass never holds many locks
or much WAL at once, and a pass cut short (a worker restarted) loses nothing: the next pass
goes on from what is still there. A pass stops at the first batch that deletes fewer rows
than it asked for, or after RETENTION_MAX_BATCHES batches (the next pass goes on).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import connection, transaction

logger = logging.getLogger(__name__)


def batches_delete(
    *, sql: str, params: dict[str, Any], what: str, batch: int = 0, max_batches: int = 0
) -> int:
    """Run `sql`, one DELETE of at most %(batch)s rows (`batch`, else RETENTION_BATCH) whose
    row count says how many it took, until a batch falls short or `max_batches` (else
    RETENTION_MAX_BATCHES) ran. Returns the rows deleted (as the statement counts them)."""
    batch = batch or settings.RETENTION_BATCH
    total = 0
    for _ in range(max_batches or settings.RETENTION_MAX_BATCHES):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, {**params, "batch": batch})
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
    if total:
        logger.info("retention: deleted %s %s", total, what)
    return total


def expired_delete(
    *, table: str, expired: str, params: dict[str, Any], batch: int = 0, max_batches: int = 0
) -> int:
    """Delete the rows of `table` (a plain table or one partition: a ctid names a row only
    within one) matching the SQL condition `expired` (on `params`), a batch per statement,
    as batches_delete does."""
    sql = (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {table} WHERE {expired} LIMIT %(batch)s))"
    )
    return batches_delete(
        sql=sql, params=params, what=f"rows of {table}", batch=batch, max_batches=max_batches
    )
