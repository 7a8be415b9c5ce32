"""Time partitions of the big tables: the shapes every partitioned table shares, made,
extended and dropped with plain SQL (Postgres declarative range partitioning).

A partitioned table `T`, keyed by a timestamptz column, has
- `T_pYYYYMMDD`: one partition per WIDTH days, aligned to the Unix epoch (UTC midnights);
  made ahead of time by `partitions_ensure`, dropped whole once expired (`partitions_drop`):
  retention is one `DROP TABLE`, no row deletes, no dead tuples, no vacuum debt;
- `T_legacy`: the rows the table held before it was partitioned (`table_partition`), a range
  partition below the first daily one. The table itself becomes it, so that converting an
  existing database copies nothing and rewrites nothing;
- `T_default`: the DEFAULT partition, for a row no range holds (a test's far-past data, or
  data ahead of the made partitions if nothing made them). Ranges the default holds rows of
  are not made (Postgres would refuse); the owner prunes those rows by row deletes, as it
  does the legacy partition's.

Why no identity column: before Postgres 17 a partitioned table cannot have one, so an `id`
column keeps its values from a plain sequence owned by the column (Django's own reads of it,
`pg_get_serial_sequence`, work alike).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_BOUNDS = re.compile(r"FROM \((.+?)\) TO \((.+?)\)")


@dataclass(frozen=True)
class Partition:
    name: str
    lo: datetime | None  # None: MINVALUE (the legacy partition)
    hi: datetime | None  # None: the DEFAULT partition (no bounds)


def ident(name: str) -> str:
    """`name` quoted as an SQL identifier (our own table and column names)."""
    return '"' + name.replace('"', '""') + '"'


def timestamp_literal(when: datetime) -> str:
    """`when` as an SQL literal, for DDL (which takes no parameters)."""
    return f"'{when.isoformat()}'::timestamptz"


def boundary_floor(when: datetime, width_days: int) -> datetime:
    """The start of the WIDTH-day range holding `when` (ranges aligned to the epoch, UTC)."""
    width = timedelta(days=width_days)
    return EPOCH + ((when - EPOCH) // width) * width


def partition_name(table: str, lo: datetime) -> str:
    return f"{table}_p{lo:%Y%m%d}"


def partitions_list(cursor, table: str) -> list[Partition]:
    """The partitions of `table` with their bounds, by lower bound (legacy first, default
    last)."""
    cursor.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass",
        [table],
    )
    partitions = [_partition_parse(name, bound) for name, bound in cursor.fetchall()]
    return sorted(partitions, key=lambda p: (p.hi is None, p.lo or EPOCH.replace(year=1)))


def _partition_parse(name: str, bound: str) -> Partition:
    if bound == "DEFAULT":
        return Partition(name, None, None)
    match = _BOUNDS.search(bound)
    if match is None:
        raise ValueError(f"{name}: unexpected partition bound {bound!r}")
    lo_text, hi_text = (text.strip("'") for text in match.groups())
    lo = None if lo_text == "MINVALUE" else datetime.fromisoformat(lo_text)
    return Partition(name, lo, datetime.fromisoformat(hi_text))


def is_partitioned(cursor, table: str) -> bool:
    cursor.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = %s::regclass", [table])
    row = cursor.fetchone()
    return bool(row and row[0])


def relation_bytes_sql(table: str, *, holding_rows: bool = False) -> str:
    """SQL for the bytes on disk of `table` with its indexes and TOAST, every partition
    included (pg_total_relation_size of a partitioned table alone is 0). `holding_rows`:
    only partitions whose heap has pages (after a VACUUM FULL: those holding rows), for a
    bytes-per-row figure that the fixed few pages of each empty partition's indexes would
    distort on a small sample."""
    holding = " AND c.relpages > 0" if holding_rows else ""
    return (
        "(SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint"
        f" FROM pg_partition_tree('{table}') t JOIN pg_class c ON c.oid = t.relid"
        f" WHERE t.isleaf{holding})"
    )


def partitions_ensure(
    cursor, table: str, *, key: str, width_days: int, start: datetime, end: datetime
) -> list[str]:
    """Make the missing WIDTH-day partitions of `table` covering [start, end). A range that
    overlaps an existing partition, or that the default partition holds rows of, is left to
    the partitions that hold it. Returns the partitions made."""
    existing = partitions_list(cursor, table)
    ranges = [(p.lo, p.hi) for p in existing if p.hi is not None]
    default = next((p.name for p in existing if p.hi is None), None)
    made: list[str] = []
    lo = boundary_floor(start, width_days)
    while lo < end:
        hi = lo + timedelta(days=width_days)
        if not any((a is None or a < hi) and lo < b for a, b in ranges) and not (
            default and _rows_between(cursor, default, key, lo, hi)
        ):
            _partition_create(cursor, table, lo, hi)
            made.append(partition_name(table, lo))
        lo = hi
    return made


def _rows_between(cursor, name: str, key: str, lo: datetime, hi: datetime) -> bool:
    cursor.execute(
        f"SELECT EXISTS (SELECT 1 FROM {ident(name)} WHERE {ident(key)} >= %s"
        f" AND {ident(key)} < %s)",
        [lo, hi],
    )
    return bool(cursor.fetchone()[0])


def _partition_create(cursor, table: str, lo: datetime, hi: datetime) -> None:
    cursor.execute(
        f"CREATE TABLE {ident(partition_name(table, lo))} PARTITION OF {ident(table)}"
        f" FOR VALUES FROM ({timestamp_literal(lo)}) TO ({timestamp_literal(hi)})"
        f"{storage_clause(cursor, table)}"
    )


def storage_clause(cursor, table: str) -> str:
    """The legacy partition's storage parameters (fillfactor and the like), which a
    partitioned table cannot hold itself, for each new partition."""
    cursor.execute(
        "SELECT c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass AND c.relname = %s",
        [table, f"{table}_legacy"],
    )
    row = cursor.fetchone()
    options = row[0] if row and row[0] else []
    return f" WITH ({', '.join(options)})" if options else ""


def partitions_drop(cursor, table: str, *, expired_before: datetime) -> list[str]:
    """Drop the range partitions of `table` whose every row is older than `expired_before`
    (the caller allows for rows whose data reaches past their key). The legacy partition
    goes too once it is wholly expired; the default partition stays."""
    dropped = []
    for partition in partitions_list(cursor, table):
        if partition.hi is not None and partition.hi <= expired_before:
            cursor.execute(f"DROP TABLE {ident(partition.name)}")
            dropped.append(partition.name)
    return dropped
