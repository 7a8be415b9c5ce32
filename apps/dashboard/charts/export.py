"""A chart's CSV export, flattened from the very traces the chart draws."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Any


def _x_text(value: Any, is_date: bool) -> Any:
    if is_date and isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000.0, UTC).isoformat()
    return value


def figure_csv(figure: dict) -> str:
    """The figure's points as CSV, one row per point (per cell of a heat-map): the trace's
    name, then x, y (and z) under the axes' titles; dates as ISO 8601 UTC."""
    layout = figure["layout"]
    is_date = layout["xaxis"].get("type") == "date"
    x_title, y_title = layout["xaxis"]["title"]["text"], layout["yaxis"]["title"]["text"]
    if any(trace.get("yaxis") for trace in figure["data"]):
        y_title = "value"  # traces on axes of their own: the series column names the unit
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    heatmap = any(trace["type"] == "heatmap" for trace in figure["data"])
    writer.writerow(["series", x_title, y_title, *(["value"] if heatmap else [])])
    for trace in figure["data"]:
        if trace["type"] == "heatmap":
            for y, row in zip(trace["y"], trace["z"], strict=True):
                for x, z in zip(trace["x"], row, strict=True):
                    if z is not None:
                        writer.writerow([trace["name"], _x_text(x, is_date), y, z])
            continue
        name = trace["name"]
        for x, y in zip(trace["x"], trace["y"], strict=True):
            if y is not None:
                writer.writerow([name, _x_text(x, is_date), y, *([""] if heatmap else [])])
    return out.getvalue()
