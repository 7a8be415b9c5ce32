"""A node's page and its chart endpoints."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET

from apps.alerts.choices import OPEN_STATES
from apps.alerts.selectors import alert_json
from apps.clusters.models import Cluster, Node
from apps.commands.pages import node_commands_context
from apps.core.bounds import MAX_GPUS
from apps.core.db_router import replica_reads
from apps.dashboard.charts.base import NO_DATA, NO_GPUS, drawn_or_said_empty
from apps.dashboard.charts.node import (
    HOST_CHART_METRICS,
    NODE_CHARTS,
    NodeContext,
    gpu_throttle_now,
    node_chart_names,
)
from apps.dashboard.selectors.alerts import PAGE_ALERTS, alerts_filtered
from apps.dashboard.selectors.health import HEALTH_RULES, node_gpu_count
from apps.dashboard.selectors.ledger import LEDGER_DAYS, days_valid, node_ledger
from apps.dashboard.selectors.nodes import node_events, node_of, node_reports_gpus, node_runs
from apps.dashboard.selectors.ranges import RANGES, TimeRange
from apps.dashboard.views.common import (
    DEFAULT_RANGE,
    chart_panels,
    chart_range,
    chart_response,
    cluster_or_404,
    live_config,
    page_range,
    range_config,
    tile_config,
    with_tiles,
)
from apps.live.selectors import node_health_list
from apps.telemetry.selectors import health_series, series_grouped


@login_required
@require_GET
@replica_reads
def node_detail(request: HttpRequest, cluster: str, node: str) -> HttpResponse:
    found = cluster_or_404(request, cluster)
    node_found = node_of(cluster=found, name=node)
    if node_found is None:
        raise Http404("no such node")
    now = time.time()
    tr = page_range(request, DEFAULT_RANGE, now)
    health = node_health_list(node_ids=[node_found.id])[0]
    node_ctx = NodeContext(node=node_found, health=health["health"])
    chart_names = node_chart_names(health["health"])
    said = _node_empty_said(node_found)
    figures = {
        name: drawn_or_said_empty(name, NODE_CHARTS[name], node_ctx, tr, said=said(name))
        for name in chart_names
    }
    alerts = alerts_filtered(cluster=found, node=node_found.name, limit=PAGE_ALERTS)
    open_alerts = [alert_json(a) for a in alerts if a.state in OPEN_STATES]
    tiled = with_tiles(health, open_alerts, now)
    context = {
        "cluster": found,
        "node": node_found,
        "node_reason": health["reason"],
        "health": health,
        "tiles": tiled["tiles"],
        "gpus_not_shown": tiled["gpus_not_shown"],
        "gpu_count": node_gpu_count(health),
        "panels": chart_panels(
            chart_names, figures, "node-chart-json", {"cluster": cluster, "node": node}, tr
        ),
        **_node_gpus_and_runs(request, node_found, health["health"], tr),
        "events": node_events(node=node_found),
        **_node_ledger(request, node_found, found, now),
        "series": _node_series(request, health["health"]),
        "alerts": alerts,
        "ranges": RANGES,
        "time_range": tr,
        "live": live_config([found.name]),
        "page_data": {
            "range": range_config(tr, DEFAULT_RANGE),
            "watch_nodes": [node_found.name],
            "nodes": [health],
            "alerts": open_alerts,
            "rules": HEALTH_RULES,
            **tile_config(found.name),
        },
        **node_commands_context(user=request.user, cluster=found, node=node_found),
    }
    return render(request, "dashboard/node.html", context)


def _node_gpus_and_runs(request: HttpRequest, node: Node, health: dict, tr: TimeRange) -> dict:
    """The node page's GPU picker (?gpu= singles one out), each GPU's throttle reasons now
    (decoded), and the runs and ranks on the node."""
    gpu = request.GET.get("gpu", "")
    return {
        "gpu_selected": int(gpu) if gpu.isdigit() else None,
        "gpu_indexes": sorted(int(key) for key in health if key.isdigit())[:MAX_GPUS],
        "throttle_now": gpu_throttle_now(health),
        "node_runs": node_runs(node=node, since=tr.start),
    }


def _node_ledger(request: HttpRequest, node: Node, cluster: Cluster, now: float) -> dict:
    """The node's ledger (?ledger= days, else 7): its own row first (GPU blank), then each
    GPU's, as `GET /api/v1/nodes/{name}/ledger` gives them."""
    node.cluster = cluster  # read already: the ledger names it without a query
    days = days_valid(request.GET.get("ledger")) or LEDGER_DAYS[0]
    found = node_ledger(node=node, days=days, now=now).to_dict()
    own = {k: v for k, v in found.items() if k != "gpus"}
    return {
        "ledger": {"days": days, "rows": [{**own, "gpu": None}, *found["gpus"]]},
        "ledger_days": LEDGER_DAYS,
    }


def _node_empty_said(node) -> Callable[[str], str]:
    """What an empty chart of the node says: a GPU chart of a node without GPUs says that."""
    gpus = node_reports_gpus(node)

    def said(chart: str) -> str:
        host = chart in HOST_CHART_METRICS
        return NO_GPUS if not (gpus or host) else NO_DATA

    return said


SERIES_LISTED_MAX = 500


def _node_series(request: HttpRequest, health: dict) -> dict:
    """The node's series grouped by source, from the health rows already read (no query);
    with ?source= the series of that scrape target and their latest values."""
    rows = {None if key == "host" else int(key): values for key, values in health.items()}
    source = request.GET.get("source") or None
    grouped = series_grouped(
        series=health_series({gpu: [m for m in v if m != "ts"] for gpu, v in rows.items()}),
        source=source,
    )
    listed = grouped["series"] if source else []
    for entry in listed[:SERIES_LISTED_MAX]:
        entry["value"] = rows[entry["gpu"]][entry["metric"]]
    return {
        "source": source,
        "sources": grouped["sources"],
        "listed": listed[:SERIES_LISTED_MAX],
        "not_shown": max(0, len(listed) - SERIES_LISTED_MAX),
    }


@login_required
@require_GET
@gzip_page  # as the run's charts: figures of numbers, no secret in them
@replica_reads
def node_chart(request: HttpRequest, cluster: str, node: str, chart: str, fmt: str) -> HttpResponse:
    found = cluster_or_404(request, cluster)
    node_found = node_of(cluster=found, name=node)
    if node_found is None or chart not in NODE_CHARTS:
        raise Http404("no such node or chart")
    tr = chart_range(request)
    if isinstance(tr, HttpResponse):
        return tr
    health = node_health_list(node_ids=[node_found.id])[0]["health"]
    node_ctx = NodeContext(node=node_found, health=health)
    said = _node_empty_said(node_found)(chart)
    figure = drawn_or_said_empty(chart, NODE_CHARTS[chart], node_ctx, tr, said=said)
    return chart_response(figure, tr, chart, fmt)
