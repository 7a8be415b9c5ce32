"""Pruning the inbox: a processed row is kept only while its batch_id can still matter.

The inbox row is what answers a repeated batch_id with `200 duplicate`. A batch accepted at
time T holds records no older than T − 7 days and no newer than T + 5 minutes (the `ts`
window of apps.ingest.schemas). Sent again after T + 7 days + 5 minutes, every record in it
is more than 7 days old, so validation refuses it (400) before any lookup: it can never be
stored twice. Rows received more than INBOX_KEEP ago are deleted; quarantined rows stay
until an admin releases or deletes them (they hold the evidence)."""

from __future__ import annotations

from datetime import datetime, timedelta

from apps.history.services import PruneTarget, table_prune
from apps.ingest.schemas import FUTURE_LIMIT_S, PAST_LIMIT_S

# The ts window plus a day: clocks of agents and server disagree, and nothing is gained by
# pruning sooner.
INBOX_KEEP = timedelta(seconds=PAST_LIMIT_S + FUTURE_LIMIT_S) + timedelta(days=1)

INBOX_PROCESSED = PruneTarget(
    "ingest_inboxbatch",
    "received_at < %(cutoff)s AND processed_at IS NOT NULL AND quarantined_at IS NULL",
    retention_setting="",  # derived from the ts window, not a setting
)


# A remote-written series' watermark (apps.ingest.services.remote_write) matters as long as a
# sample at or before it could still be accepted: the same span as a batch_id's.
REMOTE_SERIES_IDLE = PruneTarget(
    "ingest_remoteseries",
    "ts < extract(epoch FROM %(cutoff)s::timestamptz)",
    retention_setting="",  # derived from the ts window, not a setting
)


def inbox_prune(*, now: datetime) -> int:
    """Delete processed, unquarantined inbox rows received before now − INBOX_KEEP, and the
    remote-written series silent since then, in batches as history's pruning does
    (apps.history.services.table_prune)."""
    cutoff = now - INBOX_KEEP
    return table_prune(target=INBOX_PROCESSED, cutoff=cutoff) + table_prune(
        target=REMOTE_SERIES_IDLE, cutoff=cutoff
    )
