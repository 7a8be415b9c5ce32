from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

from django.conf import settings
from django.db import connections

from apps.core.db_router import read_alias
from apps.core.times import to_datetime, to_seconds
from apps.runs.choices import RunState
from apps.runs.completions import COMPLETIONS_SQL
from apps.runs.models import Run, RunEvent
from apps.runs.step_reads import (  # noqa: F401  (re-exported: readers import them here)
    CHUNK_CHECK_FIELDS,
    run_first_report_at,
    step_reports,
    steps_source,
)
from detectors.goodput import Completion, completions_marked, goodput_of, restarts_of
from detectors.types import EventRow

THROUGHPUT_WINDOW_S = 60
NODES_STEPS = 10


def run_get(*, name: str, **cluster_filter: Any) -> Run | None:
    runs = list(Run.objects.filter(name=name, **cluster_filter)[:2])
    return runs[0] if len(runs) == 1 else None


def run_summary(*, run: Run, now: float | None = None) -> dict[str, Any]:
    """The contract's run summary; goodput over the detectors' window of the run."""
    now = time.time() if now is None else now
    read = _completions_read(run, now)
    checkpoint = {tier: _last_checkpoint(run, tier) for tier in ("local", "durable")}
    durable_at = checkpoint["durable"]["at"] if checkpoint["durable"] else None
    since = durable_at or run.created_at.timestamp()
    return {
        "run": run.name,
        "state": run.state,
        "ranks": run.world_size,
        "last_step": run.last_step,
        "last_step_at": run.last_step_at.timestamp() if run.last_step_at else None,
        "restarts": run.restarts,
        "timeline_after": run.timeline_after.timestamp() if run.timeline_after else None,
        "tokens_per_s": _tokens_per_s(run, read.rows),
        "goodput": _goodput(run, now, read),
        "checkpoint": {
            **checkpoint,
            # GPU-hours that a failure now would throw away: one GPU per rank since the
            # newest durable checkpoint (or since the run started).
            "work_at_risk_gpu_hours": round(run.world_size * max(0.0, now - since) / 3600, 4),
        },
        "nodes": _nodes(run),
    }


def _last_checkpoint(run: Run, tier: str) -> dict[str, Any] | None:
    event = (
        RunEvent.objects.filter(
            run=run, kind="checkpoint", data__tier=tier, data__state="completed"
        )
        .order_by("-ts")
        .only("step", "ts")
        .first()
    )
    return {"step": event.step, "at": event.ts.timestamp()} if event else None


def _tokens_per_s(run: Run, rows: list[tuple]) -> float | None:
    """All ranks' tokens a second over the completions (`rows`, as COMPLETIONS_SQL reads them)
    that ended in the last THROUGHPUT_WINDOW_S before the newest report: from their median
    ends, so one straggling rank's report does not stretch the span."""
    if run.last_step_at is None:
        return None
    since = run.last_step_at.timestamp() - THROUGHPUT_WINDOW_S
    recent = [(end, tokens) for _, end, *_, tokens in rows if end > since]
    tokens = sum(tokens or 0 for _, tokens in recent)
    span = max(recent)[0] - min(recent)[0] if recent else 0.0
    if not tokens or not span:
        return None
    # the tokens of the first step in the window were processed before it started
    return round(tokens * (len(recent) - 1) / len(recent) / span, 3)


def _nodes(run: Run) -> list[str]:
    """The nodes the run's ranks reported from over its last PLACE_NEAR_STEPS steps when
    every rank reported in them (where it runs now: 33 k reports at 16,384 ranks), else over
    its last NODES_STEPS (a hung rank's node stays listed: 164 k reports, ≈ 4× the time).
    One query on the (run_id, step) index; the wider scan only runs when needed."""
    if run.last_step is None:
        return []
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            _NODES_SQL,
            {"run": run.id, "near": run.last_step - PLACE_NEAR_STEPS,
             "after": run.last_step - NODES_STEPS, "ranks": run.world_size},
        )  # fmt: skip
        return [row[0] for row in cursor.fetchall()]


_NODES_SQL = """
WITH near AS MATERIALIZED (
    SELECT node_id, rank FROM runs_stepreport WHERE run_id = %(run)s AND step > %(near)s
)
SELECT n.name FROM clusters_node n WHERE n.id IN (
    SELECT node_id FROM near
    UNION
    SELECT node_id FROM runs_stepreport WHERE run_id = %(run)s AND step > %(after)s
      AND (SELECT count(*) FROM (SELECT DISTINCT rank FROM near) r) < %(ranks)s
) ORDER BY n.name
"""


# Goodput has one selector, here: the run summary (above) and the detectors' window of the
# run (apps.alerts.selectors.window) read the same events the same way.
def run_goodput(*, run: Run, now: float) -> dict[str, Any] | None:
    """The run's goodput (detectors.goodput) as plain JSON, over the detectors' window of it
    (its last ALERT_STEP_WINDOW steps and recent events): since the run started when the
    window reaches back that far, else since the window's first step (or its event horizon,
    whichever is later). None before any step. A restart (a `restart` event, or the step
    counter going back: Run.timeline_after) books the steps it threw away as recovery; the
    old timeline's reports are read for that. Two queries: the per-step medians over the
    ranks are the stored completions (apps.runs.completions; one row a step), read raw only
    for the steps stored since the last refresh."""
    return _goodput(run, now, _completions_read(run, now))


class _Completions(NamedTuple):
    rows: list[tuple]  # COMPLETIONS_SQL's
    events: list[EventRow]
    restarts: list[float]


def _completions_read(run: Run, now: float) -> _Completions:
    """The run's recent events, its restarts, and its completions over the detectors' window
    (none before any step)."""
    if run.last_step is None:
        return _Completions([], [], [])
    recent = run_events_recent([run], now, until=None).get(run.id, [])
    events = [event_row(event, {}) for event in recent]
    # the restart events, and the one inferred from the step counter going back
    restarts = restarts_of(events, to_seconds(run.timeline_after))
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            COMPLETIONS_SQL,
            {
                "run": run.id,
                "after": run.last_step - settings.ALERT_STEP_WINDOW,
                # width_bucket counts the restarts at or before a report: its epoch
                "restarts": [*restarts, math.inf],
            },
        )
        return _Completions(cursor.fetchall(), events, restarts)


def _goodput(run: Run, now: float, read: _Completions) -> dict[str, Any] | None:
    rows = read.rows
    if not rows or run.last_step is None:
        return None
    done = completions_marked(Completion(*row[:4], epoch=row[5]) for row in rows)
    end = now if run.state == RunState.RUNNING else (to_seconds(run.last_step_at) or now)
    event_start = now - settings.ALERT_EVENT_WINDOW_S
    whole = (run.first_step or 0) > run.last_step - settings.ALERT_STEP_WINDOW and (
        run.created_at.timestamp() >= event_start
    )
    first = min(row[4] for row in rows)
    since = None if whole else max(first, event_start)
    return goodput_of(
        done,
        read.events,
        end,
        since=since,
        started_at=to_seconds(run.created_at),
        restarts=read.restarts,
    ).to_dict()


def run_events_recent(
    runs: list[Run], now: float, until: float | None
) -> dict[int, list[RunEvent]]:
    """Recent events of the runs (at or before `until`, if given), and each run's newest
    checkpoint event of every tier and state however old (staleness needs the last durable
    completed one)."""
    run_ids = [run.id for run in runs]
    start = to_datetime(now - settings.ALERT_EVENT_WINDOW_S)
    recent = RunEvent.objects.filter(run_id__in=run_ids, ts__gte=start).select_related("run")
    if until is not None:
        recent = recent.filter(ts__lte=to_datetime(until))
    latest = (
        RunEvent.objects.filter(run_id__in=run_ids, kind="checkpoint", ts__lt=start)
        .select_related("run")
        .order_by("run_id", "data__tier", "data__state", "-ts")
        .distinct("run_id", "data__tier", "data__state")
    )
    by_run: dict[int, list[RunEvent]] = {}
    for event in sorted([*recent, *latest], key=lambda event: (event.ts, event.id)):
        by_run.setdefault(event.run_id, []).append(event)
    return by_run


def event_row(event: RunEvent, names: dict[int, str]) -> EventRow:
    return EventRow(
        ts=event.ts.timestamp(),
        kind=event.kind,
        node=names.get(event.node_id, str(event.node_id)),
        run=event.run.name if event.run_id else None,
        step=event.step,
        rank=event.rank,
        gpu=event.gpu,
        data=event.data,
    )


# Where each rank ran: read over this many of the run's last steps, so that a rank that
# stopped reporting a while ago (the one that hangs) is still placed.
PLACE_STEPS = 100
PLACE_NEAR_STEPS = 2


def run_rank_places(*, run: Run) -> dict[int, tuple[str, int | None]]:
    """rank → (node name, GPU index or None) from each rank's newest report in the run's
    last PLACE_STEPS steps (a report that named its GPU wins over a newer one that did not).
    First over the last PLACE_NEAR_STEPS steps: a rank placed there with its GPU is placed
    for good (its newest GPU-naming report is there). Only the other ranks (silent lately, or
    not naming a GPU) are read over PLACE_STEPS: at 16,384 ranks that is 1.6 M reports,
    ≈ 0.7 s, against 33 k when every rank reports. Two queries on the (run_id, step) index."""
    if run.last_step is None:
        return {}
    near = _places(run, after=run.last_step - PLACE_NEAR_STEPS, ranks=None)
    unsettled = [rank for rank in range(run.world_size) if near.get(rank, ("", None))[1] is None]
    if not unsettled and run.world_size:
        return near
    # every rank is below world_size (its highest rank + 1): these are all that may change
    some = unsettled if 0 < len(unsettled) < run.world_size else None  # None: every rank
    wide = _places(run, after=run.last_step - PLACE_STEPS, ranks=some)
    return {**near, **wide}


def _places(run: Run, *, after: int, ranks: list[int] | None) -> dict[int, tuple[str, int | None]]:
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(_RANK_PLACES_SQL, {"run": run.id, "after": after, "ranks": ranks})
        return {rank: (node, gpu) for rank, node, gpu in cursor.fetchall()}


# Each rank's best report is the greatest [names its GPU, step, node, GPU]. First each rank's
# best step (the newest that named a GPU, else the newest) by plain aggregates: a hash
# aggregate over the ~100 k reports of 1,024 ranks (building an array per report to compare
# took a third longer; DISTINCT ON sorted them all, 2-3 times slower). Then the greatest
# [node, GPU] among the rank's reports at that step (several only when a report was sent
# twice), read at those steps only (mostly one or a few: ~1,000 reports); the nodes are
# joined to the 1,024 winners.
_RANK_PLACES_SQL = """
WITH best_step AS MATERIALIZED (
    SELECT rank, coalesce(max(step) FILTER (WHERE gpu IS NOT NULL), max(step)) AS step,
           bool_or(gpu IS NOT NULL) AS named
    FROM runs_stepreport WHERE run_id = %(run)s AND step > %(after)s
      AND (%(ranks)s::int4[] IS NULL OR rank = ANY(%(ranks)s::int4[]))
    GROUP BY rank
)
SELECT p.rank, n.name, p.best[2] FROM (
    SELECT s.rank, max(ARRAY[s.node_id, s.gpu]::int8[]) AS best
    FROM runs_stepreport s JOIN best_step b ON b.rank = s.rank AND b.step = s.step
    WHERE s.run_id = %(run)s AND s.step = ANY(ARRAY(SELECT DISTINCT step FROM best_step))
      AND (s.gpu IS NOT NULL OR NOT b.named)
    GROUP BY s.rank
) p JOIN clusters_node n ON n.id = p.best[1]
"""


def rank_label(rank: int, place: tuple[str, int | None] | None) -> str:
    """The rank, its node and GPU as far as they are known: "r13 · node-01 · gpu5"."""
    parts = [f"r{rank}"]
    if place is not None:
        parts.append(place[0])
        if place[1] is not None:
            parts.append(f"gpu{place[1]}")
    return " · ".join(parts)


RANK_STAGES = ("data_time", "h2d_time", "compute_time", "comm_wait", "step_time")
_RANK_STAGE_MEANS = ", ".join(f"avg({stage}) AS {stage}" for stage in RANK_STAGES)
_RANK_VS_PEERS = ", ".join(
    f"avg({s}) FILTER (WHERE rank = %(rank)s),"
    f" percentile_cont(0.5) WITHIN GROUP (ORDER BY {s}) FILTER (WHERE rank <> %(rank)s)"
    for s in RANK_STAGES
)
# Per bucket, each rank's mean of every stage; then this rank's and the other ranks' median.
_RANK_STAGES_SQL = f"""
WITH per_rank AS (
    SELECT floor((extract(epoch FROM ts)::float8 - %(start)s) / %(width)s)::int AS i, rank,
           {_RANK_STAGE_MEANS}
    FROM {{steps}} AS steps
    WHERE run_id = %(run)s AND ts >= to_timestamp(%(start)s) AND ts < to_timestamp(%(end)s)
    GROUP BY 1, 2
)
SELECT i, count(*) FILTER (WHERE rank <> %(rank)s), {_RANK_VS_PEERS}
FROM per_rank GROUP BY i ORDER BY i
"""


def rank_stage_history(
    *, run: Run, rank: int, start: float, end: float, buckets: int = 120
) -> dict[str, Any]:
    """The rank's step split over [start, end) against its peers: per time bucket (about
    `buckets` of them, at least 1 s wide) the rank's mean of each of RANK_STAGES and the
    median over the run's other ranks of their own means, with how many peers reported.
    Buckets where nobody reported are left out. Raw reports on the (run_id, ts) index: the
    caller bounds the range. One query."""
    width = max(1.0, math.ceil((end - start) / max(1, buckets)))
    source, chunked = steps_source(run_id=run.id, start=to_datetime(start), end=to_datetime(end))
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            _RANK_STAGES_SQL.format(steps=source),
            {"run": run.id, "rank": rank, "start": start, "end": end, "width": width, **chunked},
        )
        rows = cursor.fetchall()
    out: dict[str, Any] = {
        "resolution_s": width,
        "ts": [start + row[0] * width for row in rows],
        "peers": [row[1] for row in rows],
        "rank": {stage: [] for stage in RANK_STAGES},
        "median": {stage: [] for stage in RANK_STAGES},
    }
    for row in rows:
        for index, stage in enumerate(RANK_STAGES):
            out["rank"][stage].append(_round6(row[2 + 2 * index]))
            out["median"][stage].append(_round6(row[3 + 2 * index]))
    return out


def run_names_by_node(*, runs: list[Run]) -> dict[int, list[str]]:
    """node id → the names of the given runs whose ranks reported from it over their last
    NODES_STEPS steps (the overview's cards), sorted. One query (none without runs)."""
    after = {run.id: run.last_step - NODES_STEPS for run in runs if run.last_step is not None}
    if not after:
        return {}
    # Each run's bound as a constant, so that the planner scans the (run_id, step) index per
    # run: with the bound taken from runs_run in a join it estimated a third of the table and
    # read all of it (1.5 s at 1,024 ranks).
    bounds = " OR ".join(["(run_id = %s AND step > %s)"] * len(after))
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            f"SELECT DISTINCT node_id, run_id FROM runs_stepreport WHERE {bounds}",
            [value for bound in after.items() for value in bound],
        )
        names = {run.id: run.name for run in runs}
        out: dict[int, list[str]] = {}
        for node_id, run_id in cursor.fetchall():
            out.setdefault(node_id, []).append(names[run_id])
    return {node_id: sorted(out[node_id]) for node_id in sorted(out)}


def _round6(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
