"""Reads of telemetry: one series as raw points or time-bucketed aggregates."""

from __future__ import annotations

from django.db import connection

from apps.telemetry.models import HOST_GPU

# A raw (not yet compacted) chunk holds one batch, so it never starts long before its
# points; this bounds the index range scanned for a series.
MAX_CHUNK_SPAN = "1 day"

_CHUNKS = f"""
WITH c AS (
    SELECT extract(epoch FROM t0)::float8 AS e0, extract(epoch FROM t1)::float8 AS e1,
           n, vmin, vmax, vsum, offsets_ms, vals
    FROM telemetry_chunk
    WHERE node_id = %(node)s AND metric_id = %(metric)s AND gpu = %(gpu)s
      AND t0 < to_timestamp(%(end)s) AND t0 >= to_timestamp(%(start)s) - interval '{MAX_CHUNK_SPAN}'
      AND t1 >= to_timestamp(%(start)s)
), p AS (
    SELECT e0 + o / 1000.0 AS ts, v, e0, e1 FROM c, unnest(c.offsets_ms, c.vals) AS u(o, v)
)
"""

_RAW_SQL = (
    _CHUNKS
    + """
SELECT ts, v FROM p WHERE ts >= %(start)s AND ts < %(end)s ORDER BY ts LIMIT %(limit)s
"""
)

# Chunks that lie inside one bucket contribute their stored min/max/sum/count unopened.
_WHOLE = "floor(e0 / %(step)s) = floor(e1 / %(step)s) AND e0 >= %(start)s AND e1 < %(end)s"
_BUCKETS_SQL = (
    _CHUNKS
    + f"""
, parts AS (
    SELECT floor(e0 / %(step)s) * %(step)s AS b, n, vmin, vmax, vsum FROM c WHERE {_WHOLE}
    UNION ALL
    SELECT floor(ts / %(step)s) * %(step)s, 1, v, v, v FROM p
    WHERE NOT ({_WHOLE}) AND ts >= %(start)s AND ts < %(end)s
)
SELECT b, sum(vsum) / sum(n), min(vmin), max(vmax), sum(n)::int FROM parts
GROUP BY b ORDER BY b LIMIT %(limit)s
"""
)

MAX_POINTS = 100_000


def series_read(
    *, node_id: int, metric_id: int, gpu: int | None, start: float, end: float, step: float = 0
) -> list[list[float]]:
    """Points of one series in [start, end): `[[ts, value], …]` when step is 0, else
    `[[bucket start, avg, min, max, count], …]` per `step` seconds."""
    params = {
        "node": node_id,
        "metric": metric_id,
        "gpu": HOST_GPU if gpu is None else gpu,
        "start": start,
        "end": end,
        "step": step,
        "limit": MAX_POINTS,
    }
    with connection.cursor() as cursor:
        cursor.execute(_BUCKETS_SQL if step else _RAW_SQL, params)
        return [list(row) for row in cursor.fetchall()]


def metric_id_get(*, name: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM telemetry_metric WHERE name = %s", [name])
        row = cursor.fetchone()
    return row[0] if row else None


def chunk_storage() -> dict[str, int]:
    """Bytes on disk of the chunk table (heap, TOAST and indexes) and the samples it holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_total_relation_size('telemetry_chunk'),"
            " (SELECT coalesce(sum(n), 0) FROM telemetry_chunk),"
            " (SELECT count(*) FROM telemetry_chunk)"
        )
        total, samples, rows = cursor.fetchone()
    return {"bytes": total, "samples": int(samples), "rows": rows}
