"""Converting a plain table into a time-partitioned one (apps.core.partitions), and back: the
migration path of an existing database.

Forwards copies nothing: the table becomes the partitioned table's legacy partition, a range
[MINVALUE, B) where B is the first WIDTH-day boundary after its newest row and after now.
A CHECK constraint matching that range, validated beforehand, lets Postgres attach it
without a second scan under its exclusive lock. New rows from B on go to the WIDTH-day
partitions; the legacy rows age out as before (row deletes) and the partition is dropped
once it has wholly expired. The parent gets every index of the old table under the old name,
so that Django's migrations keep finding them; the legacy partition's own indexes, renamed
with a `_legacy` suffix, are attached to them rather than built again.

Backwards moves the rows of every partition into one plain table again (a copy of what
arrived after the conversion, while the legacy partition exists) with the old names, indexes
and identity column.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from apps.core.partitions import (
    boundary_floor,
    ident,
    is_partitioned,
    partitions_ensure,
    partitions_list,
    storage_clause,
    timestamp_literal,
)

# Partitions made at the conversion beyond its boundary; beat's maintenance keeps as many
# days ahead afterwards (apps.history.services.partitions_maintain).
AHEAD_DAYS = 7


@dataclass(frozen=True)
class IndexDef:
    name: str
    definition: str  # pg_get_indexdef, or the constraint's definition for a constraint
    constraint: str  # "" for a plain index, else "p" (primary key) or "u" (unique)


def indexes_read(cursor, table: str) -> list[IndexDef]:
    cursor.execute(
        "SELECT i.relname, coalesce(pg_get_constraintdef(con.oid), pg_get_indexdef(i.oid)),"
        " coalesce(con.contype::text, '') FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " LEFT JOIN pg_constraint con ON con.conindid = i.oid AND con.conrelid = x.indrelid"
        " WHERE x.indrelid = %s::regclass ORDER BY i.relname",
        [table],
    )
    return [IndexDef(*row) for row in cursor.fetchall()]


def _index_rename(cursor, table: str, index: IndexDef, new_name: str) -> None:
    if index.constraint:
        cursor.execute(
            f"ALTER TABLE {ident(table)} RENAME CONSTRAINT {ident(index.name)} TO {ident(new_name)}"
        )
    else:
        cursor.execute(f"ALTER INDEX {ident(index.name)} RENAME TO {ident(new_name)}")


def _index_create(cursor, table: str, index: IndexDef) -> None:
    """`index`, read off `table` (as a plain or a partitioned table), made on it again."""
    if index.constraint:
        cursor.execute(
            f"ALTER TABLE {ident(table)} ADD CONSTRAINT {ident(index.name)} {index.definition}"
        )
    else:  # a partitioned table's index reads "ON ONLY": made here for every partition
        cursor.execute(index.definition.replace(" ON ONLY ", " ON ", 1))


def _index_drop(cursor, table: str, index: IndexDef) -> None:
    if index.constraint:
        cursor.execute(f"ALTER TABLE {ident(table)} DROP CONSTRAINT {ident(index.name)}")
    else:
        cursor.execute(f"DROP INDEX {ident(index.name)}")


def _holds(index: IndexDef, column: str) -> bool:
    """Whether `column` is among the columns of constraint `index` ("PRIMARY KEY (a, b)")."""
    columns = index.definition.partition("(")[2].rpartition(")")[0]
    return column in {c.strip().strip('"') for c in columns.split(",")}


def _legacy_name(name: str) -> str:
    return f"{name[:56]}_legacy"


def table_partition(cursor, table: str, *, key: str, width_days: int, now: datetime) -> None:
    """Make `table` partitioned by range of `key` (see the module's doc). Does nothing to a
    table that is partitioned already."""
    if is_partitioned(cursor, table):
        return
    legacy = f"{table}_legacy"
    cursor.execute(f"SELECT max({ident(key)}) FROM {ident(table)}")
    newest = cursor.fetchone()[0] or now
    boundary = boundary_floor(max(newest, now), width_days) + timedelta(days=width_days)
    id_next = _identity_drop(cursor, table)
    indexes = indexes_read(cursor, table)
    cursor.execute(f"ALTER TABLE {ident(table)} RENAME TO {ident(legacy)}")
    for index in indexes:
        _index_rename(cursor, legacy, index, _legacy_name(index.name))
    cursor.execute(
        f"CREATE TABLE {ident(table)} (LIKE {ident(legacy)} INCLUDING DEFAULTS"
        " INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)"
        f" PARTITION BY RANGE ({ident(key)})"
    )
    if id_next is not None:
        _sequence_attach(cursor, table, id_next)
    for index in indexes:
        if index.constraint != "p" or _holds(index, key):  # as a partitioned table's must
            _index_create(cursor, table, index)
    _legacy_attach(cursor, table, key=key, boundary=boundary)
    cursor.execute(
        f"CREATE TABLE {ident(table + '_default')} PARTITION OF {ident(table)} DEFAULT"
        f"{storage_clause(cursor, table)}"
    )
    partitions_ensure(
        cursor, table, key=key, width_days=width_days,
        start=boundary, end=max(boundary, now) + timedelta(days=AHEAD_DAYS),
    )  # fmt: skip


def _identity_drop(cursor, table: str) -> int | None:
    """Drop the identity of `table`.id, if it has one; returns the value it would have
    handed out next."""
    cursor.execute(
        "SELECT attidentity <> '' FROM pg_attribute"
        " WHERE attrelid = %s::regclass AND attname = 'id' AND NOT attisdropped",
        [table],
    )
    row = cursor.fetchone()
    if not (row and row[0]):
        return None
    cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id'))", [table])
    id_next = cursor.fetchone()[0]
    cursor.execute(f"ALTER TABLE {ident(table)} ALTER COLUMN id DROP IDENTITY")
    return id_next


def _sequence_attach(cursor, table: str, id_next: int) -> None:
    sequence = f"{table}_id_seq"
    cursor.execute(f"CREATE SEQUENCE {ident(sequence)} OWNED BY {ident(table)}.id")
    cursor.execute("SELECT setval(%s, %s, false)", [sequence, id_next])
    cursor.execute(f"ALTER TABLE {ident(table)} ALTER COLUMN id SET DEFAULT nextval('{sequence}')")


def _legacy_attach(cursor, table: str, *, key: str, boundary: datetime) -> None:
    legacy, check = ident(f"{table}_legacy"), ident(f"{table[:50]}_legacy_bound")
    bound = timestamp_literal(boundary)
    cursor.execute(
        f"ALTER TABLE {legacy} ADD CONSTRAINT {check}"
        f" CHECK ({ident(key)} IS NOT NULL AND {ident(key)} < {bound}) NOT VALID"
    )
    cursor.execute(f"ALTER TABLE {legacy} VALIDATE CONSTRAINT {check}")
    cursor.execute(
        f"ALTER TABLE {ident(table)} ATTACH PARTITION {legacy}"
        f" FOR VALUES FROM (MINVALUE) TO ({bound})"
    )
    # the partition's range holds it from now on; the check would only cost each insert
    cursor.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {check}")


def table_unpartition(cursor, table: str, *, identity: bool) -> None:
    """Make partitioned `table` one plain table again, its rows and names as before."""
    if not is_partitioned(cursor, table):
        return
    indexes = indexes_read(cursor, table)
    legacy = f"{table}_legacy"
    if any(p.name == legacy for p in partitions_list(cursor, table)):
        cursor.execute(f"ALTER TABLE {ident(table)} DETACH PARTITION {ident(legacy)}")
    else:
        cursor.execute(
            f"CREATE TABLE {ident(legacy)} (LIKE {ident(table)} INCLUDING DEFAULTS"
            " INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING COMPRESSION)"
        )
    for index in indexes_read(cursor, legacy):
        _index_drop(cursor, legacy, index)
    cursor.execute(f"INSERT INTO {ident(legacy)} SELECT * FROM {ident(table)}")
    if identity:  # a copied default names the sequence that goes with the partitioned table
        cursor.execute(f"ALTER TABLE {ident(legacy)} ALTER COLUMN id DROP DEFAULT")
    cursor.execute(f"DROP TABLE {ident(table)}")  # with its partitions and its id sequence
    cursor.execute(f"ALTER TABLE {ident(legacy)} RENAME TO {ident(table)}")
    for index in indexes:
        _index_create(cursor, table, index)
    if identity:
        _identity_restore(cursor, table)


def _identity_restore(cursor, table: str) -> None:
    name = ident(table)
    cursor.execute(f"SELECT coalesce(max(id), 0) + 1 FROM {name}")
    id_next = cursor.fetchone()[0]
    cursor.execute(f"ALTER TABLE {name} ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY")
    cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s, false)", [table, id_next])
    cursor.execute(f"ALTER TABLE {name} ADD CONSTRAINT {ident(table + '_pkey')} PRIMARY KEY (id)")
