"""The home page (the clusters a user may see) and a cluster's overview."""

from __future__ import annotations

import time

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from apps.access.selectors import clusters_visible
from apps.alerts.choices import AlertState
from apps.alerts.selectors import alert_json, detector_pass_status
from apps.clusters.choices import NodeDownBy, NodeState
from apps.core.db_router import replica_reads
from apps.dashboard.selectors.alerts import OVERVIEW_ALERTS, open_alerts
from apps.dashboard.selectors.blocks import (
    BLOCK_KEY_MAX_LENGTH,
    block_node_ids,
    fleet_nodes,
    node_blocks,
)
from apps.dashboard.selectors.health import HEALTH_RULES, TILE_STATES
from apps.dashboard.selectors.runs import ended_runs, running_runs
from apps.dashboard.views.common import cluster_or_404, live_config, tile_config, with_tiles
from apps.live.selectors import node_health_list
from apps.runs.selectors import run_names_by_node


@login_required
@require_GET
@replica_reads
def home(request: HttpRequest) -> HttpResponse:
    clusters = list(clusters_visible(user=request.user).order_by("name"))
    if len(clusters) == 1:
        return redirect("cluster-overview", cluster=clusters[0].name)
    return render(request, "dashboard/home.html", {"clusters": clusters})


@login_required
@require_GET
@replica_reads
def cluster_overview(request: HttpRequest, cluster: str) -> HttpResponse:
    """Node cards; past OVERVIEW_NODE_CARDS nodes, blocks of nodes (selectors.blocks), and
    ?block=<key> the cards of one block."""
    found = cluster_or_404(request, cluster, with_node_count=True)
    now = time.time()
    block_key = request.GET.get("block")
    ids = None
    if block_key is not None:
        # a block's page reads its own nodes alone
        ids = block_node_ids(cluster_id=found.id, key=block_key[:BLOCK_KEY_MAX_LENGTH])
        if not ids:
            raise Http404("no such block")
    alert_rows = open_alerts(cluster=found)
    open_alerts_json = [alert_json(a) for a in alert_rows]
    running = running_runs(cluster=found, now=now)
    runs_on = run_names_by_node(runs=running)  # node id → its runs, for the cards
    if block_key is None and found.node_count > settings.OVERVIEW_NODE_CARDS:
        # a fleet: its blocks, and its counts, from its nodes' tile states (no tile built)
        nodes = fleet_nodes(cluster_id=found.id, alerts=open_alerts_json, now=now)
        blocks = node_blocks([{**node, "runs": runs_on.get(node["id"], [])} for node in nodes])
        shown: list[dict] = []
        healthy = sum(block["tiles"].get("ok", 0) for block in blocks)
        total = sum(block["gpus"] for block in blocks)
    else:
        nodes = (
            node_health_list(cluster_id=found.id) if ids is None else node_health_list(node_ids=ids)
        )
        blocks = None
        shown = [
            {**with_tiles(node, open_alerts_json, now), "runs": runs_on.get(node["id"], [])}
            for node in nodes
        ]
        # a block's page counts its own nodes (its live counts can only count those)
        healthy = sum(tile["state"] == "ok" for row in shown for tile in row["tiles"])
        total = sum(len(row["tiles"]) for row in shown)
    context = {
        "cluster": found,
        "nodes": shown,
        "blocks": blocks,
        "block_field": settings.OVERVIEW_BLOCK_FIELD,
        "block_nodes": settings.OVERVIEW_BLOCK_NODES,
        "block": block_key,
        "runs": running,
        "ended_runs": ended_runs(cluster=found, now=now),
        "detectors": detector_pass_status(cluster=found, now=now),
        "healthy_gpus": healthy,
        "total_gpus": total,
        "node_count": len(nodes),
        "firing": sum(a["state"] == AlertState.FIRING for a in open_alerts_json),
        "unacknowledged": warnings_unacknowledged(open_alerts_json, now),
        # out of run plans: a cordoned node, and a draining one (its drain not yet over)
        "cordoned": sum(node["state"] == NodeState.CORDONED for node in nodes),
        "draining": sum(node["state"] == NodeState.DRAINING for node in nodes),
        "maintenance": sum(node["state"] == NodeState.MAINTENANCE for node in nodes),
        # drained, down or not responding in the scheduler (its state hook), with its reason
        "scheduler_down": sum(node["down_by"] == NodeDownBy.SCHEDULER for node in nodes),
        "newest_alert_rows": alert_rows[:OVERVIEW_ALERTS],
        "tile_states": TILE_STATES,
        "page_data": {
            # the cards' nodes only: a fleet's blocks page carries no node (4,096 nodes'
            # health would be megabytes); it reloads its blocks (blocks.js)
            "nodes": nodes if blocks is None else [],
            "node_runs": {row["node"]: row["runs"] for row in shown if row["runs"]},
            "alerts": open_alerts_json,
            "rules": HEALTH_RULES,
            "only_shown": block_key is not None,
            **tile_config(found.name),
        },
        "live": live_config([found.name]) if blocks is None else None,
    }
    return render(request, "dashboard/overview.html", context)


def warnings_unacknowledged(alerts: list[dict], now: float) -> dict:
    """The overview's amber count: firing warnings, how many of them aged (unacknowledged
    past the cluster's warning_age_min), and the oldest one's age in minutes."""
    firing = [a for a in alerts if a["state"] == AlertState.FIRING and a["severity"] == "warning"]
    oldest = min((a["opened_at"] for a in firing), default=None)
    return {
        "count": len(firing),
        "aged": sum(a["aged_at"] is not None for a in firing),
        "oldest_min": int((now - oldest) // 60) if oldest is not None else None,
    }
