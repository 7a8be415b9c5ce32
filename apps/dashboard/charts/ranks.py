"""Per-rank figures: the run page's heat-map of every rank against the median rank, and the
rank page's parts of one rank's step against the median of its peers."""

from __future__ import annotations

import math

import numpy as np
from django.db import transaction

from apps.dashboard.charts.base import chart_layout, line_trace, ms
from apps.dashboard.charts.context import RunContext
from apps.dashboard.selectors.ranges import TimeRange
from apps.dashboard.selectors.runs import decimals_rounded, nan_to_none, rank_busy_matrix
from apps.runs.models import Run
from apps.runs.selectors import rank_label, rank_stage_history, run_rank_places

HEATMAP_BUCKETS = 120
# The heat-map: light where a rank works as long as the median rank, dark red where it is
# slow (Plotly's own "YlOrRd" runs the other way: healthy ranks were a dark-red wall).
SLOW_IS_HOT = [[0.0, "#ffffcc"], [0.25, "#fed976"], [0.5, "#fd8d3c"], [0.75, "#e31a1c"],
               [1.0, "#800026"]]  # fmt: skip
# The colour range runs over these percentiles of the ratios (one outlier cell must not
# wash out the rest), and at least this far either side of the median (noise stays pale).
HEATMAP_PERCENTILES = (2, 98)
HEATMAP_MIN_SPREAD = 0.1
HEATMAP_ROW_PX = 14
HEATMAP_LABELLED_ROWS = 64  # every rank labelled up to this many rows, else a stride


def step_time_figure(ctx: RunContext, tr: TimeRange) -> dict:
    """Per rank and time bucket: the rank's step time less collective wait over the median
    rank's in that bucket (1.0 = the median; a straggler runs hot). Rows are labelled with
    the rank's node and GPU; meta.ranks names each row's rank (a click opens its page)."""
    start, end = ctx.span(tr)
    # One transaction: the history read's settings (apps.history READ_SETTINGS: no JIT, a
    # larger work_mem) then serve the places' aggregate over ~100 k reports too.
    with transaction.atomic(savepoint=False):
        busy = rank_busy_matrix(run=ctx.run, start=start, end=end, max_points=HEATMAP_BUCKETS)
        places = run_rank_places(run=ctx.run)
    labels = [rank_label(rank, places.get(rank)) for rank in busy["ranks"]]
    ratios = _ratios_to_median(busy["z"])
    zmin, zmax = _robust_range(ratios)
    trace = {
        "type": "heatmap",
        "name": "step time less collective wait ÷ median rank",
        "x": [ms(t) for t in busy["ts"]],
        "y": labels,
        "z": nan_to_none(ratios),
        "customdata": nan_to_none(busy["z"]),
        "zmin": zmin,
        "zmax": zmax,
        "colorscale": SLOW_IS_HOT,
        "colorbar": {"title": {"text": "× median"}},
        "hoverongaps": False,
        "hovertemplate": "%{y}<br>%{x|%Y-%m-%d %H:%M:%S}<br>"
        "%{customdata:.3f} s per step less collective wait<br>"
        "%{z:.2f} × the median rank<extra></extra>",
        "meta": {"ranks": busy["ranks"]},
    }
    layout = chart_layout("Per-rank step time less collective wait, ÷ median rank", "time", "", tr)
    stride = max(1, math.ceil(len(labels) / HEATMAP_LABELLED_ROWS))
    layout["yaxis"].update(
        type="category", autorange="reversed", automargin=True, tickmode="array",
        tickvals=labels[::stride], ticktext=labels[::stride],
    )  # fmt: skip
    rows = min(len(labels), HEATMAP_LABELLED_ROWS)
    layout["height"] = max(layout["height"], rows * HEATMAP_ROW_PX + 140)
    return {"data": [trace], "layout": layout}


def _ratios_to_median(z: np.ndarray) -> np.ndarray:
    """Each cell over the median of its column (the ranks in one time bucket), to 4 places;
    NaN where the cell or the median is missing, or the median is 0. A slowdown of every rank
    at once (a checkpoint) is no rank's fault and stays pale."""
    with np.errstate(divide="ignore", invalid="ignore"):
        medians = _column_medians(z)
        ratios = decimals_rounded(z / medians, 4)
    ratios[:, (medians == 0) | np.isnan(medians)] = np.nan
    return ratios


def _column_medians(z: np.ndarray) -> np.ndarray:
    """The median of each column's non-NaN values (the mean of the middle two for an even
    count, as statistics.median), NaN for a column without any."""
    counts = np.count_nonzero(~np.isnan(z), axis=0)
    if not len(z):
        return np.full(z.shape[1], np.nan)
    ordered, columns = np.sort(z, axis=0), np.arange(z.shape[1])  # NaN sorts last
    low, high = np.maximum(counts - 1, 0) // 2, counts // 2  # high < len(z): counts ≤ len(z)
    medians = (ordered[low, columns] + ordered[high, columns]) / 2
    medians[counts == 0] = np.nan
    return medians


def _robust_range(ratios: np.ndarray) -> tuple[float, float]:
    """zmin, zmax: HEATMAP_PERCENTILES of the ratios, widened to HEATMAP_MIN_SPREAD around 1."""
    values = np.sort(ratios[~np.isnan(ratios)])
    low, high = 1.0, 1.0
    if len(values):
        low = float(values[int((len(values) - 1) * HEATMAP_PERCENTILES[0] / 100)])
        high = float(values[math.ceil((len(values) - 1) * HEATMAP_PERCENTILES[1] / 100)])
    return min(low, 1 - HEATMAP_MIN_SPREAD), max(high, 1 + HEATMAP_MIN_SPREAD)


# The rank page: each part of the rank's step against the median of the other ranks.
RANK_STAGE_TITLES = {
    "compute_time": "compute",
    "comm_wait": "collective wait",
    "data_time": "data loading",
    "h2d_time": "host-to-device",
    "step_time": "whole step",
}


def rank_stage_figures(run: Run, rank: int, tr: TimeRange) -> dict[str, dict]:
    """One figure per part of the step (RANK_STAGE_TITLES) the run reports: rank `rank`'s
    mean per time bucket against the median of its peers' means."""
    history = rank_stage_history(run=run, rank=rank, start=tr.start, end=tr.end)
    figures = {}
    for stage, title in RANK_STAGE_TITLES.items():
        mine, median = history["rank"][stage], history["median"][stage]
        if not any(v is not None for v in mine + median) and stage != "step_time":
            continue  # a part the reports leave out
        figures[stage] = {
            "data": [
                line_trace(f"rank {rank}", history["ts"], mine, line={"color": "#c0392b"}),
                line_trace(
                    "median of the other ranks",
                    history["ts"],
                    median,
                    line={"color": "#57606a", "dash": "dot"},
                ),
            ],  # fmt: skip
            "layout": chart_layout(f"{title}: rank {rank} against its peers", "time", "s", tr),
        }
        # from zero: a constant gap reads as its size, not as noise blown up to full height
        figures[stage]["layout"]["yaxis"]["rangemode"] = "tozero"
    return figures
