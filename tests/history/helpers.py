"""Seeding history through the ingest services (so dirty ranges are recorded as in production)."""

from __future__ import annotations

import time

from django.db import connection

from apps.clusters.models import Cluster, Node
from apps.history.services import (
    RefreshResult,
    rollups_refresh,
    runs_mark_dirty,
    series_mark_dirty,
)
from apps.runs.models import Run
from apps.runs.services import steps_store
from apps.telemetry.services import health_update, samples_group, samples_store


def cluster_nodes(count: int, name: str = "c") -> list[Node]:
    cluster = Cluster.objects.create(name=name)
    return [Node.objects.create(cluster=cluster, name=f"n{index:02d}") for index in range(count)]


def settled_hour() -> float:
    """The latest top of an hour that ended 5 minutes ago or more. Data up to it is all in the
    rollups after a pass, whatever minute the test starts at: a range ending at the current
    hour would, in its first ROLLUP_FRESH_MARGIN_S (60 s), still read its last bucket raw."""
    return (time.time() - 300) // 3600 * 3600


def value_at(ts: float, gpu: int) -> float:
    """A deterministic, uneven gauge value so that sums, mins and maxes all differ."""
    return float((int(ts) * 7 + gpu * 13) % 101) + 0.25


def samples_put(
    node: Node, start: float, seconds: int, gpus: range = range(2), metric: str = "gpu.util"
) -> None:
    """One batch per 10 s of 1 Hz samples of `metric` on these GPUs (-1: the host)."""
    for offset in range(0, seconds, 10):
        samples = [
            {
                "ts": start + t,
                "metric": metric,
                "gpu": None if gpu == -1 else gpu,
                "value": value_at(start + t, gpu),
            }
            for t in range(offset, min(offset + 10, seconds))
            for gpu in gpus
        ]
        series = samples_group(samples_by_node={node.id: samples})
        # as the ingest store step does: store, then mark the ranges for the rollups
        series_mark_dirty(ranges=samples_store(series=series).ranges)
        health_update(series=series)  # as ingest does: "all" GPUs are the reported ones


def steps_put(
    run: Run,
    node: Node,
    start: float,
    seconds: int,
    ranks: int,
    slow_rank: int | None = None,
) -> None:
    """One step per second per rank; `slow_rank` takes 3 s instead of 1 s a step and waits
    for no one in the collective (busy 3 s), the others wait 0.25 s of their 1 s (busy 0.75)."""
    rows = []
    for t in range(seconds):
        for rank in range(ranks):
            step_time = 3.0 if rank == slow_rank else 1.0
            rows.append(
                (
                    run.id,
                    node.id,
                    {
                        "ts": start + t,
                        "rank": rank,
                        "step": t,
                        "step_time": step_time,
                        "data_time": 0.1,
                        "h2d_time": 0.05,
                        "compute_time": 0.6,
                        "comm_wait": 0.0 if rank == slow_rank else step_time - 0.75,
                        "tokens": 1000,
                        "loss": 2.0 + (t % 10) / 10,
                    },
                )
            )
    runs_mark_dirty(ranges=steps_store(steps=rows).ranges)


def refresh() -> RefreshResult:
    """Run the rollup pass until it drains (a live stack's beat may hold the lock briefly)."""
    for _ in range(100):
        result = rollups_refresh()
        if result.drained:
            return result
        time.sleep(0.1)
    raise AssertionError("the rollup pass never drained the dirty ranges")


def rows(sql: str, params: list | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall() if cursor.description else []


def expected_minutes(start: float, seconds: int, gpu: int) -> dict[float, tuple]:
    """Minute start → (n, sum, min, max) of what samples_put stored for one series."""
    buckets: dict[float, list[float]] = {}
    for t in range(seconds):
        ts = start + t
        buckets.setdefault(ts // 60 * 60, []).append(value_at(ts, gpu))
    return {b: (len(v), sum(v), min(v), max(v)) for b, v in buckets.items()}
