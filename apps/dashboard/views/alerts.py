"""The alerts page (filtered), one alert's page (summary, how long it fired, its timeline, its
evidence drawn, and links to the run, node and rank at the alert's time: ?from=&to= epoch
seconds, the page-wide time range; ?gpu= singles out the culprit GPU), and acknowledging."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from apps.access.choices import Action
from apps.access.selectors import clusters_visible, user_may
from apps.alerts.choices import AlertKind, AlertState
from apps.alerts.models import Alert
from apps.alerts.selectors import alert_get
from apps.alerts.selectors.detail import alert_duration, alert_timeline, sdc_checksums
from apps.alerts.services import (
    AlertAlreadyAcknowledged,
    AlertNotFiring,
    AlertResolved,
    alert_acknowledge,
    alert_acknowledge_authorize,
    alert_acknowledge_hidden,
    alert_silence,
    alert_silence_authorize,
)
from apps.alerts.services.ageing import SILENCE_MAX_MIN
from apps.core.db_router import replica_reads
from apps.dashboard.charts import alert as alert_charts
from apps.dashboard.charts.alert import AlertWindow
from apps.dashboard.selectors.alerts import alert_kinds, alerts_filtered
from apps.dashboard.views.common import live_config

ALERT_FILTERS = ("cluster", "kind", "state", "run", "node")


@login_required
@require_GET
@replica_reads
def alerts_page(request: HttpRequest) -> HttpResponse:
    filters = {name: request.GET.get(name, "").strip() for name in ALERT_FILTERS}
    clusters = list(clusters_visible(user=request.user).order_by("name"))
    cluster = next((c for c in clusters if c.name == filters["cluster"]), None)
    if filters["cluster"] and cluster is None:
        raise Http404("no such cluster")
    alerts = alerts_filtered(
        cluster=cluster, visible=clusters, **{k: v for k, v in filters.items() if k != "cluster"}
    )
    # the live feed of the clusters whose alerts are listed (of every cluster when none is)
    watched = [cluster.name] if cluster else sorted({a.cluster.name for a in alerts})
    watched = watched or [c.name for c in clusters]
    context = {
        "alerts": alerts,
        "filters": filters,
        "clusters": clusters,
        # every kind a detector raises, and any other stored (a newer detector's)
        "kinds": sorted({*AlertKind.values, *alert_kinds()}),
        "states": AlertState.values,
        "live": live_config(watched) if watched else None,
    }
    return render(request, "dashboard/alerts.html", context)


@login_required
@require_POST
def alert_ack(request: HttpRequest, alert_id: int) -> HttpResponse:
    """Acknowledge with a note (CSRF-protected form; operate on the alert's cluster)."""
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        alert_acknowledge_hidden(user=request.user, alert_id=alert_id, request=request)
        raise Http404("no such alert")
    note = request.POST.get("note", "")[:2000]
    if not alert_acknowledge_authorize(user=request.user, alert=alert, note=note, request=request):
        return HttpResponseForbidden("you may not acknowledge this cluster's alerts")
    try:
        alert_acknowledge(alert=alert, user=request.user, note=note, request=request)
        messages.success(request, f"Alert {alert_id} acknowledged.")
    except (AlertResolved, AlertAlreadyAcknowledged) as error:
        messages.warning(request, f"Alert {alert_id} not acknowledged: {error}")
    return _back(request)


@login_required
@require_POST
def alert_silence_form(request: HttpRequest, alert_id: int) -> HttpResponse:
    """Silence for a stated time with a reason (CSRF-protected form; operate on the cluster)."""
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        raise Http404("no such alert")
    reason = request.POST.get("reason", "").strip()[:2000]
    minutes = request.POST.get("minutes", "")
    if not reason or not minutes.isdigit() or not 1 <= int(minutes) <= SILENCE_MAX_MIN:
        messages.warning(request, f"Alert {alert_id} not silenced: give minutes (1 to "
                         f"{SILENCE_MAX_MIN}) and a reason.")  # fmt: skip
    elif not alert_silence_authorize(
        user=request.user, alert=alert, reason=reason, request=request
    ):
        return HttpResponseForbidden("you may not silence this cluster's alerts")
    else:
        try:
            alert_silence(alert=alert, user=request.user, minutes=int(minutes), reason=reason,
                          request=request)  # fmt: skip
            messages.success(request, f"Alert {alert_id} silenced for {minutes} min.")
        except AlertNotFiring as error:
            messages.warning(request, f"Alert {alert_id} not silenced: {error}")
    return _back(request)


@login_required
@require_GET
@replica_reads
def alert_detail(request: HttpRequest, alert_id: int) -> HttpResponse:
    """404 unless the alert is of a cluster the user holds a role in (or a superuser)."""
    alert = alert_get(alert_id=alert_id, visible=clusters_visible(user=request.user))
    if alert is None:
        raise Http404("no such alert")
    now = time.time()
    window = alert_charts.alert_window(alert, now)
    figure = alert_charts.evidence_figure(alert, window)
    context = {
        "cluster": alert.cluster,
        "alert": alert,
        "duration": alert_duration(alert=alert, now=now),
        "timeline": alert_timeline(alert=alert),
        "figure": figure,
        "checksums": sdc_checksums(alert=alert) if alert.kind == AlertKind.SDC else [],
        "evidence": alert_charts.evidence_rows(alert.evidence),
        "window_steps": _window_steps(alert),
        "links": alert_links(alert, window),
        "may_acknowledge": alert.state == AlertState.FIRING
        and user_may(user=request.user, cluster=alert.cluster, action=Action.OPERATE),
        "live": live_config([alert.cluster.name]),
    }
    return render(request, "dashboard/alert.html", context)


def _window_steps(alert: Alert) -> int | None:
    """The detector's window in steps (a window size, not how long the alert has fired)."""
    steps = (alert.evidence or {}).get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def alert_links(alert: Alert, window: AlertWindow) -> list[dict[str, str]]:
    """The run, the node and the rank at the alert's time: {"label", "url"}."""
    span = {"from": int(window.start), "to": int(window.end) + 1}
    cluster = alert.cluster.name
    links = []
    rank = alert_charts.straggler_rank(alert) if alert.kind == AlertKind.STRAGGLER else alert.rank
    if alert.run is not None:
        run_url = reverse("run-detail", kwargs={"cluster": cluster, "run": alert.run.name})
        links.append({"label": f"run {alert.run.name}", "url": _with(run_url, span)})
        if rank is not None:
            links.append({"label": f"rank {rank}", "url": rank_url(alert, rank, span)})
    if alert.node is not None:
        node_url = reverse("node-detail", kwargs={"cluster": cluster, "node": alert.node.name})
        gpu = {"gpu": alert.gpu} if alert.gpu is not None else {}
        links.append({"label": f"node {alert.node.name}", "url": _with(node_url, span | gpu)})
    return links


def rank_url(alert: Alert, rank: int, span: dict[str, Any]) -> str:
    assert alert.run is not None
    names = {"cluster": alert.cluster.name, "run": alert.run.name, "rank": rank}
    return _with(reverse("rank-detail", kwargs=names), span)


def _with(url: str, query: dict[str, Any]) -> str:
    return f"{url}?{urlencode(query)}"


def _back(request: HttpRequest) -> HttpResponse:
    """Back to the page the form was posted from (`next`, this site's only), else the list."""
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, {request.get_host()}, request.is_secure()):
        back = "/alerts/"
    return redirect(back)
