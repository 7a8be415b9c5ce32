"""The audit page (/audit/): the log of the clusters one administers, filtered; CSV export.

It lives in access, not audit, because who reads which entries is a question of roles:
apps.audit stays the log itself, which access writes to."""

import csv

import orjson
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden
from django.shortcuts import render
from django.views.decorators.http import require_GET

from apps.access.selectors import audit_cluster_ids, audit_may_read, clusters_administered
from apps.audit.choices import Outcome
from apps.audit.selectors import CSV_COLUMNS, audit_list

AUDIT_FILTERS = ("cluster", "actor", "action", "outcome")


@login_required
@require_GET
def audit_page(request: HttpRequest) -> HttpResponse:
    if not audit_may_read(user=request.user):
        return HttpResponseForbidden("only a cluster's admins read its audit log")
    filters = {name: request.GET.get(name, "").strip() for name in AUDIT_FILTERS}
    entries = audit_list(cluster_ids=audit_cluster_ids(user=request.user), **filters)
    if request.GET.get("format") == "csv":
        return _csv(entries)
    context = {
        "entries": entries,
        "filters": filters,
        "clusters": clusters_administered(user=request.user).order_by("name"),
        "outcomes": Outcome.values,
    }
    return render(request, "audit/list.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv(entries) -> HttpResponse:
    writer = csv.writer(_Echo())
    rows = [writer.writerow(CSV_COLUMNS)]
    for entry in entries:
        values = [getattr(entry, column) for column in CSV_COLUMNS]
        values[0] = entry.at.isoformat()
        values[-1] = orjson.dumps(entry.detail).decode()
        # a cell starting with = + - @ is a formula to a spreadsheet: quote it as text
        rows.append(writer.writerow([_inert(value) for value in values]))
    response = HttpResponse("".join(rows), content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="audit.csv"'
    return response


def _inert(value) -> str:
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
