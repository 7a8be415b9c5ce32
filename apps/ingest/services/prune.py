"""Pruning the inbox: a processed row is kept only while its batch_id can still matter.

The inbox row is what answers a repeated batch_id with `200 duplicate`. A batch accepted at
time T holds records no older than T − 7 days and no newer than T + 5 minutes (the `ts`
window of apps.ingest.schemas). Sent again after T + 7 days + 5 minutes, every record in it
is more than 7 days old, so validation refuses it (400) before any lookup: it can never be
stored twice. Rows received more than INBOX_KEEP ago are deleted; quarantined rows stay
until an admin releases or deletes them (they hold the evidence)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from apps.ingest.schemas import FUTURE_LIMIT_S, PAST_LIMIT_S

logger = logging.getLogger(__name__)

# The ts window plus a day: clocks of agents and server disagree, and nothing is gained by
# pruning sooner.
INBOX_KEEP = timedelta(seconds=PAST_LIMIT_S + FUTURE_LIMIT_S) + timedelta(days=1)

_PRUNE_SQL = """
DELETE FROM ingest_inboxbatch WHERE id = ANY(ARRAY(
    SELECT id FROM ingest_inboxbatch
    WHERE received_at < %(cutoff)s AND processed_at IS NOT NULL AND quarantined_at IS NULL
    LIMIT %(batch)s))
"""


def inbox_prune(*, now: datetime) -> int:
    """Delete processed, unquarantined inbox rows received before now − INBOX_KEEP, in
    transactions of HISTORY_PRUNE_BATCH rows, at most HISTORY_PRUNE_MAX_BATCHES of them."""
    total, batch = 0, settings.HISTORY_PRUNE_BATCH
    for _ in range(settings.HISTORY_PRUNE_MAX_BATCHES):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_PRUNE_SQL, {"cutoff": now - INBOX_KEEP, "batch": batch})
            deleted = cursor.rowcount
        total += deleted
        if deleted < batch:
            break
    if total:
        logger.info("pruned %s processed inbox rows", total)
    return total
