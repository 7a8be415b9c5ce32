"""What every figure shares: the layout, a line trace, finite values, Unix ms on date axes,
and the figure that says why it is empty or not drawn."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from django.db import DataError, connection

from apps.dashboard.selectors.ranges import TimeRange

logger = logging.getLogger(__name__)

MAX_POINTS = 600


def drawn(chart: str, build: Callable[..., dict], *args: Any) -> dict:
    """build(*args), or an empty figure saying why when the database cannot add up the
    stored values: rows stored before ingest bounded its floats (1.7e308 twice) overflow
    float8 sums, and one such series must not take its whole page down with a 500."""
    try:
        return build(*args)
    except DataError as error:
        if connection.in_atomic_block:
            raise  # the transaction is lost: nothing more can be read in it
        logger.warning("chart %s not drawn: %s", chart, str(error).strip())
        title = f"{chart}: not drawn, stored values out of range"
        return {"data": [], "layout": chart_layout(title, "time", "", None)}


NO_DATA = "no data in this time range"
NO_GPUS = "this node reports no GPUs"


def drawn_or_said_empty(
    chart: str, build: Callable[..., dict], *args: Any, said: str = NO_DATA
) -> dict:
    """drawn(), and a figure without a single point says so (`said`: what is missing)
    instead of drawing bare axes (Plotly's empty date axis spans the year 2000)."""
    figure = drawn(chart, build, *args)
    if "empty" not in figure["layout"].get("meta", {}) and not _has_points(figure):
        return empty(figure, said)
    return figure


def _has_points(figure: dict) -> bool:
    def some(values: list) -> bool:
        return any(v is not None and (not isinstance(v, list) or some(v)) for v in values)

    return any(some(trace.get("z") or trace.get("y") or []) for trace in figure["data"])


def empty(figure: dict, message: str) -> dict:
    """The figure with its axes hidden and `message` (what is missing) in their place; its
    traces stay (the exports keep their columns). layout.meta.empty names the message."""
    layout = figure["layout"]
    for axis in [key for key in layout if key.startswith(("xaxis", "yaxis"))]:
        layout[axis] = {**layout[axis], "visible": False}
    layout["annotations"] = [
        {"text": message, "showarrow": False, "xref": "paper", "yref": "paper",
         "x": 0.5, "y": 0.5, "font": {"size": 15, "color": "#57606a"}}
    ]  # fmt: skip
    layout["meta"] = {**layout.get("meta", {}), "empty": message}
    return figure


def ms(ts: float) -> float:
    return round(ts * 1000.0, 1)


def chart_layout(title: str, x_title: str, y_title: str, tr: TimeRange | None, **extra) -> dict:
    # The x axis fits the data (the range picked bounds what is read, not what is drawn): a
    # run that began ten minutes ago fills the chart at "24h" too.
    # The page names the time zone in a date axis's title (charts.js: UTC or local).
    xaxis: dict[str, Any] = {"title": {"text": x_title}}
    if tr is not None:
        xaxis["type"] = "date"
    return {
        "title": {"text": title},
        "xaxis": xaxis,
        # automargin: long tick labels (1.06M, 67.1G) widen the margin instead of being cut
        "yaxis": {"title": {"text": y_title}, "automargin": True},
        "margin": {"l": 60, "r": 30, "t": 40, "b": 80},
        "height": 330,
        "legend": {"orientation": "h", "y": -0.3},
        **extra,
    }


def finite(values: list) -> list:
    """The values with None for what is not a finite number: an inf or NaN float, or the
    strings "Infinity" / "NaN" that Postgres's json functions write for them (rows stored
    before ingest bounded its floats). A figure must never carry them: the page's JSON
    parser refuses bare NaN/Infinity, and a string would draw as a category."""
    return [
        value if value is None or (isinstance(value, int | float) and math.isfinite(value))
        else None
        for value in values
    ]  # fmt: skip


def line_trace(name: str, ts: list[float], values: list, **extra) -> dict:
    return {"type": "scatter", "mode": "lines", "name": name, "x": [ms(t) for t in ts],
            "y": finite(values), **extra}  # fmt: skip
