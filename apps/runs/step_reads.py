"""Step reports, raw and compacted: the one place readers of older reports go through
(re-exported by apps.runs.selectors)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection

from apps.runs.chunks import STEP_FIELDS, Row, chunk_decode
from apps.runs.models import Run

CHUNK_CHECK_FIELDS = ("grad_checksum", "param_checksum", "canary_norm")
_UNNEST_TYPES = [
    "int8", "int8", "timestamptz", "int4", "int8", "float8", "float8", "float8", "float8",
    "float8", "int8", "float8", "text", "text", "float8", "text", "text", "int2",
]  # fmt: skip


def steps_source(
    *,
    run_id: int,
    start: datetime | None = None,
    end: datetime | None = None,
    step_lo: int | None = None,
    step_hi: int | None = None,
    checked: bool = False,
) -> tuple[str, dict[str, Any]]:
    """A relation with runs_stepreport's columns (no id) holding the run's reports in the
    bounds (ts in [start, end), step in [step_lo, step_hi], only checked ones when
    `checked`): the raw table, and the run's compacted reports when a chunk meets the bounds
    (decoded and handed to Postgres as arrays). The bounds only spare decoding: the raw
    side is the whole table and the caller filters both sides itself. Returns (SQL to put
    after FROM, with an alias; named parameters to add to the caller's). One index probe
    when no chunk meets the bounds (the recent reports every live reader wants)."""
    rows = _chunk_rows(run_id, start, end, step_lo, step_hi, checked)
    if not rows:
        return "runs_stepreport", {}
    params = {f"chunk_{name}": [row[name] for row in rows] for name in STEP_FIELDS}
    # float8[] per row: as array literals (repr is exact), cast back on the SQL side
    projections = params["chunk_canary_proj"]
    params["chunk_canary_proj"] = [
        None if p is None else f"{{{','.join(map(repr, p))}}}" for p in projections
    ]
    arrays = ", ".join(
        f"%(chunk_{name})s::{kind}[]" for name, kind in zip(STEP_FIELDS, _UNNEST_TYPES, strict=True)
    )
    columns = ", ".join(STEP_FIELDS)
    decoded = columns.replace("canary_proj", "canary_proj::float8[]")
    sql = (
        f"(SELECT {columns} FROM runs_stepreport UNION ALL"
        f" SELECT {decoded} FROM unnest({arrays}) AS chunk({columns}))"
    )
    return sql, params


def _chunk_rows(
    run_id: int,
    start: datetime | None,
    end: datetime | None,
    step_lo: int | None,
    step_hi: int | None,
    checked: bool,
) -> list[Row]:
    where, params = ["run_id = %(run)s"], {"run": run_id}
    if start is not None:
        where.append("t1 >= %(start)s")
        where.append('"window" > %(start)s - make_interval(secs => %(width)s)')
        params.update(start=start, width=settings.STEP_CHUNK_SECONDS)
    if end is not None:
        where.append("t0 < %(end)s")
        params["end"] = end
    if step_lo is not None:
        where.append("step_hi >= %(lo)s")
        params["lo"] = step_lo
    if step_hi is not None:
        where.append("step_lo <= %(hi)s")
        params["hi"] = step_hi
    if checked:
        where.append("checked > 0")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT rank, data FROM runs_stepchunk WHERE {' AND '.join(where)}", params)
        chunks = cursor.fetchall()
    return [
        row
        for rank, data in chunks
        for row in chunk_decode(bytes(data), run_id=run_id, rank=rank)
        if (start is None or row["ts"] >= start)
        and (end is None or row["ts"] < end)
        and (step_lo is None or row["step"] >= step_lo)
        and (step_hi is None or row["step"] <= step_hi)
        and (not checked or any(row[f] is not None for f in CHUNK_CHECK_FIELDS))
    ]


def step_reports(
    *,
    run_id: int,
    fields: tuple[str, ...],
    start: datetime | None = None,
    end: datetime | None = None,
    step_lo: int | None = None,
    step_hi: int | None = None,
    checked: bool = False,
    newest_steps_first: bool = False,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The run's reports in the bounds (steps_source's), raw and compacted alike, as dicts
    of `fields`, ordered by step (newest first if asked) and rank; at most `limit`."""
    source, params = steps_source(
        run_id=run_id, start=start, end=end, step_lo=step_lo, step_hi=step_hi, checked=checked
    )
    where = ["run_id = %(run)s"]
    bounds = {"start": "ts >= %(start)s", "end": "ts < %(end)s"}
    bounds |= {"step_lo": "step >= %(step_lo)s", "step_hi": "step <= %(step_hi)s"}
    given = {"start": start, "end": end, "step_lo": step_lo, "step_hi": step_hi}
    where += [bounds[name] for name, value in given.items() if value is not None]
    if checked:
        where.append("(" + " OR ".join(f"{f} IS NOT NULL" for f in CHUNK_CHECK_FIELDS) + ")")
    order = "step DESC, rank" if newest_steps_first else "step, rank"
    sql = (
        f"SELECT {', '.join(fields)} FROM {source} AS steps WHERE {' AND '.join(where)}"
        f" ORDER BY {order}" + (" LIMIT %(limit)s" if limit is not None else "")
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, {**params, **given, "run": run_id, "limit": limit})
        return [dict(zip(fields, row, strict=True)) for row in cursor.fetchall()]


def run_first_report_at(*, run: Run) -> datetime | None:
    """The time of the run's first report: raw, that of its lowest step (the (run, step)
    index); compacted, the start of its earliest chunk (the chunks' unique index)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(ts) FROM ("
            " (SELECT ts FROM runs_stepreport WHERE run_id = %(run)s ORDER BY step LIMIT 1)"
            " UNION ALL (SELECT min(t0) FROM runs_stepchunk WHERE run_id = %(run)s"
            '  AND "window" = (SELECT min("window") FROM runs_stepchunk WHERE run_id = %(run)s))'
            ") first",
            {"run": run.id},
        )
        return cursor.fetchone()[0]
