"""Writes of step chunks: compaction of raw step reports, and unsealing for late data.

`steps_compact` moves raw reports older than STEP_COMPACT_AFTER_S and outside their run's
last STEP_COMPACT_KEEP_STEPS steps into one `runs_stepchunk` row per run, rank and
STEP_CHUNK_SECONDS window (apps/runs/chunks.py: ≈ 21 B a report instead of ≈ 236), merging
them into the window's chunk when it exists. Each (run, window) is one transaction: DELETE the
raw rows and the old chunks, INSERT the merged chunks, so a crash loses nothing and doubles
nothing, and every report is kept as it was stored (ingest's exactly-once is the inbox's:
two equal reports are two reports, here too).

Late data: a report that lands in a window that already has chunks makes the store step
(`steps_unseal`, in ingest's transaction) turn that run's chunks of that window back into raw
rows; the next pass compacts them again, with the late report. The history rollups recompute
a dirty minute from raw rows of every rank, so they must find the whole window raw. Two
guards keep that true: a per-run advisory lock that ingest takes shared (only for reports
old enough to meet a chunk) and the compaction exclusive, so a late report and the
compaction of its window never pass each other; and a window with a dirty range not yet
rolled up (`history_dirty_run`) is left raw until the rollup pass took it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from apps.core.times import to_datetime
from apps.runs.chunks import STEP_FIELDS, Row, chunk_decode, chunk_encode
from apps.runs.selectors import PLACE_STEPS

STEP_LOCK_CLASS = 0x0B5C2  # pg_advisory_xact_lock(class, run id): compaction vs late ingest
CHECK_FIELDS = ("grad_checksum", "param_checksum", "canary_norm")

_WINDOWS_SQL = """
SELECT s.run_id, to_timestamp(floor(extract(epoch FROM s.ts) / %(width)s) * %(width)s)
FROM runs_stepreport s JOIN runs_run r ON r.id = s.run_id
WHERE s.ts < %(cutoff)s AND s.step <= r.last_step - %(keep)s
GROUP BY 1, 2 ORDER BY 1, 2 LIMIT %(limit)s
"""
_DIRTY_SQL = """
SELECT EXISTS (SELECT 1 FROM history_dirty_run
               WHERE run_id = %(run)s AND t0 < %(end)s AND t1 >= %(start)s)
"""
_TAKE_RAW_SQL = f"""
DELETE FROM runs_stepreport s USING runs_run r
WHERE r.id = %(run)s AND s.run_id = %(run)s AND s.ts >= %(start)s AND s.ts < %(end)s
  AND s.step <= r.last_step - %(keep)s
RETURNING {", ".join(f"s.{name}" for name in STEP_FIELDS)}
"""
_INSERT_CHUNK_SQL = (
    'INSERT INTO runs_stepchunk (run_id, rank, "window", t0, t1, step_lo, step_hi, n,'
    " checked, data) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def keep_steps() -> int:
    """How many of a run's last steps stay raw: at least every "last N steps" reader's N."""
    return max(settings.STEP_COMPACT_KEEP_STEPS, settings.ALERT_STEP_WINDOW, PLACE_STEPS)


def compact_cutoff(now: datetime) -> datetime:
    """Windows that end at or before this are compacted."""
    width = settings.STEP_CHUNK_SECONDS
    return to_datetime((now.timestamp() - settings.STEP_COMPACT_AFTER_S) // width * width)


def steps_compact(*, now: datetime, limit: int = 500) -> int:
    """Compact up to `limit` (run, window) groups of raw reports; returns reports moved.
    A run whose lock is held (a late batch being stored) or whose window awaits the rollup
    pass is left for the next pass."""
    width = settings.STEP_CHUNK_SECONDS
    with connection.cursor() as cursor:
        cursor.execute(
            _WINDOWS_SQL,
            {"width": width, "cutoff": compact_cutoff(now), "keep": keep_steps(), "limit": limit},
        )
        windows = cursor.fetchall()
    moved = 0
    for run_id, start in windows:
        moved += _window_compact(run_id=run_id, start=start, end=start + timedelta(seconds=width))
    return moved


def _window_compact(*, run_id: int, start: datetime, end: datetime) -> int:
    params = {"run": run_id, "start": start, "end": end, "keep": keep_steps()}
    with transaction.atomic(), connection.connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [STEP_LOCK_CLASS, run_id])
        if not cursor.fetchone()[0]:
            return 0
        cursor.execute(_DIRTY_SQL, params)
        if cursor.fetchone()[0]:
            return 0
        cursor.execute(_TAKE_RAW_SQL, params)
        raw = [dict(zip(STEP_FIELDS, row, strict=True)) for row in cursor.fetchall()]
        if not raw:
            return 0
        cursor.execute(
            'DELETE FROM runs_stepchunk WHERE run_id = %s AND "window" = %s RETURNING rank, data',
            [run_id, start],
        )
        by_rank: dict[int, list[Row]] = defaultdict(list)
        for rank, data in cursor.fetchall():
            by_rank[rank] += chunk_decode(bytes(data), run_id=run_id, rank=rank)
        for row in raw:
            by_rank[row["rank"]].append(row)
        cursor.executemany(
            _INSERT_CHUNK_SQL,
            [_chunk_row(run_id, rank, start, rows) for rank, rows in sorted(by_rank.items())],
        )
    return len(raw)


def _chunk_row(run_id: int, rank: int, window: datetime, rows: list[Row]) -> tuple:
    rows.sort(key=lambda row: (row["ts"], row["step"]))
    steps = [row["step"] for row in rows]
    checked = sum(1 for row in rows if any(row[f] is not None for f in CHECK_FIELDS))
    return (
        run_id,
        rank,
        window,
        rows[0]["ts"],
        rows[-1]["ts"],
        min(steps),
        max(steps),
        len(rows),
        checked,
        chunk_encode(rows),
    )


def steps_unseal(*, ranges: dict[int, tuple[datetime, datetime]], now: datetime) -> int:
    """Turn back into raw rows the chunks of each run whose windows meet its (first ts, last
    ts) range, all ranks, for reports just stored in the caller's transaction. Returns the
    reports unsealed. Ranges too new to meet a chunk (the usual case) cost nothing."""
    width = settings.STEP_CHUNK_SECONDS
    # one window of slack: another worker's clock may run ahead of ours
    reach = compact_cutoff(now) + timedelta(seconds=width)
    late = {run_id: span for run_id, span in ranges.items() if span[0] < reach}
    if not late:
        return 0
    run_ids = sorted(late)  # one order: no deadlock between two ingest transactions
    with connection.connection.cursor() as cursor:
        for run_id in run_ids:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", [STEP_LOCK_CLASS, run_id])
        cursor.execute(
            "DELETE FROM runs_stepchunk c"
            " USING unnest(%s::int8[], %s::timestamptz[], %s::timestamptz[]) AS d(run_id, lo, hi)"
            ' WHERE c.run_id = d.run_id AND c."window" <= d.hi'
            ' AND c."window" > d.lo - make_interval(secs => %s)'
            " RETURNING c.run_id, c.rank, c.data",
            [run_ids, [late[r][0] for r in run_ids], [late[r][1] for r in run_ids], width],
        )
        chunks = cursor.fetchall()
        if not chunks:
            return 0
        rows = [
            row
            for run_id, rank, data in chunks
            for row in chunk_decode(bytes(data), run_id=run_id, rank=rank)
        ]
        raw_rows_copy(cursor, rows)
    return len(rows)


STEP_TYPES = [
    "int8",
    "int8",
    "timestamptz",
    "int4",
    "int8",
    "float8",
    "float8",
    "float8",
    "float8",
    "float8",
    "int8",
    "float8",
    "text",
    "text",
    "float8",
    "float8[]",
    "text",
    "int2",
]


def raw_rows_copy(cursor, rows: list[Row]) -> None:
    """COPY reports given as dicts of STEP_FIELDS into runs_stepreport."""
    with cursor.copy(
        f"COPY runs_stepreport ({', '.join(STEP_FIELDS)}) FROM STDIN (FORMAT BINARY)"
    ) as copy:
        copy.set_types(STEP_TYPES)
        for row in rows:
            copy.write_row([row[name] for name in STEP_FIELDS])
