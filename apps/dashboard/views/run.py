"""A run's page and its chart endpoints, and one rank's page."""

from __future__ import annotations

import time

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.gzip import gzip_page
from django.views.decorators.http import require_GET

from apps.commands.pages import run_commands_context
from apps.core.bounds import NAME_MAX_LENGTH
from apps.core.db_router import replica_reads
from apps.core.errors import error_response
from apps.dashboard.charts.base import drawn_or_said_empty
from apps.dashboard.charts.ranks import rank_stage_figures
from apps.dashboard.charts.run import (
    RUN_CHARTS,
    RUN_CHARTS_FETCHED,
    RunContext,
    goodput_text,
    run_checks,
)
from apps.dashboard.selectors.alerts import PAGE_ALERTS, alerts_filtered
from apps.dashboard.selectors.ranges import RANGES, time_range
from apps.dashboard.selectors.runs import run_began, run_of
from apps.dashboard.views.common import (
    DEFAULT_RANGE,
    chart_panels,
    chart_range,
    chart_response,
    cluster_or_404,
    live_config,
    page_range,
    range_config,
)
from apps.runs.selectors import run_rank_places, run_summary

RUN_NODES_SHOWN = 32


@login_required
@require_GET
@replica_reads
def run_detail(request: HttpRequest, cluster: str, run: str) -> HttpResponse:
    found = cluster_or_404(request, cluster)
    run_found = run_of(cluster=found, name=run)
    if run_found is None:
        raise Http404("no such run")
    now = time.time()
    began = run_began(run_found)
    default = DEFAULT_RANGE if run_found.state == "running" else "all"
    tr = page_range(request, default, now, began)
    summary = run_summary(run=run_found, now=now)
    ctx = RunContext(run=run_found, began=began, now=now, summary=summary)
    figures = {
        name: drawn_or_said_empty(name, build, ctx, tr)
        for name, build in RUN_CHARTS.items()
        if name not in RUN_CHARTS_FETCHED
    }
    checks = run_checks(ctx, tr)
    alerts = alerts_filtered(cluster=found, run=run_found.name, limit=PAGE_ALERTS)
    context = {
        "cluster": found,
        "run": run_found,
        "summary": summary,
        # a frontier run's thousands of nodes are no list to read: the first ones, a count
        "nodes_shown": summary["nodes"][:RUN_NODES_SHOWN],
        "nodes_more": max(0, len(summary["nodes"]) - RUN_NODES_SHOWN),
        "panels": chart_panels(
            RUN_CHARTS, figures, "run-chart-json", {"cluster": cluster, "run": run}, tr
        ),
        "alerts": alerts,
        "checks": checks,
        "disagreeing": [c for c in checks if c["grad"] or c["param"] or c["canary"]],
        "goodput_text": goodput_text(summary["goodput"]),
        "ranges": RANGES,
        "time_range": tr,
        "live": live_config([found.name]),
        "page_data": {
            "watch_nodes": summary["nodes"],
            "range": range_config(tr, default),
            "rank_url": _rank_url_prefix(cluster, run),
        },
        **run_commands_context(user=request.user, cluster=found, run=run_found),
    }
    return render(request, "dashboard/run.html", context)


@login_required
@require_GET
@gzip_page  # a 1,024-rank heat-map is ~1 MB of JSON, ~6x less gzipped; no secret in it
@replica_reads
def run_chart(request: HttpRequest, cluster: str, run: str, chart: str, fmt: str) -> HttpResponse:
    found = cluster_or_404(request, cluster)
    run_found = run_of(cluster=found, name=run)
    if run_found is None or chart not in RUN_CHARTS:
        raise Http404("no such run or chart")
    began = run_began(run_found)
    tr = chart_range(request, began=began)
    if isinstance(tr, HttpResponse):
        return tr
    group = _rank_group(request)
    if isinstance(group, HttpResponse):
        return group
    ctx = RunContext(run=run_found, began=began, rank_group=group)
    figure = drawn_or_said_empty(chart, RUN_CHARTS[chart], ctx, tr)
    return chart_response(figure, tr, chart, fmt)


def _rank_group(request: HttpRequest) -> tuple[str, str] | HttpResponse | None:
    """The heat-map's drill-down (?node_from=&node_to=: a group's first and last node by
    name, as its meta.groups gives them; both empty: the ranks of no known node)."""
    if "node_from" not in request.GET and "node_to" not in request.GET:
        return None
    first, last = request.GET.get("node_from", ""), request.GET.get("node_to", "")
    if len(first) > NAME_MAX_LENGTH or len(last) > NAME_MAX_LENGTH or last < first:
        loc = "node_to" if last < first else "node_from"
        msg = f"node names of at most {NAME_MAX_LENGTH} characters, node_from ≤ node_to"
        return error_response(400, [{"loc": loc, "msg": msg}])
    return first, last


# Ranges of the rank page: it reads raw step reports (every rank's, for the peers' median),
# so the longest range stays a few hours.
RANK_RANGES = ("15m", "1h", "6h")


def _rank_url_prefix(cluster: str, run: str) -> str:
    """A rank page's URL less the rank and its slash (heatmap.js appends them), reversed so
    the names are quoted as the URL wants."""
    url = reverse("rank-detail", kwargs={"cluster": cluster, "run": run, "rank": 0})
    return url.removesuffix("0/")


@login_required
@require_GET
@replica_reads
def rank_detail(request: HttpRequest, cluster: str, run: str, rank: int) -> HttpResponse:
    """One rank's step split over time against the median of its peers, where it runs and
    the alerts about it (a click on its heat-map row leads here)."""
    found = cluster_or_404(request, cluster)
    run_found = run_of(cluster=found, name=run)
    if run_found is None or not 0 <= rank < max(run_found.world_size, 1):
        raise Http404("no such run or rank")
    key = request.GET.get("range", RANK_RANGES[0])
    key = key if key in RANK_RANGES else RANK_RANGES[0]
    # an ended run's range ends at its last step, not now
    now = time.time()
    if run_found.state != "running" and run_found.last_step_at is not None:
        now = min(now, run_found.last_step_at.timestamp() + 1)
    tr = time_range(key=key, now=now)
    figures = rank_stage_figures(run_found, rank, tr)
    alerts = alerts_filtered(cluster=found, run=run_found.name, limit=PAGE_ALERTS)
    context = {
        "cluster": found,
        "run": run_found,
        "rank": rank,
        "place": run_rank_places(run=run_found).get(rank),
        "figures": [
            {"name": name, "figure_id": f"figure-{name}", "figure": figure}
            for name, figure in figures.items()
        ],
        "alerts": [alert for alert in alerts if alert.rank == rank],
        "rank_ranges": RANK_RANGES,
        "time_range": tr,
    }
    return render(request, "dashboard/rank.html", context)
