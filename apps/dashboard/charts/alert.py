"""An alert's evidence, drawn: the straggler against its peers, the hot GPU's temperature
(or the capped GPU's power) over the alert's window; every other kind's evidence as a
readable key/value table (the SDC alert's checksums are a table of their own, see
apps.alerts.selectors.detail.sdc_checksums)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from apps.alerts.choices import AlertKind
from apps.alerts.models import Alert
from apps.dashboard.charts.base import chart_layout, drawn, line_trace, ms
from apps.history.selectors import metric_history, run_rank_history

# The evidence window: from a while before the alert opened to its end (or now).
BEFORE_S = 600.0
AFTER_S = 300.0
MAX_SPAN_S = 31 * 86_400  # the page-wide range's limit (selectors.time_range_between)
EVIDENCE_BUCKETS = 120
STRAGGLER_COLOR, PEERS_COLOR = "#d62728", "#7f7f7f"


@dataclass(frozen=True)
class AlertWindow:
    """The span around the alert that its chart and its links show (epoch seconds)."""

    start: float
    end: float
    opened: float


def alert_window(alert: Alert, now: float) -> AlertWindow:
    opened = alert.opened_at.timestamp()
    ended = alert.resolved_at.timestamp() if alert.resolved_at else now
    end = min(max(ended, opened) + AFTER_S, now + AFTER_S)
    start = max(opened - BEFORE_S, end - MAX_SPAN_S)
    return AlertWindow(start=start, end=end, opened=opened)


def _opened_marker(window: AlertWindow) -> dict:
    x = ms(window.opened)
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
            "line": {"color": "#d62728", "width": 1, "dash": "dot"},
            "label": {"text": "opened", "textposition": "end", "font": {"size": 10}}}  # fmt: skip


def _layout(title: str, y_title: str, window: AlertWindow) -> dict:
    layout = chart_layout(title, "time", y_title, None)
    layout["xaxis"]["type"] = "date"
    layout.update(height=300, shapes=[_opened_marker(window)])
    return layout


def _said_empty(figure: dict, message: str) -> dict:
    if not any(v is not None for trace in figure["data"] for v in trace["y"]):
        figure["layout"]["annotations"] = [
            {"text": message, "showarrow": False, "xref": "paper", "yref": "paper",
             "x": 0.5, "y": 0.5, "font": {"size": 15, "color": "#57606a"}}
        ]  # fmt: skip
    return figure


def straggler_rank(alert: Alert) -> int | None:
    """The slow rank: the alert's, or a slow node's slowest (evidence.slowest_rank)."""
    if alert.rank is not None:
        return alert.rank
    slowest = (alert.evidence or {}).get("slowest_rank")
    return slowest if isinstance(slowest, int) else None


def straggler_figure(alert: Alert, window: AlertWindow) -> dict | None:
    """The slow rank's step time less collective wait (its own work) against the median of
    its peers' per time bucket."""
    rank = straggler_rank(alert)
    if alert.run_id is None or rank is None:
        return None
    history = run_rank_history(
        run_id=alert.run_id, start=window.start, end=window.end, max_points=EVIDENCE_BUCKETS
    )
    mine = history.busy[history.ranks.index(rank)] if rank in history.ranks else []
    peers = [row for r, row in zip(history.ranks, history.busy, strict=True) if r != rank]
    median = [
        statistics.median(values) if (values := [row[i] for row in peers if row[i] is not None])
        else None
        for i in range(len(history.ts))
    ]  # fmt: skip
    slow = line_trace(f"rank {rank}", history.ts[: len(mine)], mine,
                      line={"color": STRAGGLER_COLOR, "width": 2.5})  # fmt: skip
    typical = line_trace("median of its peers", history.ts, median,
                         line={"color": PEERS_COLOR, "width": 1.5, "dash": "dash"})  # fmt: skip
    layout = _layout(
        f"Rank {rank} against the median of its peers", "s per step (less collective wait)",
        window,
    )  # fmt: skip
    layout["yaxis"]["rangemode"] = "tozero"
    figure = {"data": [slow, typical], "layout": layout}
    return _said_empty(figure, "no step reports in this window")


def _gpu_metric_figure(
    alert: Alert, window: AlertWindow, metric: str, title: str, unit: str, limit_key: str
) -> dict | None:
    if alert.node_id is None or alert.gpu is None:
        return None
    history = metric_history(
        node_ids=[alert.node_id], metric=metric, gpu=alert.gpu, start=window.start,
        end=window.end, max_points=EVIDENCE_BUCKETS * 3,
    ).to_dict()  # fmt: skip
    data = [
        line_trace(f"GPU {alert.gpu}", s["ts"], s["max"], line={"color": STRAGGLER_COLOR})
        for s in history["series"]
    ]
    layout = _layout(title, unit, window)
    limit = (alert.evidence or {}).get(limit_key)
    if isinstance(limit, int | float):
        layout["shapes"].append(
            {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": limit, "y1": limit,
             "line": {"color": PEERS_COLOR, "width": 1, "dash": "dash"},
             "label": {"text": f"limit {limit:g} {unit}", "textposition": "end",
                       "font": {"size": 10}}}
        )  # fmt: skip
        layout["yaxis"]["autorangeoptions"] = {"include": [limit]}
    figure = {"data": data or [line_trace(f"GPU {alert.gpu}", [], [])], "layout": layout}
    return _said_empty(figure, "no readings in this window")


def thermal_figure(alert: Alert, window: AlertWindow) -> dict | None:
    return _gpu_metric_figure(
        alert, window, "gpu.temp_c", f"GPU {alert.gpu} temperature", "°C", "limit_c"
    )


def power_figure(alert: Alert, window: AlertWindow) -> dict | None:
    return _gpu_metric_figure(
        alert, window, "gpu.power_w", f"GPU {alert.gpu} power", "W", "power_limit_w"
    )


EVIDENCE_FIGURES: dict[str, Callable[[Alert, AlertWindow], dict | None]] = {
    AlertKind.STRAGGLER: straggler_figure,
    AlertKind.THERMAL: thermal_figure,
    AlertKind.POWER: power_figure,
}


def evidence_figure(alert: Alert, window: AlertWindow) -> dict | None:
    """The alert's evidence chart, or None for a kind drawn as a table only."""
    build = EVIDENCE_FIGURES.get(alert.kind)
    return drawn(f"alert-{alert.kind}", build, alert, window) if build else None


def evidence_rows(evidence: Any, prefix: str = "") -> list[dict[str, str]]:
    """The evidence JSON as {"key", "value"} rows: nested objects as "outer · inner" keys,
    lists joined, numbers rounded, booleans as yes/no, null as "–"."""
    if not isinstance(evidence, dict):
        return [{"key": prefix or "evidence", "value": _text(evidence)}]
    rows = []
    for key, value in evidence.items():
        label = f"{prefix} · {_words(key)}" if prefix else _words(key)
        if isinstance(value, dict) and value:
            rows += evidence_rows(value, label)
        else:
            rows.append({"key": label, "value": _text(value)})
    return rows


def _words(key: str) -> str:
    return str(key).replace("_", " ")


def _text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value) or "–"
    if isinstance(value, dict):
        return "–"
    return str(value)
