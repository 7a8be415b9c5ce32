"""A run's reads for its page and charts: the run, when it began, the runs of the overview,
checksum agreement per checked step, checkpoint events, and per-rank step history."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Q

from apps.clusters.models import Cluster
from apps.dashboard.selectors.ranges import TimeRange
from apps.history.selectors import run_rank_busy
from apps.runs.choices import ENDED_STATES, RunState
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import run_first_report_at, step_reports
from detectors.config import DEFAULT_CONFIG
from detectors.sdc import minority_exact, odd_canaries
from detectors.types import StepRow

CHECKED_STEPS_MAX = 200


def run_began(run: Run) -> float:
    """When the run began: its creation, or its first step report when an agent delivered
    older reports (a spooled backlog) than that (runs.selectors.run_first_report_at)."""
    first = run_first_report_at(run=run)
    began = run.created_at.timestamp()
    return began if first is None else min(began, first.timestamp())


def run_of(*, cluster: Cluster, name: str) -> Run | None:
    return Run.objects.filter(cluster=cluster, name=name).first()


def running_runs(*, cluster: Cluster, now: float) -> list[Run]:
    """Runs in state running that stepped within the alerts' idle limit (or just began)."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state=RunState.RUNNING)
        .filter(Q(last_step_at__gte=recent) | Q(last_step_at__isnull=True, created_at__gte=recent))
        .order_by("name")
    )


def ended_runs(*, cluster: Cluster, now: float) -> list[Run]:
    """Runs that ended (run_end: finished or failed) within the alerts' idle limit, newest
    end first: the overview lists them apart from the running ones."""
    recent = datetime.fromtimestamp(now - settings.ALERT_IDLE_S, UTC)
    return list(
        Run.objects.filter(cluster=cluster, state__in=ENDED_STATES, ended_at__gte=recent).order_by(
            "-ended_at", "name"
        )
    )


_CHECK_COLUMNS = (
    "step", "ts", "rank", "shard", "grad_checksum", "param_checksum", "canary_norm", "canary_proj",
)  # fmt: skip


def checksum_agreement(
    *, run: Run, start: float, end: float, limit: int = CHECKED_STEPS_MAX
) -> list[dict[str, Any]]:
    """Per checked step (newest `limit` in the range, oldest first): how many ranks reported a
    check and which disagreed with their shard's majority — by gradient checksum, parameter
    checksum or canary (the rules of detectors.sdc, so the page names the ranks an alert
    names). One query."""
    reports = step_reports(  # raw: the partial index stepreport_run_checked
        run_id=run.id,
        fields=_CHECK_COLUMNS,
        start=datetime.fromtimestamp(start, UTC),
        end=datetime.fromtimestamp(end, UTC),
        checked=True,
        newest_steps_first=True,
        limit=limit * max(run.world_size, 1),
    )
    rows = [tuple(report[name] for name in _CHECK_COLUMNS) for report in reports]
    groups: dict[int, dict[str | None, dict[int, StepRow]]] = defaultdict(lambda: defaultdict(dict))
    times: dict[int, float] = {}
    for step, ts, rank, shard, grad, param, norm, proj in rows:
        groups[step][shard][rank] = StepRow(
            node="", rank=rank, step=step, ts=ts.timestamp(), step_time=0.0,
            grad_checksum=grad, param_checksum=param, canary_norm=norm,
            canary_proj=tuple(proj) if proj else None, shard=shard,
        )  # fmt: skip
        times[step] = max(times.get(step, 0.0), ts.timestamp())
    return [_step_agreement(step, times[step], groups[step]) for step in sorted(groups)[-limit:]]


def _step_agreement(step: int, ts: float, shards: dict[str | None, dict[int, StepRow]]) -> dict:
    rtol = DEFAULT_CONFIG.sdc_canary_rtol
    out: dict[str, Any] = {
        "step": step,
        "ts": ts,
        "ranks": 0,
        "grad": [],
        "param": [],
        "canary": [],
    }
    where: dict[int, str] = {}
    for shard, rows in shards.items():
        out["ranks"] += len(rows)
        grad = minority_exact({r: row.grad_checksum for r, row in rows.items()})[0]
        param = minority_exact({r: row.param_checksum for r, row in rows.items()})[0]
        out["grad"] += grad
        out["param"] += param
        where.update(dict.fromkeys((*grad, *param), shard or ""))
    # Canaries within their canary group, which may span shards (an FSDP probe's does).
    every = {rank: row for rows in shards.values() for rank, row in rows.items()}
    out["canary"] = odd_canaries(every, set(out["param"]), rtol)
    where.update({rank: every[rank].shard or "" for rank in out["canary"]})
    out["shards"] = sorted(s or "" for s in shards)
    # Which shard each disagreeing rank holds: its replicas are the ranks it differs from.
    out["where"] = [f"{rank} in {shard}" for rank, shard in sorted(where.items()) if shard]
    for check in ("grad", "param", "canary"):
        out[check] = sorted(out[check])
    return out


def checkpoint_events(*, run: Run, start: float, end: float) -> list[dict[str, Any]]:
    """The run's checkpoint events in the range, oldest first, with the contract's fields."""
    events = RunEvent.objects.filter(
        run=run,
        kind="checkpoint",
        ts__gte=datetime.fromtimestamp(start, UTC),
        ts__lt=datetime.fromtimestamp(end, UTC),
    ).order_by("ts", "id")
    return [
        {
            "ts": event.ts.timestamp(),
            "step": event.step,
            "tier": event.data.get("tier"),
            "state": event.data.get("state"),
            "path": event.data.get("path"),
            "bytes": event.data.get("bytes"),
            "duration": event.data.get("duration"),
        }
        for event in events
    ]


def checkpoint_reported(*, run: Run) -> bool:
    """Whether the run ever reported a checkpoint event (an empty chart says which: none in
    the range, or none yet). One query."""
    return RunEvent.objects.filter(run=run, kind="checkpoint").exists()


def run_span(*, run: Run, tr: TimeRange, began: float) -> tuple[float, float]:
    """The part of the range in which the run has steps (from `began`, its first report, to
    its last step), so that the step charts of a short run get a fine resolution."""
    last = run.last_step_at.timestamp() + 1 if run.last_step_at else tr.end
    start, end = max(tr.start, began), min(tr.end, last)
    return (start, end) if start < end else (tr.start, tr.end)


def rank_busy_matrix(
    *, run: Run, start: float, end: float, max_points: int = 120
) -> dict[str, Any]:
    """Per rank and time bucket: the mean step time less collective wait (the rank's own
    work). In synchronous training every rank's step_time is the same — the fast ranks wait
    in the all-reduce for the slow one — so it is this time, not step_time, in which a
    straggler stands out. From apps.history (rollups, raw data after the last pass): {"ts":
    bucket starts, "ranks": [...], "z": a numpy matrix rank × bucket of the means to 6
    places (NaN where a rank reported nothing or the mean is not finite), "resolution_s"},
    without the buckets where no rank reported."""
    history = run_rank_busy(run_id=run.id, start=start, end=end, max_points=max_points)
    used = history.reported.any(axis=0)
    z = decimals_rounded(history.busy[:, used], 6)
    z[~np.isfinite(z)] = np.nan
    return {
        "ts": [t for t, keep in zip(history.ts, used.tolist(), strict=True) if keep],
        "ranks": history.ranks,
        "z": z,
        "resolution_s": history.resolution_s,
    }


def nan_to_none(matrix: np.ndarray) -> list[list[float | None]]:
    """A float matrix as lists of floats, None for NaN (JSON null)."""
    return np.where(np.isnan(matrix), None, matrix).tolist()


# Scaled values this close to a half (or this large) are rounded by round() one by one.
_NEAR_HALF, _LARGE = 1e-6, 1e9


def decimals_rounded(values: np.ndarray, places: int) -> np.ndarray:
    """round(value, places) of every value, to the bit: numpy's rint of the value scaled by
    10**places, except where scaling may have moved it across a half (a value within
    _NEAR_HALF of one, say 0.00005, which is a hair above it in binary) or lost digits
    (beyond _LARGE), which round() redoes. 100 k values in a few ms, not 50."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf and NaN are left as they are
        scaled = values * 10.0**places
        rounded = np.round(values, places)
        doubtful = (np.abs(scaled - np.floor(scaled) - 0.5) < _NEAR_HALF) | (
            np.abs(scaled) >= _LARGE
        )
    for index in zip(*np.nonzero(doubtful & np.isfinite(values)), strict=True):
        rounded[index] = round(float(values[index]), places)
    return rounded
