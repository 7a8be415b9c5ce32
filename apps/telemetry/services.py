"""Writes of telemetry: per-series sample chunks, latest health, compaction.

Layout of `telemetry_chunk` (created in migration 0002): one row holds the points of one
series (node, metric, gpu) — first as received, one row per series per batch, then merged
by `chunks_compact` into one row per series per TELEMETRY_CHUNK_SECONDS window. A row has
t0/t1, n, min/max/sum (coarse reads need not unpack), `offsets_ms int4[]` relative to t0
and `vals float8[]`: 12 B a point plus the row, which a 600-point chunk spreads to < 1 B.
Indexes: a B-tree on (node, metric, gpu, t0) — one entry per chunk, not per sample — for
series reads, and a BRIN on t0 for time-range scans and compaction.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from django.conf import settings
from django.db import connection, transaction

from apps.core.times import to_datetime
from apps.telemetry.models import HOST_GPU

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


Series = dict[tuple[int, str, int], list[tuple[float, float]]]


def samples_group(*, samples_by_node: dict[int, list[dict[str, Any]]]) -> Series:
    """Samples as series: (node id, metric name, gpu) → [(ts, value), …] in time order."""
    series: Series = defaultdict(list)
    for node_id, samples in samples_by_node.items():
        for sample in samples:
            gpu = sample.get("gpu")
            series[node_id, sample["metric"], HOST_GPU if gpu is None else gpu].append(
                (sample["ts"], sample["value"])
            )
    for points in series.values():
        points.sort()
    return series


class SamplesStored(NamedTuple):
    """What `samples_store` wrote: the sample count, and each series' (node id, metric id,
    gpu, first ts, last ts), for the caller to mark dirty for the history rollups."""

    count: int
    ranges: list[tuple[int, int, int, datetime, datetime]]


def samples_store(*, series: Series) -> SamplesStored:
    """COPY one chunk row per series (in the caller's transaction). Marking the ranges for
    the rollups is the caller's step (the ingest store step), so telemetry never calls into
    history."""
    if not series:
        return SamplesStored(0, [])
    ids = metric_ids(names={metric for _, metric, _ in series})
    count = 0
    dirty = []
    with (
        connection.connection.cursor() as cursor,
        cursor.copy(f"COPY telemetry_chunk {CHUNK_COLUMNS} FROM STDIN (FORMAT BINARY)") as copy,
    ):
        copy.set_types(CHUNK_TYPES)
        for (node_id, metric, gpu), points in series.items():
            t0 = points[0][0]
            vals = [float(value) for _, value in points]
            offsets = [round((ts - t0) * 1000) for ts, _ in points]
            copy.write_row(
                (
                    node_id,
                    ids[metric],
                    gpu,
                    to_datetime(t0),
                    to_datetime(points[-1][0]),
                    len(points),
                    min(vals),
                    max(vals),
                    sum(vals),
                    offsets,
                    vals,
                )
            )
            count += len(points)
            dirty.append((node_id, ids[metric], gpu, to_datetime(t0), to_datetime(points[-1][0])))
    return SamplesStored(count, dirty)


def health_update(*, series: Series) -> None:
    """Merge the newest value of each series into its node/GPU's latest-health row."""
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for (node_id, metric, gpu), points in series.items():
        ts, value = points[-1]
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


_COMPACT_SQL = """
WITH victims AS (
    DELETE FROM telemetry_chunk
    WHERE t0 >= %(start)s AND t0 < %(end)s AND NOT sealed
       OR (sealed AND t0 >= %(start)s AND t0 < %(end)s AND EXISTS (
           SELECT 1 FROM telemetry_chunk u
           WHERE u.t0 >= %(start)s AND u.t0 < %(end)s AND NOT u.sealed
             AND u.node_id = telemetry_chunk.node_id AND u.metric_id = telemetry_chunk.metric_id
             AND u.gpu = telemetry_chunk.gpu))
    RETURNING *
), points AS (
    SELECT v.node_id, v.metric_id, v.gpu, v.t0 + p.off * interval '1 millisecond' AS ts, p.val
    FROM victims v, unnest(v.offsets_ms, v.vals) AS p(off, val)
), binned AS (
    SELECT *, date_bin(%(width)s, ts, 'epoch') AS bucket FROM points
), merged AS (
    SELECT node_id, metric_id, gpu, bucket, min(ts) AS t0, max(ts) AS t1, count(*) AS n,
           min(val) AS vmin, max(val) AS vmax, sum(val) AS vsum,
           array_agg(ts ORDER BY ts) AS tss, array_agg(val ORDER BY ts) AS vals
    FROM binned GROUP BY node_id, metric_id, gpu, bucket
)
INSERT INTO telemetry_chunk (node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed,
                             offsets_ms, vals)
SELECT node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, bucket < %(end)s,
       ARRAY(SELECT round(extract(epoch FROM x - t0) * 1000)::int4 FROM unnest(tss) AS x),
       vals
FROM merged
"""


def chunks_compact(*, now: datetime, lookback_windows: int = 6) -> int:
    """Merge the per-batch chunks of each finished window into one sealed chunk per series.

    Late rows in an already sealed window are merged with it the next time round. Returns
    the number of rows written."""
    width = settings.TELEMETRY_CHUNK_SECONDS
    grace = 60
    end_ts = (int(now.timestamp()) - grace) // width * width
    written = 0
    for index in range(lookback_windows, 0, -1):
        start = to_datetime(end_ts - index * width)
        end = to_datetime(end_ts - (index - 1) * width)
        with transaction.atomic(), connection.cursor() as cursor:
            # one compactor at a time; a second one (overlapping beat ticks) just skips
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [COMPACT_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return written
            cursor.execute(_COMPACT_SQL, {"start": start, "end": end, "width": f"{width} seconds"})
            written += cursor.rowcount
    return written
