"""The fleet page: the costliest nodes and GPUs of the clusters the user may see over the last
7, 30 or 90 days (the maintenance ledger, apps.dashboard.selectors.ledger), and its CSV and
JSON exports, which say what the page and `GET /api/v1/ledger` say."""

from __future__ import annotations

import csv
import io
import time

import orjson
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from apps.access.selectors import clusters_readable
from apps.core.db_router import replica_reads
from apps.core.errors import error_response
from apps.dashboard.selectors.ledger import (
    DAYS_KEPT,
    LEDGER_DAYS,
    days_valid,
    fleet_ledger_json,
    ledger_csv_rows,
)


@login_required
@require_GET
@replica_reads
def fleet_page(request: HttpRequest, fmt: str = "html") -> HttpResponse:
    days = days_valid(request.GET.get("days"))
    if days is None:
        return error_response(400, [{"loc": "days", "msg": DAYS_KEPT}])
    cluster = request.GET.get("cluster", "")
    clusters = list(clusters_readable(request, cluster or None))  # as GET /api/v1/ledger
    fleet = fleet_ledger_json(clusters=clusters, days=days, now=time.time())
    if fmt == "json":
        return HttpResponse(orjson.dumps(fleet), content_type="application/json")
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(ledger_csv_rows(fleet))
        response = HttpResponse(out.getvalue(), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="ledger-{days}d.csv"'
        return response
    context = {"fleet": fleet, "days": days, "all_days": LEDGER_DAYS, "cluster_name": cluster}
    return render(request, "dashboard/fleet.html", context)
