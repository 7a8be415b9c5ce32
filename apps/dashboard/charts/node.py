"""The node page's figures: one chart per GPU metric (a trace per GPU, each tagged with its
GPU in `meta` so that static/js/node-gpus.js can single one out and grey the others), and the
host's CPU, memory, network and disk charts where the agent sends them.

Axes are not autoscaled to noise: percentages span 0–100 %, temperature starts at a fixed
floor, power and throughput at zero. Memory is drawn as a share of the GPU's (or host's)
total, the bytes in the hover. Throttle reasons are decoded from the NVML bitmask with the
detectors' table (detectors.thermal.REASONS): the one place the bit values are written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apps.clusters.models import Node
from apps.dashboard.charts.base import MAX_POINTS, chart_layout, finite, line_trace
from apps.dashboard.selectors.health import HEALTH_RULES
from apps.dashboard.selectors.ranges import TimeRange
from apps.history.selectors import metric_history
from detectors.thermal import REASONS, throttle_reasons

# Plotly's default colour way: GPU g keeps colour g % 10 whatever is highlighted.
GPU_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
TEMP_FLOOR_C = 20.0
NO_THROTTLE = "none"
# acronyms kept upper-case when a reason's NVML name is turned into words
REASON_ACRONYMS = frozenset({"SW", "HW", "GPU"})


@dataclass(frozen=True)
class NodeContext:
    node: Node
    health: dict[str, Any]  # node_health_list's "health": latest values per "0", "1", … and "host"

    def latest(self, gpu: int | None, metric: str) -> float | None:
        values = self.health.get("host" if gpu is None else str(gpu)) or {}
        value = values.get(metric)
        return float(value) if isinstance(value, int | float) and value > 0 else None


def reason_label(name: str) -> str:
    """NVML's constant name in words: "SW_THERMAL_SLOWDOWN" → "SW thermal slowdown"."""
    words = [w if w in REASON_ACRONYMS else w.lower() for w in name.split("_")]
    text = " ".join(words)
    return text[:1].upper() + text[1:]


THROTTLE_LABELS = [reason_label(name) for name in REASONS.values()]


def throttle_labels(mask: Any) -> list[str]:
    """The reasons set in a throttle-reasons mask, in words (bit order); [] for none."""
    if not isinstance(mask, int | float) or mask < 0 or mask != mask:
        return []
    return [reason_label(name) for name in throttle_reasons(int(mask))]


def gpu_throttle_now(health: dict[str, Any]) -> list[dict[str, Any]]:
    """Per GPU (index order) its latest throttle mask and the reasons it names."""
    rows = []
    for key in sorted((k for k in health if k.isdigit()), key=int):
        mask = health[key].get("gpu.throttle_reasons")
        if mask is None:
            continue
        rows.append({"gpu": int(key), "mask": mask, "reasons": throttle_labels(mask)})
    return rows


def _series(ctx: NodeContext, metric: str, gpu: Any, tr: TimeRange) -> list[dict[str, Any]]:
    history = metric_history(
        node_ids=[ctx.node.id], metric=metric, gpu=gpu, start=tr.start, end=tr.end,
        max_points=MAX_POINTS,
    ).to_dict()  # fmt: skip
    return sorted(history["series"], key=lambda s: (s["gpu"] is None, s["gpu"] or 0))


def _gpu_line(gpu: int, ts: list[float], values: list, **extra) -> dict:
    color = GPU_COLORS[gpu % len(GPU_COLORS)]
    return line_trace(
        f"GPU {gpu}", ts, values, meta={"gpu": gpu, "color": color},
        line={"color": color, "width": 1.5}, legendgroup=f"gpu-{gpu}", **extra,
    )  # fmt: skip


def _y_include(layout: dict, low: float, high: float | None = None, **extra) -> dict:
    """The y axis spans at least [low, high] (autoscaled beyond them, never inside)."""
    include = [low] if high is None else [low, high]
    layout["yaxis"].update(autorangeoptions={"include": include}, **extra)
    if high is not None:
        layout["yaxis"].update(range=[low, high])
    return layout


def _hline(y: float, label: str, color: str) -> dict:
    return {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
            "line": {"color": color, "width": 1, "dash": "dot"},
            "label": {"text": label, "textposition": "end", "font": {"size": 10}}}  # fmt: skip


def util_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    data = [
        _gpu_line(s["gpu"], s["ts"], s["avg"], hovertemplate="%{y:.0f} %")
        for s in _series(ctx, "gpu.util", "all", tr)
    ]
    layout = chart_layout("GPU utilisation", "time", "%", tr)
    return {"data": data, "layout": _y_include(layout, 0, 100)}


def _share(values: list, total: float) -> list:
    return [None if v is None else round(100.0 * v / total, 2) for v in finite(values)]


def memory_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    """Memory used as % of each GPU's total (bytes in the hover); in bytes only when a GPU
    has not reported its total."""
    series = _series(ctx, "gpu.mem_used_bytes", "all", tr)
    totals = {s["gpu"]: ctx.latest(s["gpu"], "gpu.mem_total_bytes") for s in series}
    if all(totals.values()):
        data = [
            _gpu_line(s["gpu"], s["ts"], _share(s["avg"], totals[s["gpu"]]),
                      customdata=finite(s["avg"]),
                      hovertemplate=f"%{{y:.1f}} % (%{{customdata:.3s}}B of "
                                    f"{_bytes(totals[s['gpu']])})")
            for s in series
        ]  # fmt: skip
        layout = chart_layout("GPU memory used", "time", "% of total", tr)
        return {"data": data, "layout": _y_include(layout, 0, 100)}
    data = [_gpu_line(s["gpu"], s["ts"], s["avg"], hovertemplate="%{y:.3s}B") for s in series]
    layout = chart_layout("GPU memory used", "time", "bytes", tr)
    return {"data": data, "layout": _y_include(layout, 0, tickformat=".3s", ticksuffix="B")}


def _bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1000.0
    return f"{value:.1f} TB"  # not reached


def temperature_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    data = [
        _gpu_line(s["gpu"], s["ts"], s["max"], hovertemplate="%{y:.0f} °C")
        for s in _series(ctx, "gpu.temp_c", "all", tr)
    ]
    warning, critical = HEALTH_RULES["temp_warning_c"], HEALTH_RULES["temp_critical_c"]
    layout = chart_layout("GPU temperature", "time", "°C", tr)
    layout["shapes"] = [
        _hline(warning, "warning", "#e6a700"),
        _hline(critical, "critical", "#d62728"),
    ]
    layout["yaxis"]["autorangeoptions"] = {"include": [TEMP_FLOOR_C, critical + 5]}
    return {"data": data, "layout": layout}


def power_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    series = _series(ctx, "gpu.power_w", "all", tr)
    data = [_gpu_line(s["gpu"], s["ts"], s["avg"], hovertemplate="%{y:.0f} W") for s in series]
    layout = chart_layout("GPU power", "time", "W", tr)
    limits = [x for s in series if (x := ctx.latest(s["gpu"], "gpu.power_limit_w"))]
    if limits:
        layout["shapes"] = [_hline(max(limits), "power limit", "#7f7f7f")]
    return {"data": data, "layout": _y_include(layout, 0, max(limits) if limits else None)}


def throttle_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    """A row per throttle reason (and "none"), a mark where a GPU was held back by it. The
    mask of a bucket is its largest reading (exact at raw resolution; a rollup bucket may
    miss a bit that only a smaller mask of the bucket held)."""
    data = []
    for s in _series(ctx, "gpu.throttle_reasons", "all", tr):
        xs, ys = [], []
        for t, mask in zip(s["ts"], finite(s["max"]), strict=True):
            if mask is None:
                continue
            for label in throttle_labels(mask) or [NO_THROTTLE]:
                xs.append(t)
                ys.append(label)
        trace = _gpu_line(s["gpu"], xs, [], mode="markers", hovertemplate="%{y}")
        trace.update(y=ys, marker={"color": trace["line"]["color"], "size": 7, "symbol": "square"})
        data.append(trace)
    layout = chart_layout("Throttle reasons (NVML, decoded)", "time", "", tr)
    layout["yaxis"].update(
        # every reason has its row, set or not: the eye finds a reason at the same height
        type="category", categoryorder="array", categoryarray=[NO_THROTTLE, *THROTTLE_LABELS],
        range=[-0.5, len(THROTTLE_LABELS) + 0.5], automargin=True,
    )  # fmt: skip
    layout["margin"] = {**layout["margin"], "l": 170}
    layout["height"] = 380
    return {"data": data, "layout": layout}


# --- host --------------------------------------------------------------------------------


def _host_lines(ctx: NodeContext, tr: TimeRange, named: dict[str, str], template: str) -> list:
    data = []
    for metric, name in named.items():
        for s in _series(ctx, metric, None, tr):
            data.append(line_trace(name, s["ts"], s["avg"], hovertemplate=template))
    return data


def host_cpu_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    data = _host_lines(ctx, tr, {"host.cpu_util": "CPU"}, "%{y:.0f} %")
    layout = chart_layout("Host CPU utilisation", "time", "%", tr)
    return {"data": data, "layout": _y_include(layout, 0, 100)}


def host_memory_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    total = ctx.latest(None, "host.mem_total_bytes")
    data = []
    for s in _series(ctx, "host.mem_used_bytes", None, tr):
        if total:
            data.append(line_trace(
                "used", s["ts"], _share(s["avg"], total), customdata=finite(s["avg"]),
                hovertemplate=f"%{{y:.1f}} % (%{{customdata:.3s}}B of {_bytes(total)})",
            ))  # fmt: skip
        else:
            data.append(line_trace("used", s["ts"], s["avg"], hovertemplate="%{y:.3s}B"))
    if total:
        layout = chart_layout("Host memory used", "time", "% of total", tr)
        return {"data": data, "layout": _y_include(layout, 0, 100)}
    layout = chart_layout("Host memory used", "time", "bytes", tr)
    return {"data": data, "layout": _y_include(layout, 0, tickformat=".3s", ticksuffix="B")}


def _rate_figure(ctx: NodeContext, tr: TimeRange, title: str, named: dict[str, str]) -> dict:
    data = _host_lines(ctx, tr, named, "%{y:.3s}B/s")
    layout = chart_layout(title, "time", "bytes/s", tr)
    return {"data": data, "layout": _y_include(layout, 0, tickformat=".3s", ticksuffix="B/s")}


def host_network_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    named = {"host.net_rx_bytes_per_s": "received", "host.net_tx_bytes_per_s": "sent"}
    return _rate_figure(ctx, tr, "Host network", named)


def host_disk_figure(ctx: NodeContext, tr: TimeRange) -> dict:
    named = {"host.disk_read_bytes_per_s": "read", "host.disk_write_bytes_per_s": "written"}
    return _rate_figure(ctx, tr, "Host disk", named)


NODE_CHARTS: dict[str, Callable[[NodeContext, TimeRange], dict]] = {
    "util": util_figure,
    "memory": memory_figure,
    "temperature": temperature_figure,
    "power": power_figure,
    "throttle": throttle_figure,
    "host_cpu": host_cpu_figure,
    "host_memory": host_memory_figure,
    "host_network": host_network_figure,
    "host_disk": host_disk_figure,
}
# a host chart is drawn when the node's latest host values hold one of its series
HOST_CHART_METRICS = {
    "host_cpu": ("host.cpu_util",),
    "host_memory": ("host.mem_used_bytes",),
    "host_network": ("host.net_rx_bytes_per_s", "host.net_tx_bytes_per_s"),
    "host_disk": ("host.disk_read_bytes_per_s", "host.disk_write_bytes_per_s"),
}


def node_chart_names(health: dict[str, Any]) -> list[str]:
    """The node's charts: every GPU chart, and the host charts whose series it sends."""
    host = health.get("host") or {}
    return [
        name for name in NODE_CHARTS
        if name not in HOST_CHART_METRICS or any(m in host for m in HOST_CHART_METRICS[name])
    ]  # fmt: skip
