"""The rollup pass's SQL: claimed dirty ranges → minute islands → minute buckets recomputed
from raw data → coarser buckets recomputed from the minutes (layout in ../services).

Tiers: samples per series at 1 minute and 1 hour; step reports per run and rank at 10
seconds, 1 minute, 10 minutes and 1 hour (`history_step_*`), and per run, every rank summed,
at 10 seconds, 1 minute and 1 hour (`history_runstep_*`). The 10-second and minute buckets of
an island come from one read of its raw reports; a run-level bucket is built from the rank
buckets the same statement recomputed (an island covers whole minutes of a run, so it
returns every rank that reported in them); 10-minute and hour buckets are recomputed from
the minutes of every hour the round touched.
"""

# Claimed ranges → disjoint islands of whole minutes per key, in epoch seconds. A range
# starting at or before the running end of the earlier ones of its key joins their island.
_ISLANDS = """
ranges AS (
    SELECT {key}, greatest(floor(extract(epoch FROM t0)::float8 / 60) * 60, %(floor)s) AS lo,
           floor(extract(epoch FROM t1)::float8 / 60) * 60 + 60 AS hi
    FROM claimed WHERE extract(epoch FROM t1)::float8 >= %(floor)s
), flagged AS (
    SELECT *, CASE WHEN lo <= max(hi) OVER (PARTITION BY {key} ORDER BY lo, hi
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS starts
    FROM ranges
), numbered AS (
    SELECT *, sum(starts) OVER (PARTITION BY {key} ORDER BY lo, hi ROWS UNBOUNDED PRECEDING)
              AS island
    FROM flagged
), islands AS (
    SELECT {key}, min(lo) AS lo, max(hi) AS hi FROM numbered GROUP BY {key}, island
)"""

_CLAIM = """
claimed AS (
    DELETE FROM {table}
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} LIMIT %(limit)s))
    RETURNING *
)"""

# The isolated path (a round failed on bad data, see ../services): the dirty rows are claimed
# first, then rolled up a group at a time by the same statements over rows given as arrays.
CLAIM_SERIES_SQL = f"""
WITH {_CLAIM.format(table="history_dirty_series")}
SELECT node_id, metric_id, gpu, t0, t1 FROM claimed"""
CLAIM_RUNS_SQL = f"""
WITH {_CLAIM.format(table="history_dirty_run")}
SELECT run_id, t0, t1 FROM claimed"""
_GIVEN_SERIES = """
claimed AS (
    SELECT * FROM unnest(%(node_ids)s::int4[], %(metric_ids)s::int4[], %(gpus)s::int2[],
                         %(t0s)s::timestamptz[], %(t1s)s::timestamptz[])
        AS c(node_id, metric_id, gpu, t0, t1)
)"""
_GIVEN_RUNS = """
claimed AS (
    SELECT * FROM unnest(%(run_ids)s::int8[], %(t0s)s::timestamptz[], %(t1s)s::timestamptz[])
        AS c(run_id, t0, t1)
)"""

# Touched hours come back as arrays for the second statement (which must see these minutes).
_HOURS_RETURNED = """
SELECT (SELECT count(*) FROM claimed), {arrays}
FROM (SELECT DISTINCT {key}, date_trunc('hour', bucket) AS hour FROM upserted) h
"""

SERIES_KEY = "node_id, metric_id, gpu"


def _sample_minutes(claimed: str) -> str:
    return f"""
WITH {claimed},
{_ISLANDS.format(key=SERIES_KEY)},
chunks AS (
    SELECT i.node_id, i.metric_id, i.gpu, i.lo * 1000 AS lo_ms, i.hi * 1000 AS hi_ms,
           extract(epoch FROM c.t0)::float8 * 1000 AS e0_ms, c.offsets_ms, c.vals, c.encoded,
           c.n, c.vsum, c.vmin, c.vmax
    FROM islands i CROSS JOIN LATERAL (
        SELECT t0, offsets_ms, vals, ts_pco IS NOT NULL AS encoded, n, vsum, vmin, vmax
        FROM telemetry_chunk c
        WHERE c.node_id = i.node_id AND c.metric_id = i.metric_id AND c.gpu = i.gpu
          AND c.t0 < to_timestamp(i.hi) AND c.t1 >= to_timestamp(i.lo)
          -- an uncompacted chunk holds one batch: it never starts long before its points
          AND c.t0 >= to_timestamp(i.lo) - interval '1 day'
        OFFSET 0
    ) c
), spans AS (
    -- a chunk's first and last point in ms, as the unnest below computes them (offsets are
    -- in time order); whole: all its points lie in one minute of its island, and its sum is
    -- finite (a row stored before the input bounds may hold an infinite one: its points
    -- then overflow the minute's sum, and the round sets that series aside)
    SELECT *, coalesce(
        NOT encoded AND first_ms >= lo_ms AND last_ms < hi_ms
        AND floor(first_ms / 60000) = floor(last_ms / 60000)
        AND abs(vsum) < 'Infinity'::float8, false) AS whole
    FROM (SELECT *, e0_ms + offsets_ms[1] AS first_ms,
                 e0_ms + offsets_ms[array_upper(offsets_ms, 1)] AS last_ms FROM chunks) c
), parts AS (
    -- a whole chunk counts with its own n, sum, min and max: unnesting 10-point chunks one
    -- by one was half the pass's CPU; the others go point by point
    SELECT node_id, metric_id, gpu, floor(first_ms / 60000) AS k, n, vsum, vmin, vmax
    FROM spans WHERE whole
    UNION ALL
    SELECT node_id, metric_id, gpu, floor((e0_ms + u.o) / 60000), 1, u.v, u.v, u.v
    FROM spans CROSS JOIN LATERAL unnest(spans.offsets_ms, spans.vals) AS u(o, v)
    WHERE NOT whole AND e0_ms + u.o >= lo_ms AND e0_ms + u.o < hi_ms
), minutes AS (
    SELECT node_id, metric_id, gpu, k, sum(n) AS n, sum(vsum) AS vsum, min(vmin) AS vmin,
           max(vmax) AS vmax
    FROM parts GROUP BY node_id, metric_id, gpu, k
), upserted AS (
    INSERT INTO history_sample_1m AS r (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)
    SELECT node_id, metric_id, gpu, to_timestamp(k * 60), n, vsum, vmin, vmax FROM minutes
    ORDER BY 1, 2, 3, 4  -- key order: a series' minutes share heap pages
    ON CONFLICT (node_id, metric_id, gpu, bucket) DO UPDATE SET
        n = EXCLUDED.n, vsum = EXCLUDED.vsum, vmin = EXCLUDED.vmin, vmax = EXCLUDED.vmax
    RETURNING node_id, metric_id, gpu, bucket
), sealed AS (
    SELECT DISTINCT node_id, metric_id, gpu, lo_ms, hi_ms FROM chunks WHERE encoded
)
{
        _HOURS_RETURNED.format(
            key=SERIES_KEY,
            arrays="array_agg(node_id), array_agg(metric_id), array_agg(gpu), array_agg(hour), "
            + _SEALED_ISLANDS,
        )
    }"""


# Islands holding sealed (encoded) chunks, whose points SQL cannot unnest: their minutes are
# recomputed in Python from every chunk of the island (apps/history/services/sealed.py).
_SEALED_ISLANDS = """(SELECT array[array_agg(node_id), array_agg(metric_id), array_agg(gpu),
                array_agg(lo_ms::int8), array_agg(hi_ms::int8)] FROM sealed)"""


SAMPLE_MINUTES_SQL = _sample_minutes(_CLAIM.format(table="history_dirty_series"))
SAMPLE_MINUTES_GIVEN_SQL = _sample_minutes(_GIVEN_SERIES)

SAMPLE_HOURS_SQL = """
INSERT INTO history_sample_1h (node_id, metric_id, gpu, bucket, n, vsum, vmin, vmax)
SELECT h.node_id, h.metric_id, h.gpu, h.hour, sum(m.n), sum(m.vsum), min(m.vmin), max(m.vmax)
FROM unnest(%s::int4[], %s::int4[], %s::int2[], %s::timestamptz[]) AS h(node_id, metric_id, gpu,
                                                                           hour)
CROSS JOIN LATERAL (
    SELECT n, vsum, vmin, vmax FROM history_sample_1m m
    WHERE m.node_id = h.node_id AND m.metric_id = h.metric_id AND m.gpu = h.gpu
      AND m.bucket >= h.hour AND m.bucket < h.hour + interval '1 hour'
    OFFSET 0
) m
WHERE h.hour >= to_timestamp(%s)
GROUP BY h.node_id, h.metric_id, h.gpu, h.hour
ON CONFLICT (node_id, metric_id, gpu, bucket) DO UPDATE SET
    n = EXCLUDED.n, vsum = EXCLUDED.vsum, vmin = EXCLUDED.vmin, vmax = EXCLUDED.vmax
"""

# Step rollups: (sum, count) per optional stage so means skip reports that left it out.
STEP_SUMS = ("data_time", "h2d_time", "compute_time", "comm_wait")
STEP_COLUMNS = (
    "n, max_step, step_time_sum, step_time_max, tokens_sum, loss_sum, loss_n, "
    + ", ".join(f"{stage}_sum, {stage}_n" for stage in STEP_SUMS)
)
# per rank, also the step time less collective wait: the rank's own work (the heat-map)
RANK_COLUMNS = STEP_COLUMNS + ", busy_sum"
_RANK_RAW_AGGREGATES = (
    "count(*), max(step), sum(step_time), max(step_time), sum(tokens), sum(loss), count(loss), "
    + ", ".join(f"sum({stage}), count({stage})" for stage in STEP_SUMS)
    + ", sum(step_time - coalesce(comm_wait, 0))"
)
_STEP_ROLLUP_AGGREGATES = (
    "sum(n), max(max_step), sum(step_time_sum), max(step_time_max), sum(tokens_sum), "
    "sum(loss_sum), sum(loss_n), "
    + ", ".join(f"sum({stage}_sum), sum({stage}_n)" for stage in STEP_SUMS)
)
_RANK_ROLLUP_AGGREGATES = _STEP_ROLLUP_AGGREGATES + ", sum(busy_sum)"


# New rank rows are written in primary-key order (run, bucket, rank): a range read of every
# rank (the heat-map) then visits a few heap pages, not one per row as a hash aggregate's
# order left them (a 15-minute read of 256 ranks: 23 k pages).
_IN_KEY_ORDER = "ORDER BY 1, 3, 2"


def _update(columns: str) -> str:
    return ", ".join(f"{c} = EXCLUDED.{c}" for c in columns.split(", "))


def _bucket_of(column: str, seconds: int) -> str:
    return f"to_timestamp(floor(extract(epoch FROM {column})::float8 / {seconds}) * {seconds})"


def _rank_upsert(*, table: str, seconds: int) -> str:
    """Per rank `seconds`-wide buckets of the island's raw reports, upserted; the new rows
    come back for the run-level table."""
    return f"""
    INSERT INTO {table} (run_id, rank, bucket, {RANK_COLUMNS})
    SELECT run_id, rank, {_bucket_of("ts", seconds)}, {_RANK_RAW_AGGREGATES} FROM raw
    GROUP BY 1, 2, 3 {_IN_KEY_ORDER}
    ON CONFLICT (run_id, bucket, rank) DO UPDATE SET {_update(RANK_COLUMNS)}
    RETURNING run_id, bucket, {STEP_COLUMNS}"""


def _run_upsert(*, table: str, ranks: str) -> str:
    """The run-level buckets, from rank buckets just recomputed (`ranks`: their CTE)."""
    return f"""
    INSERT INTO {table} (run_id, bucket, ranks, {STEP_COLUMNS})
    SELECT run_id, bucket, count(*), {_STEP_ROLLUP_AGGREGATES} FROM {ranks}
    GROUP BY run_id, bucket
    ON CONFLICT (run_id, bucket) DO UPDATE SET ranks = EXCLUDED.ranks, {_update(STEP_COLUMNS)}"""


def _step_minutes(claimed: str) -> str:
    return f"""
WITH {claimed},
{_ISLANDS.format(key="run_id")},
raw AS MATERIALIZED (
    SELECT s.* FROM islands i CROSS JOIN LATERAL (
        SELECT run_id, rank, ts, step, step_time, tokens, loss, {", ".join(STEP_SUMS)}
        FROM runs_stepreport s
        WHERE s.run_id = i.run_id AND s.ts >= to_timestamp(i.lo) AND s.ts < to_timestamp(i.hi)
        OFFSET 0
    ) s
),
upserted AS ({_rank_upsert(table="history_step_1m", seconds=60)}),
rank_tens AS ({_rank_upsert(table="history_step_10s", seconds=10)}),
run_minutes AS ({_run_upsert(table="history_runstep_1m", ranks="upserted")}),
run_tens AS ({_run_upsert(table="history_runstep_10s", ranks="rank_tens")})
{_HOURS_RETURNED.format(key="run_id", arrays="array_agg(run_id), array_agg(hour)")}"""


STEP_MINUTES_SQL = _step_minutes(_CLAIM.format(table="history_dirty_run"))
STEP_MINUTES_GIVEN_SQL = _step_minutes(_GIVEN_RUNS)

# The touched hours' minutes, read once per hour, make its 10-minute and hour buckets per
# rank; the run-level hour comes from the run-level minutes.
STEP_COARSER_SQL = f"""
WITH touched AS (
    SELECT * FROM unnest(%(runs)s::int8[], %(hours)s::timestamptz[]) AS h(run_id, hour)
    WHERE h.hour >= to_timestamp(%(floor)s)
), minutes AS MATERIALIZED (
    SELECT h.run_id, h.hour, m.* FROM touched h CROSS JOIN LATERAL (
        SELECT rank, bucket, {RANK_COLUMNS} FROM history_step_1m m
        WHERE m.run_id = h.run_id AND m.bucket >= h.hour AND m.bucket < h.hour + interval '1 hour'
        OFFSET 0
    ) m
), tens AS (
    INSERT INTO history_step_10m (run_id, rank, bucket, {RANK_COLUMNS})
    SELECT run_id, rank, to_timestamp(floor(extract(epoch FROM bucket)::float8 / 600) * 600),
           {_RANK_ROLLUP_AGGREGATES}
    FROM minutes GROUP BY 1, 2, 3 {_IN_KEY_ORDER}
    ON CONFLICT (run_id, bucket, rank) DO UPDATE SET {_update(RANK_COLUMNS)}
), hours AS (
    INSERT INTO history_step_1h (run_id, rank, bucket, {RANK_COLUMNS})
    SELECT run_id, rank, hour, {_RANK_ROLLUP_AGGREGATES} FROM minutes GROUP BY 1, 2, 3
    {_IN_KEY_ORDER}
    ON CONFLICT (run_id, bucket, rank) DO UPDATE SET {_update(RANK_COLUMNS)}
)
INSERT INTO history_runstep_1h (run_id, bucket, ranks, {STEP_COLUMNS})
SELECT h.run_id, h.hour, max(m.ranks), {_STEP_ROLLUP_AGGREGATES}
FROM touched h CROSS JOIN LATERAL (
    SELECT * FROM history_runstep_1m m
    WHERE m.run_id = h.run_id AND m.bucket >= h.hour AND m.bucket < h.hour + interval '1 hour'
    OFFSET 0
) m
GROUP BY h.run_id, h.hour
ON CONFLICT (run_id, bucket) DO UPDATE SET ranks = EXCLUDED.ranks, {_update(STEP_COLUMNS)}
"""
