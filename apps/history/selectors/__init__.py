"""Reads of history: a metric's series or a run's step timings over any range, at a
resolution that keeps each series near `max_points`, from raw data or the rollups.

A selector costs two queries (the rollup watermark and the series or rank count, then the
data), never one per node or rank. The rollup serves buckets up to the last rollup pass
(less a margin) and raw data the newer part, so charts are current to the last ingested
batch. Django's cursor binds parameters on the client, so each execution is planned with its
own values; the SQL is written so that a generic plan (a prepared statement, should
`prepare_threshold` ever be set) stays on the indexes too: tables are reached per series
through OFFSET 0 lateral index scans or bounded by constant ranges (docs/history.md).
"""

from apps.history.selectors.metrics import History, SeriesHistory, metric_history
from apps.history.selectors.rank_busy import RankBusy, run_rank_busy
from apps.history.selectors.resolution import Resolution, resolution_choose
from apps.history.selectors.steps import (
    RankHistory,
    StepHistory,
    run_rank_history,
    run_step_history,
)

__all__ = [
    "History",
    "RankBusy",
    "RankHistory",
    "Resolution",
    "SeriesHistory",
    "StepHistory",
    "metric_history",
    "resolution_choose",
    "run_rank_busy",
    "run_rank_history",
    "run_step_history",
]
