"""Per-rank figures: the run page's heat-map of every rank against the median rank, and the
rank page's parts of one rank's step against the median of its peers."""

from __future__ import annotations

import math

import numpy as np
from django.db import transaction

from apps.dashboard.charts.base import chart_layout, line_trace, ms
from apps.dashboard.charts.context import RunContext
from apps.dashboard.charts.rank_groups import (
    HEATMAP_GROUP_ROWS,
    HEATMAP_RANK_ROWS,
    HEATMAP_SLOWEST_ROWS,
    UNPLACED,
    RankGroup,
    group_worst,
    rank_groups,
    slowest_rows,
)
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
HEATMAP_GROUP_ROW_PX = 12
HEATMAP_LABELLED_ROWS = 64  # every rank labelled up to this many rows, else a stride


def step_time_figure(ctx: RunContext, tr: TimeRange) -> dict:
    """Per rank and time bucket: the rank's step time less collective wait over the median
    rank's in that bucket (1.0 = the median; a straggler runs hot). Rows are labelled with
    the rank's node and GPU; meta.ranks names each row's rank (a click opens its page).
    Past HEATMAP_RANK_ROWS ranks, rows are groups of nodes with their worst rank's ratio
    and the slowest ranks on top (rank_groups); ctx.rank_group drills into one group."""
    start, end = ctx.span(tr)
    # One transaction: the history read's settings (apps.history READ_SETTINGS: no JIT, a
    # larger work_mem) then serve the places' aggregate over ~100 k reports too.
    with transaction.atomic(savepoint=False):
        busy = rank_busy_matrix(run=ctx.run, start=start, end=end, max_points=HEATMAP_BUCKETS)
        places = run_rank_places(run=ctx.run)
    # the medians and the colour range over every rank, so a drill-down's colours match
    ratios = _ratios_to_median(busy["z"])
    zmin, zmax = _robust_range(ratios)
    ranks, x = busy["ranks"], [ms(t) for t in busy["ts"]]
    labels = [rank_label(rank, places.get(rank)) for rank in ranks]
    title = "Per-rank step time less collective wait, ÷ median rank"
    if ctx.rank_group is None and len(ranks) > HEATMAP_RANK_ROWS:
        groups = rank_groups(ranks, places, HEATMAP_GROUP_ROWS)
        trace = _grouped_trace(busy["z"], ratios, groups, labels, ranks)
        zmin, zmax = _grouped_range(trace["z"][-len(groups) :])
        title = f"Worst rank per group of nodes ÷ median rank ({len(ranks):,} ranks)"
    else:
        rows = list(range(len(ranks)))
        if ctx.rank_group is not None:
            first, last = ctx.rank_group
            group = RankGroup(first, last, ())
            rows = [row for row, rank in enumerate(ranks) if _in_group(group, places.get(rank))]
            title += f": {group.label.split(' (')[0]}"
        trace = {
            "y": [labels[row] for row in rows],
            "z": nan_to_none(ratios[rows]),
            "customdata": nan_to_none(busy["z"][rows]),
            "hovertemplate": "%{y}<br>%{x|%Y-%m-%d %H:%M:%S}<br>"
            "%{customdata:.3f} s per step less collective wait<br>"
            "%{z:.2f} × the median rank<extra></extra>",
            "meta": {"ranks": [ranks[row] for row in rows]},
        }
    trace.update({
        "type": "heatmap", "name": "step time less collective wait ÷ median rank", "x": x,
        "zmin": zmin, "zmax": zmax, "colorscale": SLOW_IS_HOT,
        "colorbar": {"title": {"text": "× median"}}, "hoverongaps": False,
    })  # fmt: skip
    if ctx.rank_group is not None:
        trace["meta"]["group"] = list(ctx.rank_group)
    layout = chart_layout(title, "time", "", tr)
    shown, grouped = trace["y"], "groups" in trace["meta"]
    # every group row labelled (at most HEATMAP_SLOWEST_ROWS + HEATMAP_GROUP_ROWS of them)
    stride = 1 if grouped else max(1, math.ceil(len(shown) / HEATMAP_LABELLED_ROWS))
    layout["yaxis"].update(
        type="category", autorange="reversed", automargin=True, tickmode="array",
        tickvals=shown[::stride], ticktext=shown[::stride],
    )  # fmt: skip
    rows_drawn = len(shown) if grouped else min(len(shown), HEATMAP_LABELLED_ROWS)
    row_px = HEATMAP_GROUP_ROW_PX if grouped else HEATMAP_ROW_PX
    layout["height"] = max(layout["height"], rows_drawn * row_px + 140)
    return {"data": [trace], "layout": layout}


def _grouped_range(rows: list[list[float | None]]) -> tuple[float, float]:
    """zmin, zmax of the grouped rows: pale at the typical group's worst rank (the worst of
    a hundred ranks is always a little above the median rank: jitter), dark from the top
    HEATMAP_PERCENTILES of the cells, at least HEATMAP_MIN_SPREAD above the typical one."""
    values = np.array([v for row in rows for v in row if v is not None], dtype=float)
    if not len(values):
        return 1 - HEATMAP_MIN_SPREAD, 1 + HEATMAP_MIN_SPREAD
    typical = float(np.median(values))
    high = float(np.sort(values)[math.ceil((len(values) - 1) * HEATMAP_PERCENTILES[1] / 100)])
    return typical, max(high, typical + HEATMAP_MIN_SPREAD)


def _in_group(group: RankGroup, place: tuple[str, int | None] | None) -> bool:
    if group.first_node == UNPLACED:
        return place is None
    return place is not None and group.holds(place[0])


def _grouped_trace(
    busy: np.ndarray, ratios: np.ndarray, groups: list, labels: list[str], ranks: list[int]
) -> dict:
    """The slowest ranks' own rows, then a row per group: the worst rank's ratio per cell,
    and in the hover that rank, its node and GPU and its seconds."""
    slowest = slowest_rows(ratios, HEATMAP_SLOWEST_ROWS)
    worst, who = group_worst(ratios, groups)
    z = np.vstack([ratios[slowest], worst]) if slowest else worst
    worst_busy = np.where(who >= 0, busy[np.maximum(who, 0), np.arange(busy.shape[1])], np.nan)
    seconds = np.vstack([busy[slowest], worst_busy]) if slowest else worst_busy
    names = np.array(labels + [""], dtype=object)
    named = (
        np.vstack([names[[[row] * busy.shape[1] for row in slowest]], names[who]])
        if (slowest)
        else names[who]
    )
    custom = [
        [None if s != s else [round(float(s), 3), n] for s, n in zip(srow, nrow, strict=True)]
        for srow, nrow in zip(seconds.tolist(), named.tolist(), strict=True)
    ]
    return {
        "y": [f"{labels[row]} (slowest)" for row in slowest] + [g.label for g in groups],
        "z": nan_to_none(z),
        "customdata": custom,
        "hovertemplate": "%{y}<br>%{x|%Y-%m-%d %H:%M:%S}<br>worst rank %{customdata[1]}<br>"
        "%{customdata[0]:.3f} s per step less collective wait<br>"
        "%{z:.2f} × the median rank<extra></extra>",
        "meta": {
            "ranks": [ranks[row] for row in slowest] + [None] * len(groups),
            "groups": [None] * len(slowest) + [[g.first_node, g.last_node] for g in groups],
            "rank_count": len(ranks),
        },
    }


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
