"""Reads of telemetry: one series as raw points or time-bucketed aggregates, and which
series a node has, grouped by the scrape target (source) they came from."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection

from apps.telemetry.models import HOST_GPU, NodeHealth

# The agent stores every scraped series that is not a core contract metric as
# `<target>:<folded name>` (docs/agent.md), so the part before the first ':' names the
# scrape target when it is a target name; core and agent metrics (`gpu.util`) have none.
SOURCE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_SOURCE = re.compile(SOURCE_PATTERN)

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


def metric_of(*, source: str | None, name: str) -> str:
    """The stored metric name of `name` as scraped from target `source` (None: core)."""
    return f"{source}:{name}" if source else name


def source_of(metric: str) -> tuple[str | None, str]:
    """(source, name within it) of a stored metric name; (None, metric) for core ones."""
    head, sep, tail = metric.partition(":")
    if sep and tail and _SOURCE.match(head):
        return head, tail
    return None, metric


SeriesKey = tuple[str, int | None]  # (stored metric name, gpu or None for the host)


def series_grouped(*, series: Iterable[SeriesKey], source: str | None = None) -> dict[str, Any]:
    """`{"sources": [{"source", "series"}…], "series": [{"metric", "source", "name", "gpu"}…]}`:
    every source with its series count (core metrics under `None`, listed first), and the
    series of `source` (all series when None), sorted by name then GPU."""
    keys = sorted(set(series), key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    counts = Counter(source_of(metric)[0] for metric, _ in keys)
    listed = []
    for metric, gpu in keys:
        of, name = source_of(metric)
        if source is None or of == source:
            listed.append({"metric": metric, "source": of, "name": name, "gpu": gpu})
    return {
        "sources": [
            {"source": of, "series": counts[of]}
            for of in sorted(counts, key=lambda of: (of is not None, of or ""))
        ],
        "series": listed,
    }


def health_series(values_by_gpu: Mapping[int | None, Iterable[str]]) -> list[SeriesKey]:
    """Series keys from latest-health rows: metric names per GPU (None or HOST_GPU: host)."""
    return [
        (metric, None if gpu in (None, HOST_GPU) else gpu)
        for gpu, metrics in values_by_gpu.items()
        for metric in metrics
    ]


def node_series_list(*, node_id: int) -> list[SeriesKey]:
    """Every series the node ever sent: the latest-health rows keep the newest value of each
    (merged, never pruned while the node exists), one row per GPU and one for the host."""
    rows = NodeHealth.objects.filter(node_id=node_id).values_list("gpu", "values")
    return health_series({gpu: values.keys() for gpu, values in rows})


def series_known(*, node_id: int, metric: str, metric_id: int, gpu: int | None) -> bool:
    """Whether the node ever sent this series: its latest-health row names it, or (data
    written around the ingest path, e.g. seeded) a chunk of it exists."""
    gpu_key = HOST_GPU if gpu is None else gpu
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM telemetry_nodehealth"
            "  WHERE node_id = %(node)s AND gpu = %(gpu)s AND values ? %(metric)s)"
            " OR EXISTS (SELECT 1 FROM telemetry_chunk"
            "  WHERE node_id = %(node)s AND metric_id = %(metric_id)s AND gpu = %(gpu)s)",
            {"node": node_id, "gpu": gpu_key, "metric": metric, "metric_id": metric_id},
        )
        return cursor.fetchone()[0]


def source_known(*, node_id: int, source: str) -> bool:
    """Whether the node ever sent a series scraped from target `source`."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM telemetry_nodehealth h, jsonb_object_keys(h.values) k"
            " WHERE h.node_id = %s AND starts_with(k, %s))",
            [node_id, source + ":"],
        )
        return cursor.fetchone()[0]
