"""Every figure of the dashboard, as a plain Plotly figure dict ({"data", "layout"}).

The page gets a chart's first figure through json_script; the chart endpoints answer the
same builder's output for another range as JSON, and as CSV flattened from the very same
traces (`figure_csv`), so an export holds exactly what the chart shows. Times on the x axes
are Unix milliseconds (Plotly's date axes read numbers as such)."""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import DataError, connection

from apps.clusters.models import Node
from apps.dashboard import selectors
from apps.dashboard.selectors import TimeRange
from apps.history.selectors import metric_history, run_step_history
from apps.runs.models import Run

logger = logging.getLogger(__name__)

MAX_POINTS = 600
# Step buckets no narrower than this: narrower than a step, most buckets would hold no step
# and the charts would be gaps and zeros.
MIN_STEP_BUCKET_S = 10.0  # the 10-second step rollups' width
HEATMAP_BUCKETS = 120
STAGES = (
    ("data_time", "data loading"),
    ("h2d_time", "host-to-device"),
    ("compute_time", "compute"),
    ("comm_wait", "collective wait"),
)
# node chart → (metric, title, y axis title, aggregate drawn)
NODE_METRICS = {
    "util": ("gpu.util", "GPU utilisation", "%", "avg"),
    "memory": ("gpu.mem_used_bytes", "GPU memory used", "bytes", "avg"),
    "temperature": ("gpu.temp_c", "GPU temperature", "°C", "max"),
    "power": ("gpu.power_w", "GPU power", "W", "avg"),
    "throttle": ("gpu.throttle_reasons", "Throttle reasons (NVML bitmask)", "bitmask", "max"),
}


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
        return {"data": [], "layout": _layout(title, "time", "", None)}


def ms(ts: float) -> float:
    return round(ts * 1000.0, 1)


def _layout(title: str, x_title: str, y_title: str, tr: TimeRange | None, **extra) -> dict:
    # The x axis fits the data (the range picked bounds what is read, not what is drawn): a
    # run that began ten minutes ago fills the chart at "24h" too.
    xaxis: dict[str, Any] = {"title": {"text": x_title}}
    if tr is not None:
        xaxis["type"] = "date"
    return {
        "title": {"text": title},
        "xaxis": xaxis,
        "yaxis": {"title": {"text": y_title}},
        "margin": {"l": 60, "r": 20, "t": 40, "b": 80},
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


def _line(name: str, ts: list[float], values: list, **extra) -> dict:
    return {"type": "scatter", "mode": "lines", "name": name, "x": [ms(t) for t in ts],
            "y": finite(values), **extra}  # fmt: skip


# --- run charts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RunContext:
    run: Run
    began: float  # selectors.run_began(run): when its first step was reported
    summary: dict[str, Any] | None = None  # run_summary, for the goodput chart
    # the step history of a span, read once for the throughput, stages and loss charts
    step_histories: dict[tuple[float, float], dict[str, Any]] = field(default_factory=dict)
    # checksum agreement per range, read once for the chart and the page's table
    checks: dict[tuple[float, float], list[dict[str, Any]]] = field(default_factory=dict)

    def span(self, tr: TimeRange) -> tuple[float, float]:
        return selectors.run_span(run=self.run, tr=tr, began=self.began)


def _step_history(ctx: RunContext, tr: TimeRange) -> dict[str, Any]:
    span = ctx.span(tr)
    if span not in ctx.step_histories:
        start, end = span
        history = run_step_history(
            run_id=ctx.run.id, start=start, end=end, max_points=_step_points(start, end)
        ).to_dict()
        ctx.step_histories[span] = _trimmed(history)
    return ctx.step_histories[span]


def _step_points(start: float, end: float) -> int:
    return max(1, min(MAX_POINTS, int((end - start) / MIN_STEP_BUCKET_S)))


def _zero_filled(values: list) -> list:
    """Throughput in a bucket where no step ended is zero (a hang shows as a drop)."""
    return [0.0 if value is None else value for value in values]


def _trimmed(history: dict[str, Any]) -> dict[str, Any]:
    """The step history without its empty leading and trailing buckets (it is dense over the
    whole range), so that the x axis fits the run."""
    columns = [history["steps_per_s"], history["loss"], *history["stages"].values()]
    filled = [i for i in range(len(history["ts"])) if any(c[i] is not None for c in columns)]
    keep = slice(filled[0], filled[-1] + 1) if filled else slice(0, 0)
    return {
        **history,
        "ts": history["ts"][keep],
        "steps_per_s": history["steps_per_s"][keep],
        "tokens_per_s": history["tokens_per_s"][keep],
        "loss": history["loss"][keep],
        "stages": {name: values[keep] for name, values in history["stages"].items()},
    }


def throughput_figure(ctx: RunContext, tr: TimeRange) -> dict:
    history = _step_history(ctx, tr)
    return {
        "data": [
            _line("tokens/s", history["ts"], _zero_filled(history["tokens_per_s"])),
            _line("steps/s", history["ts"], _zero_filled(history["steps_per_s"]), yaxis="y2"),
        ],
        "layout": _layout(
            "Throughput", "time", "tokens/s", tr,
            yaxis2={"title": {"text": "steps/s"}, "overlaying": "y", "side": "right"},
        ),
    }  # fmt: skip


def step_time_figure(ctx: RunContext, tr: TimeRange) -> dict:
    start, end = ctx.span(tr)
    busy = selectors.rank_busy_history(
        run=ctx.run, start=start, end=end, max_points=HEATMAP_BUCKETS
    )
    trace = {
        "type": "heatmap",
        "name": "step time less collective wait",
        "x": [ms(t) for t in busy["ts"]],
        "y": busy["ranks"],
        "z": busy["z"],
        "colorscale": "YlOrRd",
        "colorbar": {"title": {"text": "s"}},
        "hoverongaps": False,
    }
    layout = _layout("Per-rank step time less collective wait", "time", "rank", tr)
    layout["yaxis"]["type"] = "category" if len(busy["ranks"]) <= 64 else "linear"
    return {"data": [trace], "layout": layout}


def stages_figure(ctx: RunContext, tr: TimeRange) -> dict:
    history = _step_history(ctx, tr)
    data = [
        _line(
            label,
            history["ts"],
            history["stages"].get(key, []),
            stackgroup="stages",
            stackgaps="interpolate",
            connectgaps=True,
        )  # fmt: skip
        for key, label in STAGES
    ]
    return {
        "data": data,
        "layout": _layout("Step split into stages", "time", "seconds per step", tr),
    }


def loss_figure(ctx: RunContext, tr: TimeRange) -> dict:
    history = _step_history(ctx, tr)
    return {
        "data": [_line("loss", history["ts"], history["loss"], connectgaps=True)],
        "layout": _layout("Loss", "time", "loss", tr),
    }


def run_checks(ctx: RunContext, tr: TimeRange) -> list[dict[str, Any]]:
    key = (tr.start, tr.end)
    if key not in ctx.checks:
        ctx.checks[key] = selectors.checksum_agreement(run=ctx.run, start=tr.start, end=tr.end)
    return ctx.checks[key]


def checksums_figure(ctx: RunContext, tr: TimeRange) -> dict:
    checks = run_checks(ctx, tr)
    steps = [c["step"] for c in checks]
    disagree = {k: [len(c[k]) for c in checks] for k in ("grad", "param", "canary")}
    agreeing = [
        c["ranks"] - len(set(c["grad"]) | set(c["param"]) | set(c["canary"])) for c in checks
    ]
    data = [{"type": "bar", "name": "ranks agreeing", "x": steps, "y": agreeing,
             "marker": {"color": "#7bc47f"}}]  # fmt: skip
    labels = {"grad": "gradient checksum", "param": "parameter checksum", "canary": "canary"}
    colors = {"grad": "#d62728", "param": "#9467bd", "canary": "#ff7f0e"}
    for key, label in labels.items():
        data.append({
            "type": "bar", "name": f"{label} differs", "x": steps, "y": disagree[key],
            "text": [", ".join(map(str, c[key])) for c in checks],
            "hovertemplate": "step %{x}: ranks %{text}<extra>" + label + "</extra>",
            "marker": {"color": colors[key]},
        })  # fmt: skip
    layout = _layout("Checksum agreement per checked step", "step", "ranks", None, barmode="stack")
    return {"data": data, "layout": layout}


def checkpoints_figure(ctx: RunContext, tr: TimeRange) -> dict:
    events = selectors.checkpoint_events(run=ctx.run, start=tr.start, end=tr.end)
    symbols = {"started": "circle-open", "completed": "circle", "failed": "x"}
    data = []
    for state, symbol in symbols.items():
        chosen = [e for e in events if e["state"] == state]
        data.append({
            "type": "scatter", "mode": "markers", "name": state,
            "x": [ms(e["ts"]) for e in chosen], "y": [e["tier"] for e in chosen],
            "text": [f"step {e['step']}" for e in chosen],
            "marker": {"symbol": symbol, "size": 10},
        })  # fmt: skip
    layout = _layout("Checkpoints", "time", "tier", tr)
    layout["yaxis"].update(type="category", categoryarray=["local", "durable"])
    return {"data": data, "layout": layout}


def goodput_figure(ctx: RunContext, tr: TimeRange) -> dict:
    """Goodput and the badput buckets over the detectors' window (not the picked range)."""
    summary = ctx.summary
    if summary is None:
        from apps.runs.selectors import run_summary

        summary = run_summary(run=ctx.run, now=tr.end)
    goodput = summary["goodput"] or {"productive_s": 0.0, "badput_s": {}}
    names = ["productive", *goodput["badput_s"]]
    seconds = finite([goodput["productive_s"], *goodput["badput_s"].values()])
    trace = {"type": "bar", "name": "seconds", "x": names, "y": seconds,
             "marker": {"color": ["#2ca02c"] + ["#d62728"] * (len(names) - 1)}}  # fmt: skip
    return {"data": [trace], "layout": _layout("Goodput and badput", "bucket", "seconds", None)}


RUN_CHARTS: dict[str, Callable[[RunContext, TimeRange], dict]] = {
    "throughput": throughput_figure,
    "step_time": step_time_figure,
    "stages": stages_figure,
    "loss": loss_figure,
    "checksums": checksums_figure,
    "checkpoints": checkpoints_figure,
    "goodput": goodput_figure,
}


# --- node charts ---------------------------------------------------------------------------


def node_metric_figure(node: Node, chart: str, tr: TimeRange) -> dict:
    metric, title, unit, aggregate = NODE_METRICS[chart]
    history = metric_history(
        node_ids=[node.id], metric=metric, gpu="all", start=tr.start, end=tr.end,
        max_points=MAX_POINTS,
    ).to_dict()  # fmt: skip
    series = sorted(history["series"], key=lambda s: (s["gpu"] is None, s["gpu"] or 0))
    data = [_line(f"GPU {s['gpu']}", s["ts"], s[aggregate]) for s in series]
    layout = _layout(title, "time", unit, tr)
    if unit == "bytes":
        layout["yaxis"]["tickformat"] = ".3s"
    return {"data": data, "layout": layout}


NODE_CHARTS = tuple(NODE_METRICS)


# --- export ------------------------------------------------------------------------------


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
