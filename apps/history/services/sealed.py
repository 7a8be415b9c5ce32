"""Minute buckets of islands that hold sealed chunks, recomputed in Python.

A sealed chunk keeps its points encoded (apps/telemetry/services.py), so the rollup
statement's unnest (sql.py) sees none of them: it returns such islands instead, and
`sealed_minutes_recompute` rereads every chunk of each (sealed or not), decodes, and upserts
the island's minutes over what the statement wrote, in the same transaction. Islands like
these come from data late enough to find its window sealed (an agent's spool, a backfill),
or from a rebuild.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg

from apps.telemetry.arrays import arrays_as_numpy
from apps.telemetry.selectors import chunk_arrays

# The same chunks, and the same epoch-ms arithmetic, as the rollup statement's `chunks`.
_ISLAND_CHUNKS_SQL = """
SELECT i.node_id, i.metric_id, i.gpu, i.lo_ms, i.hi_ms,
       extract(epoch FROM c.t0)::float8 * 1000 AS e0_ms, c.offsets_ms, c.vals, c.ts_pco, c.vals_pco
FROM unnest(%s::int4[], %s::int4[], %s::int2[], %s::int8[], %s::int8[])
    AS i(node_id, metric_id, gpu, lo_ms, hi_ms)
CROSS JOIN LATERAL (
    SELECT t0, offsets_ms, vals, ts_pco, vals_pco FROM telemetry_chunk c
    WHERE c.node_id = i.node_id AND c.metric_id = i.metric_id AND c.gpu = i.gpu
      AND c.t0 < to_timestamp(i.hi_ms / 1000.0) AND c.t1 >= to_timestamp(i.lo_ms / 1000.0)
      AND c.t0 >= to_timestamp(i.lo_ms / 1000.0) - interval '1 day'
    OFFSET 0
) c
"""

_MINUTES_UPSERT_SQL = """
INSERT INTO history_sample_1m AS r (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)
SELECT node_id, metric_id, gpu, to_timestamp(k * 60), n, vsum, vmin, vmax
FROM unnest(%s::int4[], %s::int4[], %s::int2[], %s::int8[], %s::int8[], %s::float8[],
            %s::float8[], %s::float8[]) AS m(node_id, metric_id, gpu, k, n, vsum, vmin, vmax)
ORDER BY 1, 2, 3, 4
ON CONFLICT (node_id, metric_id, gpu, bucket) DO UPDATE SET
    n = EXCLUDED.n, vsum = EXCLUDED.vsum, vmin = EXCLUDED.vmin, vmax = EXCLUDED.vmax
"""


def sealed_minutes_recompute(cursor: Any, *, islands: list[list[int]]) -> list[tuple]:
    """Recompute the minutes of these islands ([node ids, metric ids, gpus, lo ms, hi ms])
    from all their chunks; returns the (node id, metric id, gpu, hour start as epoch
    seconds) of the minutes written, for the hour tier.

    Chunks are streamed and each is reduced to its minutes with numpy before the next is
    read: agents that resend a long stretch of the past (the soak's batches carry 33
    minutes each) make most islands sealed, and reading them all at once, a Python float
    per point, grew the periodic worker's heap (docs/faults.md, 10)."""
    if not islands:
        return []
    minutes: dict[tuple[int, int, int, int], list[float]] = {}
    with arrays_as_numpy(psycopg.Cursor(cursor.connection)) as chunks:
        for row in chunks.stream(_ISLAND_CHUNKS_SQL, islands, binary=True):
            node_id, metric_id, gpu, lo_ms, hi_ms, e0_ms, *stored = row
            offsets, values = chunk_arrays(*stored)
            stamps = e0_ms + offsets  # float ms, as the statement's `e0_ms + u.o`
            inside = (stamps >= lo_ms) & (stamps < hi_ms)
            if inside.any():
                _minutes_merge(
                    minutes,
                    series=(node_id, metric_id, gpu),
                    keys=np.floor(stamps[inside] / 60000).astype(np.int64),
                    values=values[inside],
                )
    if not minutes:
        return []
    columns: list[list] = [[] for _ in range(8)]
    for key, minute in sorted(minutes.items()):
        for column, item in zip(columns, (*key, *minute), strict=True):
            column.append(item)
    cursor.execute(_MINUTES_UPSERT_SQL, columns)
    return sorted({(*key[:3], key[3] * 60 // 3600 * 3600) for key in minutes})


def _minutes_merge(
    minutes: dict[tuple[int, int, int, int], list[float]],
    *,
    series: tuple[int, int, int],
    keys: np.ndarray,
    values: np.ndarray,
) -> None:
    """Add one chunk's points (minute keys, values) to `minutes`: [n, sum, min, max]."""
    found, inverse = np.unique(keys, return_inverse=True)
    counts = np.bincount(inverse, minlength=len(found))
    sums = np.bincount(inverse, weights=values, minlength=len(found))
    lows = np.full(len(found), np.inf)
    highs = np.full(len(found), -np.inf)
    np.minimum.at(lows, inverse, values)
    np.maximum.at(highs, inverse, values)
    for k, n, total, low, high in zip(
        found.tolist(), counts.tolist(), sums.tolist(), lows.tolist(), highs.tolist(),
        strict=True,
    ):  # fmt: skip
        minute = minutes.get((*series, k))
        if minute is None:
            minutes[(*series, k)] = [n, total, low, high]
        else:
            minute[0] += n
            minute[1] += total
            minute[2], minute[3] = min(minute[2], low), max(minute[3], high)
