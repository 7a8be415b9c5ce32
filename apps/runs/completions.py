"""Step completions: each completion of a step number, its medians over the ranks that
reported it, kept per run so that goodput reads one row a step, not one a report.

A completion (detectors.goodput.Completion) is one step number in one epoch (between two
restarts): the median end time, step time and data time of its reports, and the earliest
start of a rank's step. Goodput reads the run's last ALERT_STEP_WINDOW steps of them: at
16,384 ranks that was 2 M reports and three sorts a step, seconds a read.

Writes: `steps_store` marks the steps it stored (`runs_completiondirty`: run, first and last
step) in ingest's transaction (apps.runs.changes), and `completions_refresh` (a periodic task, every
STEP_COMPLETIONS_INTERVAL) claims the marks, merges them into islands of step numbers per
run and recomputes those steps' completions from every raw report of those numbers, in one
transaction: a reader sees either the mark or the new rows. Recomputed, never merged, so a
re-run or a late report cannot double count.

Reads (`COMPLETIONS_SQL`, one statement, one snapshot): stored completions for steps with no
mark, and the raw medians for steps still marked or whose stored rows no longer fit the
reader's restarts (a restart event that arrived after the refresh: its row straddles it, or
two rows of one step fall in one epoch). So a read is always what the raw reports say, and
costs the window's rows plus what arrived since the last refresh.
"""

from __future__ import annotations

from django.db import connection, transaction

COMPLETIONS_LOCK_KEY = 0x0B5C3
# Marks a refresh claims: ingest writes one per batch and run, ~2,000 a second for a
# 16,384-rank run on 2,048 nodes; a claim of this many is a few seconds of it.
CLAIM_MARKS = 50_000
# The most step numbers one island recomputes in one statement: a batch naming step 1 and a
# step far ahead makes one wide island, read a slice at a time.
ISLAND_STEPS = 1_000

# Per completion from reports (a relation of run_id, step, ts, step_time, data_time,
# h2d_time, tokens): detectors.goodput.completions' medians and the earliest start of a rank's
# step, and the tokens of them all (the run summary's tokens/s). date_part, not extract: the
# same float8 seconds without a numeric per report.
_PER_COMPLETION = """
    SELECT {key}, {extra}
           percentile_cont(0.5) WITHIN GROUP (ORDER BY e) AS e,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY step_time) AS step_time,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY data) AS data,
           min(e - step_time) AS first_start, sum(tokens)::int8 AS tokens
    FROM (
        SELECT {key}, {extra_columns} date_part('epoch', ts) AS e, step_time, tokens,
               coalesce(data_time, 0) + coalesce(h2d_time, 0) AS data
        FROM (SELECT *, width_bucket(date_part('epoch', ts), {bounds}) AS epoch
              FROM {reports}) r
    ) s
    GROUP BY {key}"""

# The restarts a refresh splits completions at: every `restart` event of the run, and the one
# inferred from its step counter going back (detectors.goodput.restarts_of, INFERRED_AFTER_S),
# with +infinity last for width_bucket. Readers may count fewer (their event window): a row
# they would split is read raw (above).
_RESTARTS = """
    SELECT r.id AS run_id, ARRAY(
        SELECT x FROM (
            SELECT date_part('epoch', e.ts) AS x FROM runs_runevent e
            WHERE e.run_id = r.id AND e.kind = 'restart'
            UNION ALL
            SELECT date_part('epoch', r.timeline_after) + 0.5e-6
            WHERE r.timeline_after IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM runs_runevent e WHERE e.run_id = r.id AND e.kind = 'restart'
                AND e.ts > r.timeline_after)
        ) x ORDER BY x
    ) || 'infinity'::float8 AS bounds
    FROM runs_run r WHERE r.id = ANY(%(runs)s::int8[])"""

# Claimed marks → disjoint islands of step numbers per run (a mark touching or overlapping
# the running end of the earlier ones of its run joins their island), cut into slices of at
# most ISLAND_STEPS numbers.
_CLAIM_SQL = f"""
WITH claimed AS (
    DELETE FROM runs_completiondirty
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM runs_completiondirty LIMIT %(limit)s))
    RETURNING run_id, s0, s1
), flagged AS (
    SELECT *, CASE WHEN s0 <= max(s1) OVER (PARTITION BY run_id ORDER BY s0, s1
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) + 1 THEN 0 ELSE 1 END
              AS starts
    FROM claimed
), numbered AS (
    SELECT *, sum(starts) OVER (PARTITION BY run_id ORDER BY s0, s1 ROWS UNBOUNDED PRECEDING)
              AS island
    FROM flagged
), islands AS (
    SELECT run_id, min(s0) AS lo, max(s1) AS hi FROM numbered GROUP BY run_id, island
)
SELECT (SELECT count(*) FROM claimed), array_agg(i.run_id ORDER BY i.run_id, g.lo),
       array_agg(g.lo ORDER BY i.run_id, g.lo),
       array_agg(least(i.hi, g.lo + {ISLAND_STEPS} - 1) ORDER BY i.run_id, g.lo)
FROM islands i CROSS JOIN LATERAL generate_series(i.lo, i.hi, {ISLAND_STEPS}) AS g(lo)"""

_REFRESH_REPORTS = """islands i JOIN restarts b USING (run_id) CROSS JOIN LATERAL (
    SELECT step, ts, step_time, data_time, h2d_time, tokens FROM runs_stepreport s
    WHERE s.run_id = i.run_id AND s.step BETWEEN i.lo AND i.hi OFFSET 0
) r"""
_REFRESHED = _PER_COMPLETION.format(
    key="run_id, step, epoch",
    extra="min(ts) AS t0, max(ts) AS t1, count(*) AS n,",
    extra_columns="ts,",
    bounds="bounds",
    reports=_REFRESH_REPORTS,
)
_REFRESH_SQL = f"""
WITH islands AS (
    SELECT * FROM unnest(%(runs)s::int8[], %(los)s::int8[], %(his)s::int8[]) AS i(run_id, lo, hi)
), restarts AS ({_RESTARTS}
), gone AS (
    -- one snapshot for every part of the statement: the delete never meets the new rows
    DELETE FROM runs_stepcompletion c USING islands i
    WHERE c.run_id = i.run_id AND c.step BETWEEN i.lo AND i.hi
)
INSERT INTO runs_stepcompletion
    (run_id, step, t0, t1, n, end_ts, step_time, data, first_start, tokens)
SELECT run_id, step, t0, t1, n, e, step_time, data, first_start, tokens FROM ({_REFRESHED}) c"""

# The read (see the module's docstring): %(run)s, %(after)s (steps above it),
# %(restarts)s (the reader's, +infinity last). Rows: step, end, step_time, data, first start,
# epoch, tokens, in (epoch, step) order.
# the read's: the run is given, and the times of the first and last report are not needed
_READ_RAW = _PER_COMPLETION.format(
    key="step, epoch", extra="", extra_columns="", bounds="%(restarts)s::float8[]", reports="raw"
)
COMPLETIONS_SQL = f"""
WITH marks AS MATERIALIZED (
    SELECT s0, s1 FROM runs_completiondirty WHERE run_id = %(run)s AND s1 > %(after)s
), flagged AS (
    SELECT *, CASE WHEN s0 <= max(s1) OVER (ORDER BY s0, s1
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) + 1 THEN 0 ELSE 1 END
              AS starts
    FROM marks
), marked AS MATERIALIZED (
    SELECT greatest(min(s0), %(after)s + 1) AS lo, max(s1) AS hi FROM (
        SELECT *, sum(starts) OVER (ORDER BY s0, s1 ROWS UNBOUNDED PRECEDING) AS island
        FROM flagged
    ) n GROUP BY island
), stored AS MATERIALIZED (
    SELECT step, end_ts, step_time, data, first_start, tokens,
           width_bucket(date_part('epoch', t0), %(restarts)s::float8[]) AS epoch,
           width_bucket(date_part('epoch', t1), %(restarts)s::float8[]) AS epoch_last
    FROM runs_stepcompletion c
    WHERE run_id = %(run)s AND step > %(after)s
      AND NOT EXISTS (SELECT 1 FROM marked m WHERE c.step BETWEEN m.lo AND m.hi)
), misfit AS MATERIALIZED (
    SELECT DISTINCT step FROM stored GROUP BY step, epoch
    HAVING count(*) > 1 OR bool_or(epoch <> epoch_last)
), raw AS (
    SELECT r.* FROM marked m CROSS JOIN LATERAL (
        SELECT step, ts, step_time, data_time, h2d_time, tokens FROM runs_stepreport s
        WHERE s.run_id = %(run)s AND s.step BETWEEN m.lo AND m.hi OFFSET 0
    ) r
    UNION ALL
    SELECT step, ts, step_time, data_time, h2d_time, tokens FROM runs_stepreport
    WHERE run_id = %(run)s AND step = ANY(ARRAY(SELECT step FROM misfit))
)
SELECT step, e, step_time, data, first_start, epoch, tokens FROM ({_READ_RAW}) per_completion
UNION ALL
SELECT step, end_ts, step_time, data, first_start, epoch, tokens FROM stored
WHERE step NOT IN (SELECT step FROM misfit)
ORDER BY 6, 1"""


def completions_refresh(*, limit: int = CLAIM_MARKS, max_rounds: int = 20) -> int:
    """Recompute the completions of every marked step; returns the marks claimed. Each round
    is one transaction: claim up to `limit` marks, recompute their islands. Idempotent; a
    second caller returns at once."""
    claimed_total = 0
    for _ in range(max_rounds):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [COMPLETIONS_LOCK_KEY])
            if not cursor.fetchone()[0]:
                return claimed_total
            cursor.execute(_CLAIM_SQL, {"limit": limit})
            claimed, runs, los, his = cursor.fetchone()
            if runs:
                cursor.execute(_REFRESH_SQL, {"runs": runs, "los": los, "his": his})
        claimed_total += claimed
        if claimed < limit:
            return claimed_total
    return claimed_total
