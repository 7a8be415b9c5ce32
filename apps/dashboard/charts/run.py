"""The run page's charts (RUN_CHARTS): throughput, the heat-map (ranks.py), stages, loss,
checksum agreement, checkpoints and goodput, each built from a RunContext that reads what
several charts share once."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from apps.dashboard.charts.base import MAX_POINTS, chart_layout, empty, finite, line_trace, ms
from apps.dashboard.charts.context import RunContext
from apps.dashboard.charts.ranks import step_time_figure
from apps.dashboard.selectors.ranges import TimeRange, as_of
from apps.dashboard.selectors.runs import (
    checkpoint_events,
    checkpoint_reported,
    checksum_agreement,
)
from apps.history.selectors import run_step_history
from apps.runs.selectors import run_goodput
from detectors.goodput import BUCKETS

# Step buckets no narrower than this: narrower than a step, most buckets would hold no step
# and the charts would be gaps and zeros.
MIN_STEP_BUCKET_S = 10.0  # the 10-second step rollups' width
# A first or last step bucket that the run covers for less than this share is left out: the
# rate of a sliver of a bucket depends on where the step boundaries happen to fall.
MIN_COVERED = 0.25
STAGES = (
    ("data_time", "data loading"),
    ("h2d_time", "host-to-device"),
    ("compute_time", "compute"),
    ("comm_wait", "collective wait"),
)


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


def _no_steps(ctx: RunContext) -> str:
    return "no step reports yet" if ctx.run.last_step is None else "no step in this time range"


def _rates_covered(ctx: RunContext, tr: TimeRange, history: dict[str, Any]) -> dict[str, list]:
    """Steps/s and tokens/s per bucket over the part of it that the run covered. A bucket
    holding the run's start or its newest report is partial: its count over the whole
    bucket would plunge like a crash at the live edge. Scaled by the covered fraction rather
    than dropped, because the newest rate stays visible (a real slowdown in the last bucket
    shows) and at coarse resolutions dropping would hide minutes; a sliver under
    MIN_COVERED is dropped (when other buckets remain)."""
    width = history["resolution_s"]
    first, last = ctx.span(tr)  # what was read: from the run's start, to the range's end
    if ctx.run.last_step_at is not None:
        last = min(last, ctx.run.last_step_at.timestamp())  # no report after the newest
    points = []
    for t, steps, tokens in zip(
        history["ts"], history["steps_per_s"], history["tokens_per_s"], strict=True
    ):
        covered = (min(t + width, last) - max(t, first)) / width
        scale = 1.0 / covered if 0 < covered < 1 else 1.0
        points.append((covered, t, _scaled(steps, scale), _scaled(tokens, scale)))
    kept = [p for p in points if p[0] >= MIN_COVERED] or points
    return {
        "ts": [p[1] for p in kept],
        "steps_per_s": _zero_filled([p[2] for p in kept]),
        "tokens_per_s": _zero_filled([p[3] for p in kept]),
    }


def _scaled(value: Any, scale: float) -> Any:
    return value * scale if isinstance(value, int | float) and math.isfinite(value) else value


def throughput_figure(ctx: RunContext, tr: TimeRange) -> dict:
    """Tokens/s above steps/s, each on its own axis: both follow the step rate, so on two
    axes overlaid one line would hide the other."""
    rates = _rates_covered(ctx, tr, _step_history(ctx, tr))
    layout = chart_layout(
        "Throughput", "time", "tokens/s", tr, height=400, showlegend=False,
        yaxis2={"title": {"text": "steps/s"}, "domain": [0, 0.44], "automargin": True,
                "rangemode": "tozero"},
    )  # fmt: skip
    layout["yaxis"].update(domain=[0.56, 1], rangemode="tozero", tickformat=".3s")
    layout["xaxis"]["anchor"] = "y2"
    figure = {
        "data": [
            line_trace("tokens/s", rates["ts"], rates["tokens_per_s"]),
            line_trace("steps/s", rates["ts"], rates["steps_per_s"], yaxis="y2"),
        ],
        "layout": layout,
    }
    return figure if rates["ts"] else empty(figure, _no_steps(ctx))


def stages_figure(ctx: RunContext, tr: TimeRange) -> dict:
    history = _step_history(ctx, tr)
    data = [
        line_trace(
            label,
            history["ts"],
            history["stages"].get(key, []),
            stackgroup="stages",
            stackgaps="interpolate",
            connectgaps=True,
        )  # fmt: skip
        for key, label in STAGES
    ]
    figure = {
        "data": data,
        "layout": chart_layout("Step split into stages", "time", "seconds per step", tr),
    }
    return figure if history["ts"] else empty(figure, _no_steps(ctx))


def loss_figure(ctx: RunContext, tr: TimeRange) -> dict:
    history = _step_history(ctx, tr)
    figure = {
        "data": [line_trace("loss", history["ts"], history["loss"], connectgaps=True)],
        "layout": chart_layout("Loss", "time", "loss", tr),
    }
    if not any(value is not None for value in history["loss"]):
        return empty(
            figure, "no loss reported in this time range" if history["ts"] else _no_steps(ctx)
        )
    return figure


def run_checks(ctx: RunContext, tr: TimeRange) -> list[dict[str, Any]]:
    key = (tr.start, tr.end)
    if key not in ctx.checks:
        ctx.checks[key] = checksum_agreement(run=ctx.run, start=tr.start, end=tr.end)
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
    layout = chart_layout(
        "Checksum agreement per checked step", "step", "ranks", None, barmode="stack"
    )
    figure = {"data": data, "layout": layout}
    return figure if checks else empty(figure, "no checksummed step in this time range")


def checkpoints_figure(ctx: RunContext, tr: TimeRange) -> dict:
    events = checkpoint_events(run=ctx.run, start=tr.start, end=tr.end)
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
    layout = chart_layout("Checkpoints", "time", "tier", tr)
    layout["yaxis"].update(type="category", categoryarray=["local", "durable"])
    # the run's span, not the events' (autoscaled to two saves at one moment: a millisecond)
    layout["xaxis"]["range"] = [ms(t) for t in ctx.span(tr)]
    figure = {"data": data, "layout": layout}
    if events:
        return figure
    if checkpoint_reported(run=ctx.run):
        return empty(figure, "no checkpoint in this time range")
    return empty(figure, "no checkpoint reported yet")


def goodput_text(goodput: dict[str, Any] | None) -> str:
    """The goodput as the run page's tile prints it (the chart's title and the live refresh
    print this same text: one rounding everywhere)."""
    return "–" if goodput is None else f"{goodput['goodput'] * 100:.0f} %"


def goodput_figure(ctx: RunContext, tr: TimeRange) -> dict:
    """Goodput and the badput buckets over the detectors' window (not the picked range), as
    of the range's end but never past now (as_of): the summary's very numbers
    when the page computed one for that moment, else run_goodput's (the one selector).
    layout.meta carries the moment and the numbers, for the page's tile."""
    moment = as_of(tr, ctx.now)
    if ctx.summary is not None and moment == ctx.now:
        found = ctx.summary["goodput"]
    else:
        found = run_goodput(run=ctx.run, now=moment)
    goodput = found or {"productive_s": 0.0, "badput_s": {}}
    buckets = BUCKETS if found else ()  # not the contract's always-0 `wasted`
    names = ["productive", *buckets]
    badput = [goodput["badput_s"].get(name, 0.0) for name in buckets]
    seconds = finite([goodput["productive_s"], *badput])
    trace = {"type": "bar", "name": "seconds", "x": names, "y": seconds,
             "marker": {"color": ["#2ca02c"] + ["#d62728"] * (len(names) - 1)}}  # fmt: skip
    title = f"Goodput {goodput_text(found)}" if found else "Goodput and badput"
    layout = chart_layout(title, "bucket", "seconds", None)
    layout["meta"] = {"as_of": moment, "goodput": found, "text": goodput_text(found)}
    figure = {"data": [trace], "layout": layout}
    return figure if found else empty(figure, _no_steps(ctx))


RUN_CHARTS: dict[str, Callable[[RunContext, TimeRange], dict]] = {
    "throughput": throughput_figure,
    "step_time": step_time_figure,
    "stages": stages_figure,
    "loss": loss_figure,
    "checksums": checksums_figure,
    "checkpoints": checkpoints_figure,
    "goodput": goodput_figure,
}
# Run charts the page does not embed: charts.js fetches them from their endpoint after load
# (the same figure, built by the same selector for the same range). The heat-map of 1,024
# ranks is ≈ 1.1 MB and ≈ 300 ms of the page's server time.
RUN_CHARTS_FETCHED = ("step_time",)
