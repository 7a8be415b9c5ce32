"""The dashboard pages (login required) and their chart endpoints (JSON and CSV)."""

from __future__ import annotations

import time

import orjson
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from apps.access.selectors import clusters_visible
from apps.alerts.choices import OPEN_STATES, AlertState
from apps.alerts.selectors import alert_get, alert_json, detector_pass_status
from apps.alerts.services import (
    AlertAlreadyAcknowledged,
    AlertResolved,
    alert_acknowledge,
    alert_acknowledge_authorize,
)
from apps.core.bounds import MAX_GPUS
from apps.core.errors import error_response
from apps.dashboard import charts, selectors
from apps.dashboard.selectors import HEALTH_RULES, RANGES, RangeInvalid, TimeRange
from apps.live.selectors import node_health_list
from apps.runs.selectors import run_summary
from apps.telemetry.selectors import health_series, series_grouped

DEFAULT_RANGE = "1h"
NODE_PLACEHOLDER = "__node__"


def _cluster_or_404(request: HttpRequest, name: str):
    """The named cluster if the user may see it (a role in it, or superuser); else 404."""
    cluster = clusters_visible(user=request.user).filter(name=name).first()
    if cluster is None:
        raise Http404("no such cluster")
    return cluster


def _live_config(cluster_names: list[str]) -> dict:
    return {"clusters": cluster_names, "ws_port": settings.LIVE_WS_PORT}


@login_required
@require_GET
def home(request: HttpRequest) -> HttpResponse:
    clusters = list(clusters_visible(user=request.user).order_by("name"))
    if len(clusters) == 1:
        return redirect("cluster-overview", cluster=clusters[0].name)
    return render(request, "dashboard/home.html", {"clusters": clusters})


@login_required
@require_GET
def cluster_overview(request: HttpRequest, cluster: str) -> HttpResponse:
    found = _cluster_or_404(request, cluster)
    now = time.time()
    nodes = node_health_list(cluster_id=found.id)
    alert_rows = selectors.open_alerts(cluster=found)
    open_alerts = [alert_json(a) for a in alert_rows]
    rows = [_tiled(node, open_alerts, now) for node in nodes]
    tiles = [tile for row in rows for tile in row["tiles"]]
    context = {
        "cluster": found,
        "nodes": rows,
        "runs": selectors.running_runs(cluster=found, now=now),
        "ended_runs": selectors.ended_runs(cluster=found, now=now),
        "detectors": detector_pass_status(cluster=found, now=now),
        "healthy_gpus": sum(tile["state"] == "ok" for tile in tiles),
        "total_gpus": len(tiles),
        "firing": sum(a["state"] == AlertState.FIRING for a in open_alerts),
        "newest_alert_rows": alert_rows[: selectors.OVERVIEW_ALERTS],
        "tile_states": selectors.TILE_STATES,
        "page_data": {
            "nodes": nodes,
            "alerts": open_alerts,
            "rules": HEALTH_RULES,
            **_tile_config(found.name),
        },
        "live": _live_config([found.name]),
    }
    return render(request, "dashboard/overview.html", context)


def _tiled(node: dict, open_alerts: list[dict], now: float) -> dict:
    """The node with its tiles (at most MAX_GPUS) and how many GPUs they leave out."""
    tiles = selectors.node_tiles(node=node, alerts=open_alerts, now=now)
    return {**node, "tiles": tiles, "gpus_not_shown": selectors.node_gpu_count(node) - len(tiles)}


def _tile_config(cluster: str) -> dict:
    """For overview.js: the tile cap, and a node's URL with NODE_PLACEHOLDER for the
    percent-encoded name (reversed here, so the JS never spells the URL scheme)."""
    node_url = reverse("node-detail", kwargs={"cluster": cluster, "node": NODE_PLACEHOLDER})
    return {"max_gpus": MAX_GPUS, "node_url": node_url, "node_placeholder": NODE_PLACEHOLDER}


def _range_key(request: HttpRequest, default: str) -> str:
    return request.GET.get("range", default)


def _page_range(
    request: HttpRequest, default: str, now: float, began: float | None = None
) -> TimeRange:
    """A page's initial range: ?range= if valid, else DEFAULT_RANGE (a page never 400s on a
    stale link; the chart endpoints do name a bad range)."""
    try:
        return selectors.time_range(key=_range_key(request, default), now=now, began=began)
    except RangeInvalid:
        return selectors.time_range(key=DEFAULT_RANGE, now=now, began=began)


def _chart_panels(
    names, figures: dict[str, dict], url_name: str, names_kwargs: dict, tr: TimeRange
) -> list[dict]:
    """A panel per chart; its url, to which the page appends ".json" or ".csv", is reversed
    (so quoted) from the names: a node named "a?b" still gets a working chart link."""
    return [
        {"name": name, "figure_id": f"figure-{name}", "figure": figures[name],
         "url": reverse(url_name, kwargs={**names_kwargs, "chart": name}).removesuffix(".json"),
         "range": tr.key}
        for name in names
    ]  # fmt: skip


@login_required
@require_GET
def run_detail(request: HttpRequest, cluster: str, run: str) -> HttpResponse:
    found = _cluster_or_404(request, cluster)
    run_found = selectors.run_of(cluster=found, name=run)
    if run_found is None:
        raise Http404("no such run")
    now = time.time()
    began = selectors.run_began(run_found)
    default = DEFAULT_RANGE if run_found.state == "running" else "all"
    tr = _page_range(request, default, now, began)
    summary = run_summary(run=run_found, now=now)
    ctx = charts.RunContext(run=run_found, began=began, summary=summary)
    figures = {
        name: charts.drawn(name, build, ctx, tr) for name, build in charts.RUN_CHARTS.items()
    }
    alerts = selectors.alerts_filtered(
        cluster=found, run=run_found.name, limit=selectors.PAGE_ALERTS
    )
    context = {
        "cluster": found,
        "run": run_found,
        "summary": summary,
        "panels": _chart_panels(
            charts.RUN_CHARTS, figures, "run-chart-json", {"cluster": cluster, "run": run}, tr
        ),
        "alerts": alerts,
        "checks": charts.run_checks(ctx, tr),
        "ranges": RANGES,
        "live": _live_config([found.name]),
        "page_data": {"watch_nodes": summary["nodes"]},
    }
    return render(request, "dashboard/run.html", context)


@login_required
@require_GET
def node_detail(request: HttpRequest, cluster: str, node: str) -> HttpResponse:
    found = _cluster_or_404(request, cluster)
    node_found = selectors.node_of(cluster=found, name=node)
    if node_found is None:
        raise Http404("no such node")
    now = time.time()
    tr = _page_range(request, DEFAULT_RANGE, now)
    figures = {
        name: charts.drawn(name, charts.node_metric_figure, node_found, name, tr)
        for name in charts.NODE_CHARTS
    }
    alerts = selectors.alerts_filtered(
        cluster=found, node=node_found.name, limit=selectors.PAGE_ALERTS
    )
    health = node_health_list(node_ids=[node_found.id])[0]
    open_alerts = [alert_json(a) for a in alerts if a.state in OPEN_STATES]
    tiled = _tiled(health, open_alerts, now)
    context = {
        "cluster": found,
        "node": node_found,
        "health": health,
        "tiles": tiled["tiles"],
        "gpus_not_shown": tiled["gpus_not_shown"],
        "panels": _chart_panels(
            charts.NODE_CHARTS, figures, "node-chart-json", {"cluster": cluster, "node": node}, tr
        ),
        "events": selectors.node_events(node=node_found),
        "series": _node_series(request, health["health"]),
        "alerts": alerts,
        "ranges": RANGES,
        "live": _live_config([found.name]),
        "page_data": {
            "watch_nodes": [node_found.name],
            "nodes": [health],
            "alerts": open_alerts,
            "rules": HEALTH_RULES,
            **_tile_config(found.name),
        },
    }
    return render(request, "dashboard/node.html", context)


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


ALERT_FILTERS = ("cluster", "kind", "state", "run", "node")


@login_required
@require_GET
def alerts_page(request: HttpRequest) -> HttpResponse:
    filters = {name: request.GET.get(name, "").strip() for name in ALERT_FILTERS}
    clusters = list(clusters_visible(user=request.user).order_by("name"))
    cluster = next((c for c in clusters if c.name == filters["cluster"]), None)
    if filters["cluster"] and cluster is None:
        raise Http404("no such cluster")
    alerts = selectors.alerts_filtered(
        cluster=cluster, visible=clusters, **{k: v for k, v in filters.items() if k != "cluster"}
    )
    # the live feed of the clusters whose alerts are listed (of every cluster when none is)
    watched = [cluster.name] if cluster else sorted({a.cluster.name for a in alerts})
    watched = watched or [c.name for c in clusters]
    context = {
        "alerts": alerts,
        "filters": filters,
        "clusters": clusters,
        "kinds": selectors.alert_kinds(),
        "states": AlertState.values,
        "live": _live_config(watched) if watched else None,
    }
    return render(request, "dashboard/alerts.html", context)


@login_required
@require_POST
def alert_ack(request: HttpRequest, alert_id: int) -> HttpResponse:
    """Acknowledge with a note (CSRF-protected form; operate on the alert's cluster)."""
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        raise Http404("no such alert")
    note = request.POST.get("note", "")[:2000]
    if not alert_acknowledge_authorize(user=request.user, alert=alert, note=note, request=request):
        return HttpResponseForbidden("you may not acknowledge this cluster's alerts")
    try:
        alert_acknowledge(alert=alert, user=request.user, note=note, request=request)
        messages.success(request, f"Alert {alert_id} acknowledged.")
    except (AlertResolved, AlertAlreadyAcknowledged) as error:
        messages.warning(request, f"Alert {alert_id} not acknowledged: {error}")
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = "/alerts/"
    return redirect(back)


def _chart_response(figure: dict, tr: TimeRange, chart: str, fmt: str) -> HttpResponse:
    if fmt == "csv":
        response = HttpResponse(charts.figure_csv(figure), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{chart}-{tr.key}.csv"'
        return response
    body = {"chart": chart, "range": tr.key, "start": tr.start, "end": tr.end, "figure": figure}
    # orjson writes a NaN or infinite float as null: the answer is always JSON
    return HttpResponse(orjson.dumps(body, default=str), content_type="application/json")


def _chart_range(request: HttpRequest, **kwargs) -> TimeRange | HttpResponse:
    try:
        return selectors.time_range(
            key=request.GET.get("range", DEFAULT_RANGE), now=time.time(), **kwargs
        )
    except RangeInvalid as error:
        return error_response(400, [{"loc": "range", "msg": str(error)}])


@login_required
@require_GET
def run_chart(request: HttpRequest, cluster: str, run: str, chart: str, fmt: str) -> HttpResponse:
    found = _cluster_or_404(request, cluster)
    run_found = selectors.run_of(cluster=found, name=run)
    if run_found is None or chart not in charts.RUN_CHARTS:
        raise Http404("no such run or chart")
    began = selectors.run_began(run_found)
    tr = _chart_range(request, began=began)
    if isinstance(tr, HttpResponse):
        return tr
    ctx = charts.RunContext(run=run_found, began=began)
    figure = charts.drawn(chart, charts.RUN_CHARTS[chart], ctx, tr)
    return _chart_response(figure, tr, chart, fmt)


@login_required
@require_GET
def node_chart(request: HttpRequest, cluster: str, node: str, chart: str, fmt: str) -> HttpResponse:
    found = _cluster_or_404(request, cluster)
    node_found = selectors.node_of(cluster=found, name=node)
    if node_found is None or chart not in charts.NODE_CHARTS:
        raise Http404("no such node or chart")
    tr = _chart_range(request)
    if isinstance(tr, HttpResponse):
        return tr
    figure = charts.drawn(chart, charts.node_metric_figure, node_found, chart, tr)
    return _chart_response(figure, tr, chart, fmt)
