"""Writes of telemetry: per-series sample chunks, latest health, compaction.

Layout of `telemetry_chunk` (created in migration 0002, encoded columns in 0003): one row
holds the points of one series (node, metric, gpu) — first as received, one row per series
per batch, then merged by `chunks_compact` into one sealed row per series per
TELEMETRY_CHUNK_SECONDS window. A row has t0/t1, n, min/max/sum (coarse reads need not
unpack). An unsealed row keeps its points as `offsets_ms int4[]` relative to t0 and
`vals float8[]` (12 B a point: cheap to write and to unnest in SQL); a sealed row keeps them
encoded by apps/core/codec.py (pcodec) in `ts_pco` and `vals_pco`, its arrays empty, which
brings a 600-point chunk to ≈ 0.1 B a point for regular timestamps and 0.1–2 B for values.
Encoded points are decoded in Python (`chunk_arrays`, `chunk_points` in selectors; SQL reads
that unnest arrays see none of them, so each such read also decodes its sealed chunks).
Indexes: a B-tree on (node, metric, gpu, t0) — one entry per chunk, not per sample — for
series reads, a B-tree on (node, t1) for the recent chunks of a node (the detectors' kept
window), and a BRIN on t0 for time-range scans and compaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np
import orjson
from django.conf import settings
from django.db import connection, transaction

from apps.core.codec import floats_decode, floats_encode, ints_decode, ints_encode
from apps.core.db import server_cursor
from apps.core.times import to_datetime
from apps.telemetry.arrays import arrays_as_numpy
from apps.telemetry.changes import samples_mark_changed
from apps.telemetry.chunk_copy import SeriesRanges, chunk_rows_binary
from apps.telemetry.columns import SampleColumns, columns_from_dicts

CHUNK_COLUMNS = "(node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, offsets_ms, vals)"
COMPACT_LOCK_KEY = 0x0B5C0
CHUNK_TYPES = [
    "int4",
    "int4",
    "int2",
    "timestamptz",
    "timestamptz",
    "int4",
    "float8",
    "float8",
    "float8",
    "int4[]",
    "float8[]",
]
SEALED_COLUMNS = (
    "(node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed, offsets_ms, vals,"
    " ts_pco, vals_pco)"
)
SEALED_TYPES = [*CHUNK_TYPES[:9], "bool", *CHUNK_TYPES[9:], "bytea", "bytea"]


def metric_ids(*, names: Iterable[str]) -> dict[str, int]:
    """Ids of these metric names, creating the missing ones (one round trip)."""
    wanted = sorted(set(names))  # sorted: concurrent workers insert in the same order
    if not wanted:
        return {}
    with connection.cursor() as cursor:
        # The final SELECT does not see the CTE's inserts (one snapshot), hence the UNION.
        cursor.execute(
            "WITH wanted AS (SELECT unnest(%s::text[]) AS name),"
            " created AS (INSERT INTO telemetry_metric (name) SELECT name FROM wanted"
            "   ON CONFLICT (name) DO NOTHING RETURNING name, id)"
            " SELECT name, id FROM created"
            " UNION ALL SELECT m.name, m.id FROM telemetry_metric m JOIN wanted USING (name)",
            [wanted],
        )
        ids = dict(cursor.fetchall())
        missing = [name for name in wanted if name not in ids]
        if missing:
            # Another transaction inserted these names concurrently: our INSERT waited for
            # it and did nothing, but the statement's snapshot predates its commit. A new
            # statement (READ COMMITTED) sees them.
            cursor.execute("SELECT name, id FROM telemetry_metric WHERE name = ANY(%s)", [missing])
            ids.update(cursor.fetchall())
        return ids


def samples_group(*, samples_by_node: dict[int, list[dict[str, Any]]]) -> SampleColumns:
    """Samples (the contract's objects) as series of columns, sorted by (ts, value)."""
    return columns_from_dicts(samples_by_node.items())


class SamplesStored(NamedTuple):
    """What `samples_store` wrote: the sample count, and each series' (node id, metric id,
    gpu, first ts, last ts), for the caller to mark dirty for the history rollups."""

    count: int
    ranges: SeriesRanges


def samples_store(*, series: SampleColumns) -> SamplesStored:
    """COPY one chunk row per series (in the caller's transaction), and each node's span in
    the sample change log (apps.telemetry.changes). Marking the ranges for the rollups is the
    caller's step (the ingest store step), so telemetry never calls into history."""
    if not series.keys:
        return SamplesStored(0, SeriesRanges.empty())
    rows = chunk_rows_binary(
        series=series, metric_ids=metric_ids(names={metric for _, metric, _ in series.keys})
    )
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY telemetry_chunk {CHUNK_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.write(rows.stream)
    samples_mark_changed(ranges=rows.ranges)
    return SamplesStored(rows.count, rows.ranges)


def health_update(*, series: SampleColumns) -> None:
    """Merge the newest value of each series into its node/GPU's latest-health row."""
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for (node_id, metric, gpu), (ts, value) in zip(series.keys, series.latest, strict=True):
        entry = latest.setdefault((node_id, gpu), {"ts": ts, "values": {}})
        entry["values"][metric] = value
        entry["ts"] = max(entry["ts"], ts)
    if not latest:
        return
    rows = [
        {"node_id": node_id, "gpu": gpu, "ts": entry["ts"], "values": entry["values"]}
        for (node_id, gpu), entry in sorted(latest.items())  # sorted: no deadlocks
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO telemetry_nodehealth (node_id, gpu, ts, values)"
            " SELECT node_id, gpu, to_timestamp(ts), values"
            " FROM jsonb_to_recordset(%s::jsonb)"
            "  AS r(node_id int, gpu int, ts float8, values jsonb)"
            " ON CONFLICT (node_id, gpu) DO UPDATE SET"
            "  values = CASE WHEN EXCLUDED.ts >= telemetry_nodehealth.ts"
            "    THEN telemetry_nodehealth.values || EXCLUDED.values"
            "    ELSE EXCLUDED.values || telemetry_nodehealth.values END,"
            "  ts = GREATEST(telemetry_nodehealth.ts, EXCLUDED.ts)",
            [orjson.dumps(rows).decode()],
        )


# The series to compact in a window, with the points of all their rows there: those with an
# unsealed (per-batch) row starting in it. Each one's sealed row there, if any, merges with
# its late rows: read, merged, rewritten.
_SERIES_TO_COMPACT_SQL = """
SELECT node_id, metric_id, gpu, sum(n) FROM telemetry_chunk
WHERE t0 >= %(start)s AND t0 < %(end)s
GROUP BY node_id, metric_id, gpu HAVING bool_or(NOT sealed)
"""
_VICTIMS_SQL = """
DELETE FROM telemetry_chunk c
USING unnest(%(nodes)s::int4[], %(metrics)s::int4[], %(gpus)s::int2[]) AS s(node_id, metric_id, gpu)
WHERE c.node_id = s.node_id AND c.metric_id = s.metric_id AND c.gpu = s.gpu
  AND c.t0 >= %(start)s AND c.t0 < %(end)s
RETURNING c.node_id, c.metric_id, c.gpu, (extract(epoch FROM c.t0) * 1000000)::int8,
          c.offsets_ms, c.vals, c.ts_pco, c.vals_pco
"""
# Points merged per statement, in whole series: what a statement holds in memory (numpy
# arrays, 12 B a point as fetched; ≈ 80 B as Python lists, before arrays_as_numpy).
# Bounded by series alone (5,000 a statement) a soak at 20 k samples/s held a whole
# 10-minute window at once, and the periodic worker's RSS went 823 → 1,709 MiB in 3
# minutes (docs/faults.md, 10).
COMPACT_POINTS_BATCH = 1_000_000
COMPACT_GRACE_S = 60  # a window is compacted once it ended this long ago (late batches)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def chunks_compact(
    *, now: datetime, lookback_windows: int = 6, points_batch: int = COMPACT_POINTS_BATCH
) -> int:
    """Merge the per-batch chunks of each finished window into one sealed, encoded chunk per
    series (points a batch carried past the window's end stay in an unsealed chunk).

    Late rows in an already sealed window are merged with it the next time round: its sealed
    row is deleted, decoded and rewritten with them, in the same transaction (exactly once).
    A statement merges whole series of about `points_batch` points. Returns the number of
    rows written."""
    width = settings.TELEMETRY_CHUNK_SECONDS
    end_ts = (int(now.timestamp()) - COMPACT_GRACE_S) // width * width
    written = 0
    for index in range(lookback_windows, 0, -1):
        window = {
            "start": to_datetime(end_ts - index * width),
            "end": to_datetime(end_ts - (index - 1) * width),
        }
        # arrays load as numpy: a statement's million points are not 2 M Python objects
        with transaction.atomic(), arrays_as_numpy(server_cursor()) as cursor:
            # one compactor at a time; a second one (overlapping beat ticks) just skips
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [COMPACT_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return written
            cursor.execute(_SERIES_TO_COMPACT_SQL, window)
            for keys in series_groups(cursor.fetchall(), points=points_batch):
                written += _series_compact(cursor, keys=keys, window=window, width=width)
    return written


def series_groups(series: list[tuple], *, points: int) -> Iterable[list[tuple]]:
    """(node, metric, gpu, points) rows in groups of whole series holding about `points`
    points at most (a series larger than that alone)."""
    group: list[tuple] = []
    held = 0
    for node_id, metric_id, gpu, count in series:
        if group and held + count > points:
            yield group
            group, held = [], 0
        group.append((node_id, metric_id, gpu))
        held += count
    if group:
        yield group


def _series_compact(cursor: Any, *, keys: list[tuple], window: dict[str, Any], width: int) -> int:
    """Delete every row of these series starting in the window and write them back merged:
    one row per series per window-wide bucket, encoded when the bucket is in the window."""
    nodes, metrics, gpus = (list(column) for column in zip(*keys, strict=True))
    params = {**window, "nodes": nodes, "metrics": metrics, "gpus": gpus}
    cursor.execute(_VICTIMS_SQL, params, binary=True)  # binary: arrays and bytes parse fast
    victims: dict[tuple[int, int, int], list[tuple]] = defaultdict(list)
    for row in cursor.fetchall():
        victims[row[0], row[1], row[2]].append(row[3:])
    width_us = width * 1_000_000
    end_us = round((window["end"] - _EPOCH).total_seconds()) * 1_000_000
    written = 0
    with cursor.copy(f"COPY telemetry_chunk {SEALED_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(SEALED_TYPES)
        for key, rows in victims.items():
            for row in _merged_rows(rows, width_us=width_us, end_us=end_us):
                copy.write_row((*key, *row))
                written += 1
    return written


def _merged_rows(victims: list[tuple], *, width_us: int, end_us: int) -> Iterable[tuple]:
    """A series' chunk rows (t0 in µs, offsets, values, encoded offsets, encoded values)
    merged in time order and cut at window-wide buckets from the epoch: COPY rows from t0."""
    parts = [_points_us(*victim) for victim in victims]
    stamps = np.concatenate([part[0] for part in parts])
    values = np.concatenate([part[1] for part in parts])
    order = np.argsort(stamps, kind="stable")  # stable: replayed equal stamps keep their order
    stamps, values = stamps[order], values[order]
    cuts = np.flatnonzero(np.diff(stamps // width_us)) + 1
    for us, vals in zip(np.split(stamps, cuts), np.split(values, cuts), strict=True):
        offsets = (us - us[0] + 500) // 1000  # whole ms, rounded half up (as SQL's round)
        sealed = bool(us[0] // width_us * width_us < end_us)
        encoded = (ints_encode(offsets), floats_encode(vals)) if sealed else (None, None)
        yield (
            _EPOCH + timedelta(microseconds=int(us[0])),
            _EPOCH + timedelta(microseconds=int(us[-1])),
            len(vals),
            float(vals.min()),
            float(vals.max()),
            float(vals.sum()),
            sealed,
            [] if sealed else offsets.tolist(),
            [] if sealed else vals.tolist(),
            *encoded,
        )


def _points_us(
    t0_us: int,
    offsets: np.ndarray,
    vals: np.ndarray,
    ts_pco: bytes | None,
    vals_pco: bytes | None,
) -> tuple[np.ndarray, np.ndarray]:
    """(µs since the epoch, values) of one stored chunk, encoded or not."""
    if ts_pco is not None and vals_pco is not None:
        return t0_us + ints_decode(ts_pco) * 1000, floats_decode(vals_pco)
    return t0_us + np.asarray(offsets, dtype=np.int64) * 1000, np.asarray(vals, dtype=np.float64)
