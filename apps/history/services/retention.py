"""Retention of the time-keyed tables: whole partitions dropped, and row deletes only where
rows have no partition of their own.

Every table here is partitioned by time (migrations telemetry 0004, runs 0007, history 0004;
apps.core.partitions): a WIDTH-day partition goes with one `DROP TABLE` once every row of it
has expired, however many rows it holds, leaving no dead tuples behind. The rows of the
legacy partition (what the table held when it was partitioned) and of the default one (rows
no range held) are deleted in batches, as the whole tables were before.

A row of a chunk table reaches past its key (a chunk's t1 after its t0), so its partition
goes REACH later: data is kept at least its retention, at most retention + WIDTH + REACH.
`partitions_maintain` keeps AHEAD_DAYS of partitions made ahead of the clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from apps.core.partition_convert import AHEAD_DAYS
from apps.core.partitions import partitions_drop, partitions_ensure, partitions_list
from apps.core.prune import expired_delete

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PruneTarget:
    table: str
    expired: str  # SQL condition on %(cutoff)s; must be able to use the table's BRIN index
    retention_setting: str


@dataclass(frozen=True)
class TimeTable:
    """A time-partitioned table and its retention."""

    table: str
    key: str  # the partition key
    width_days: int
    retention_setting: str  # HISTORY_<setting>_RETENTION_DAYS
    expired: str  # a row's expiry as SQL on %(cutoff)s, for the legacy and default partitions
    reach: timedelta = timedelta(0)  # how far a row's data may lie past its key

    def prune_target(self, partition: str) -> PruneTarget:
        return PruneTarget(partition, self.expired, self.retention_setting)


_CHUNK_EXPIRED = "t0 < %(cutoff)s AND t1 < %(cutoff)s"
# Partition widths: about a week of partitions under each default retention (2, 7, 90, 400
# days, forever), few enough for planning, small enough that a drop frees space soon.
TIME_TABLES = (
    TimeTable("telemetry_chunk", "t0", 1, "RAW", _CHUNK_EXPIRED, reach=timedelta(days=1)),
    TimeTable("runs_stepreport", "ts", 1, "RAW", "ts < %(cutoff)s"),
    TimeTable("runs_stepchunk", "window", 1, "RAW", _CHUNK_EXPIRED, reach=timedelta(days=1)),
    TimeTable("history_sample_1m", "bucket", 7, "1M", "bucket < %(cutoff)s"),
    TimeTable("history_step_10s", "bucket", 1, "10S", "bucket < %(cutoff)s"),
    TimeTable("history_runstep_10s", "bucket", 1, "10S", "bucket < %(cutoff)s"),
    TimeTable("history_step_1m", "bucket", 7, "1M", "bucket < %(cutoff)s"),
    TimeTable("history_runstep_1m", "bucket", 7, "1M", "bucket < %(cutoff)s"),
    TimeTable("history_step_10m", "bucket", 30, "10M", "bucket < %(cutoff)s"),
    TimeTable("history_sample_1h", "bucket", 30, "1H", "bucket < %(cutoff)s"),
    TimeTable("history_step_1h", "bucket", 30, "1H", "bucket < %(cutoff)s"),
    TimeTable("history_runstep_1h", "bucket", 30, "1H", "bucket < %(cutoff)s"),
)


def history_prune(*, now: datetime) -> dict[str, int]:
    """Drop the expired partitions of every table with a retention
    (HISTORY_<RAW|10S|1M|10M|1H>_RETENTION_DAYS; 0 keeps it forever), and delete expired rows
    of its legacy and default partitions in batches (`table_prune`). Returns rows deleted per
    table (a dropped partition's rows are not counted: nothing reads them one by one)."""
    deleted: dict[str, int] = {}
    for spec in TIME_TABLES:
        days = getattr(settings, f"HISTORY_{spec.retention_setting}_RETENTION_DAYS")
        if not days:
            continue
        cutoff = now - timedelta(days=days)
        _expired_partitions_drop(spec, before=cutoff - spec.reach)
        with connection.cursor() as cursor:
            names = {p.name for p in partitions_list(cursor, spec.table)}
        deleted[spec.table] = sum(
            table_prune(target=spec.prune_target(name), cutoff=cutoff)
            for name in (f"{spec.table}_legacy", f"{spec.table}_default")
            if name in names
        )
    return deleted


def _expired_partitions_drop(spec: TimeTable, *, before: datetime) -> None:
    """A drop locks the parent table: wait for it at most PARTITION_LOCK_TIMEOUT_MS, so that a
    long read never queues the ingest behind the drop; the next pass tries again."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {int(settings.PARTITION_LOCK_TIMEOUT_MS)}")
            dropped = partitions_drop(cursor, spec.table, expired_before=before)
    except DatabaseError as exc:  # a lock not had in time: the next pass
        logger.warning("partitions of %s not dropped this pass: %s", spec.table, exc)
        return
    if dropped:
        logger.info("dropped expired partitions %s", ", ".join(dropped))


def partitions_maintain(*, now: datetime) -> dict[str, list[str]]:
    """Make the partitions of every time table from the one holding yesterday to AHEAD_DAYS
    ahead (each under the same lock timeout as drops). Returns those made, per table."""
    made: dict[str, list[str]] = {}
    for spec in TIME_TABLES:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    f"SET LOCAL lock_timeout = {int(settings.PARTITION_LOCK_TIMEOUT_MS)}"
                )
                made[spec.table] = partitions_ensure(
                    cursor, spec.table, key=spec.key, width_days=spec.width_days,
                    start=now - timedelta(days=1), end=now + timedelta(days=AHEAD_DAYS),
                )  # fmt: skip
        except DatabaseError as exc:
            logger.warning("partitions of %s not made this pass: %s", spec.table, exc)
    return made


def table_prune(*, target: PruneTarget, cutoff: datetime) -> int:
    """Delete `target`'s rows expired at `cutoff`: HISTORY_PRUNE_BATCH rows a transaction, at
    most HISTORY_PRUNE_MAX_BATCHES transactions (the next call goes on)."""
    return expired_delete(
        table=target.table, expired=target.expired, params={"cutoff": cutoff},
        batch=settings.HISTORY_PRUNE_BATCH, max_batches=settings.HISTORY_PRUNE_MAX_BATCHES,
    )  # fmt: skip
