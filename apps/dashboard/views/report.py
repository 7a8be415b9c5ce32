"""A run's reliability report: the page, and its JSON and Markdown exports (the Markdown to
paste into a post-mortem). One dict (selectors.report.run_report) behind all of them and
`GET /api/v1/runs/NAME/report`."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from apps.core.db_router import replica_reads
from apps.dashboard.selectors.report import run_report
from apps.dashboard.selectors.runs import run_of
from apps.dashboard.views.common import cluster_or_404


@login_required
@require_GET
@replica_reads
def run_report_page(request: HttpRequest, cluster: str, run: str, fmt: str = "html"):
    found = cluster_or_404(request, cluster)
    run_found = run_of(cluster=found, name=run)
    if run_found is None:
        raise Http404("no such run")
    report = run_report(run=run_found)
    if fmt == "json":
        return HttpResponse(orjson.dumps(report), content_type="application/json")
    if fmt == "md":
        response = HttpResponse(report_markdown(report), content_type="text/markdown")
        response["Content-Disposition"] = f'attachment; filename="{run_found.name}-report.md"'
        return response
    for item in report["interruptions"]:  # the page's <time> elements want datetimes
        item["at_time"] = datetime.fromtimestamp(item["at"], UTC)
    context = {"cluster": found, "run": run_found, "report": report}
    return render(request, "dashboard/run_report.html", context)


def _when(ts: float | None) -> str:
    return "—" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _hours(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 3600:.2f} h"


def report_markdown(report: dict) -> str:
    """The report as Markdown: the same numbers as the page and the JSON."""
    lines = [
        f"# Reliability report: {report['run']} ({report['cluster']})",
        "",
        f"- State: {report['state']}; {report['ranks']} ranks; from {_when(report['started_at'])}"
        f" to {_when(report['ended_at'] or report['generated_at'])}"
        f" ({_hours(report['wall_s'])} of wall time)",
    ]
    goodput = report["goodput"]
    if goodput:
        badput = ", ".join(f"{k} {v:.1%}" for k, v in goodput["badput"].items() if k != "wasted")
        lines.append(f"- Goodput {goodput['goodput']:.1%} (badput: {badput})")
    lines += ["", "## Interruptions by root cause", ""]
    lines += ["| root cause | interruptions | share | GPU-hours lost |", "|---|---:|---:|---:|"]
    for row in report["by_cause"]:
        lines.append(
            f"| {row['cause']} | {row['interruptions']} | {row['share']:.0%} "
            f"| {row['lost_gpu_hours']:.2f} |"
        )
    if not report["by_cause"]:
        lines.append("| none | 0 | — | 0.00 |")
    lines += ["", "## Incidents by root cause", ""]
    lines += [
        "| root cause | incidents | open | GPU-hours lost | incidents |",
        "|---|---:|---:|---:|---|",
    ]
    for row in report["incidents"]:
        ids = ", ".join(f"#{pk}" for pk in row["ids"])
        lines.append(
            f"| {row['root_cause']} | {row['incidents']} | {row['open']} "
            f"| {row['gpu_hours_lost']:.2f} | {ids} |"
        )
    if not report["incidents"]:
        lines.append("| none | 0 | 0 | 0.00 | — |")
    lines += ["", "## Interruptions", ""]
    lines += ["| at | cause | node | since durable checkpoint | GPU-hours lost |"]
    lines += ["|---|---|---|---|---:|"]
    for item in report["interruptions"]:
        cause = item["cause"] or {}
        since = f"step {item['checkpoint']['step']}" if item["checkpoint"] else "the start"
        lines.append(
            f"| {_when(item['at'])} | {cause.get('summary', 'unattributed')} "
            f"| {cause.get('node') or '—'} "
            f"| {since}, {item['lost_s']:.0f} s "
            f"| {item['lost_gpu_hours']:.2f} |"
        )
    cadence = report["checkpoints"]
    lines += [
        "",
        "## Checkpoint cadence",
        "",
        f"- {cadence['durable_saves']} durable saves, every {_seconds(cadence['cadence_s'])};"
        f" a blocking save takes {_seconds(cadence['save_cost_s'])};"
        f" mean time between interruptions {_seconds(cadence['mtbf_s'])}",
        f"- Young/Daly optimum: every {_seconds(cadence['optimal_interval_s'])}"
        f" — {cadence['advice']}",
        "",
        "## Nodes that cost the run most",
        "",
        "| node | interruptions | GPU-hours lost |",
        "|---|---:|---:|",
    ]
    for row in report["nodes"]:
        lines.append(f"| {row['node']} | {row['interruptions']} | {row['lost_gpu_hours']:.2f} |")
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} s"
