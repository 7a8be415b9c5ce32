"""What the pages share: the cluster a user may see, the live feed's config, a node's
tiles, the page-wide time range (?range= or ?from=&to=), and the chart panels and endpoints."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from apps.access.selectors import clusters_visible
from apps.clusters.models import Node
from apps.core.bounds import MAX_GPUS
from apps.core.errors import error_response
from apps.dashboard.charts.export import figure_csv
from apps.dashboard.selectors.health import node_gpu_count, node_tiles
from apps.dashboard.selectors.ranges import (
    CUSTOM_RANGE,
    RangeInvalid,
    TimeRange,
    time_range,
    time_range_between,
)

DEFAULT_RANGE = "1h"
NODE_PLACEHOLDER = "__node__"


def cluster_or_404(request: HttpRequest, name: str, *, with_node_count: bool = False):
    """The named cluster if the user may see it (a role in it, or superuser); else 404.
    `with_node_count`: with its `node_count`, read in the same query."""
    clusters = clusters_visible(user=request.user).filter(name=name)
    if with_node_count:
        nodes = Node.objects.filter(cluster=OuterRef("pk")).order_by().values("cluster")
        count = nodes.annotate(count=Count("id")).values("count")
        clusters = clusters.annotate(node_count=Coalesce(Subquery(count), 0))
    cluster = clusters.first()
    if cluster is None:
        raise Http404("no such cluster")
    return cluster


def live_config(cluster_names: list[str]) -> dict:
    return {"clusters": cluster_names, "ws_port": settings.LIVE_WS_PORT}


def with_tiles(node: dict, open_alerts: list[dict], now: float) -> dict:
    """The node with its tiles (at most MAX_GPUS) and how many GPUs they leave out."""
    tiles = node_tiles(node=node, alerts=open_alerts, now=now)
    return {**node, "tiles": tiles, "gpus_not_shown": node_gpu_count(node) - len(tiles)}


def tile_config(cluster: str) -> dict:
    """For overview.js: the tile cap, and a node's URL with NODE_PLACEHOLDER for the
    percent-encoded name (reversed here, so the JS never spells the URL scheme)."""
    node_url = reverse("node-detail", kwargs={"cluster": cluster, "node": NODE_PLACEHOLDER})
    return {"max_gpus": MAX_GPUS, "node_url": node_url, "node_placeholder": NODE_PLACEHOLDER}


def _moment(text: str) -> float:
    """A ?from= / ?to= value: Unix seconds, or ISO 8601 (UTC when it names no zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise RangeInvalid("from and to must be Unix seconds or ISO 8601 times") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _requested_range(
    request: HttpRequest, default: str, now: float, began: float | None = None
) -> TimeRange:
    """?from=&to= (an absolute range: a zoom, a shared link), else ?range= (up to now)."""
    if "from" in request.GET or "to" in request.GET:
        return time_range_between(
            start=_moment(request.GET.get("from", "")), end=_moment(request.GET.get("to", ""))
        )
    return time_range(key=request.GET.get("range", default), now=now, began=began)


def page_range(
    request: HttpRequest, default: str, now: float, began: float | None = None
) -> TimeRange:
    """A page's initial range: the query's if valid, else `default` (a page never 400s on a
    stale link; the chart endpoints do name a bad range)."""
    try:
        return _requested_range(request, default, now, began)
    except RangeInvalid:
        return time_range(key=default, now=now, began=began)


def _range_query(tr: TimeRange) -> str:
    """The query string that asks a chart endpoint for the range (charts.js writes the same)."""
    if tr.key == CUSTOM_RANGE:
        return f"from={tr.start:.3f}&to={tr.end:.3f}"
    return f"range={tr.key}"


def range_config(tr: TimeRange, default: str) -> dict:
    """For charts.js: the page's range (a key, or an absolute from/to) and the default."""
    return {"key": tr.key, "start": tr.start, "end": tr.end, "default": default}


def figure_json(value: Any) -> bytes:
    """A figure (or a chart answer) as JSON: orjson writes a NaN or infinite float as null,
    so the answer is always JSON."""
    return orjson.dumps(value, default=str)


# What Django's json_script escapes, so that a string in a figure cannot end the script.
_SCRIPT_ESCAPES = (("<", "\\u003C"), (">", "\\u003E"), ("&", "\\u0026"))


def figure_script(figure: dict, element_id: str) -> SafeString:
    """`figure|json_script:element_id`, serialised as the chart endpoints do (orjson: a NaN
    or infinite float is null): the heat-map of 1,024 ranks is 1.4 MB, which the standard
    json module took ~100 ms to write."""
    text = figure_json(figure).decode()
    for char, escaped in _SCRIPT_ESCAPES:
        text = text.replace(char, escaped)
    return format_html(
        '<script id="{}" type="application/json">{}</script>', element_id, mark_safe(text)
    )


def chart_panels(
    names, figures: dict[str, dict], url_name: str, names_kwargs: dict, tr: TimeRange
) -> list[dict]:
    """A panel per chart, its figure as a script element (figure_script); a chart without
    one in `figures` is `fetched`: charts.js fetches its figure from the url after load. The
    url, to which the page appends ".json" or ".csv", is reversed (so quoted) from the names:
    a node named "a?b" still gets a working chart link."""
    return [
        {"name": name, "figure_id": f"figure-{name}" if name in figures else "",
         "figure": figures.get(name), "fetched": name not in figures,
         "script": figure_script(figures[name], f"figure-{name}") if name in figures else "",
         "url": reverse(url_name, kwargs={**names_kwargs, "chart": name}).removesuffix(".json"),
         "range": tr.key, "query": _range_query(tr)}
        for name in names
    ]  # fmt: skip


def chart_response(figure: dict, tr: TimeRange, chart: str, fmt: str) -> HttpResponse:
    if fmt == "csv":
        response = HttpResponse(figure_csv(figure), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="{chart}-{tr.key}.csv"'
        return response
    body = {"chart": chart, "range": tr.key, "start": tr.start, "end": tr.end, "figure": figure}
    return HttpResponse(figure_json(body), content_type="application/json")


def chart_range(request: HttpRequest, **kwargs) -> TimeRange | HttpResponse:
    try:
        return _requested_range(request, DEFAULT_RANGE, time.time(), **kwargs)
    except RangeInvalid as error:
        loc = "from" if "from" in request.GET or "to" in request.GET else "range"
        return error_response(400, [{"loc": loc, "msg": str(error)}])
