"""A resume books the work it lost as recovery, on every surface: step reports posted
through the ingest path (steps 1..300, then 1..90 again), and the API's run summary, the run
page's goodput figure, its chart endpoint and its CSV export give the same recovery seconds,
whether the restart was inferred from the step counter or sent by supervise."""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime

import pytest
from django.test import Client

from apps.runs.models import Run
from tests.dashboard.conftest import operator
from tests.dashboard.test_pages import json_script
from tests.runs.test_restart import steps, stored

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def recovery_everywhere(agent, cluster: str, run: str) -> dict[str, float]:
    """The recovery seconds as the API, the page, the chart endpoint and the export say."""
    page_client = Client()
    page_client.force_login(operator(f"op-{run}"))
    base = f"/clusters/{cluster}/runs/{run}/"
    page = page_client.get(base).content.decode()
    chart = page_client.get(f"{base}charts/goodput.json").json()["figure"]
    exported = csv.reader(io.StringIO(page_client.get(f"{base}charts/goodput.csv").text))
    bars = dict(zip(chart["data"][0]["x"], chart["data"][0]["y"], strict=True))
    return {
        "api": agent.get(f"/api/v1/runs/{run}").json()["goodput"]["badput_s"]["recovery"],
        "page": json_script(page, "figure-goodput")["layout"]["meta"]["goodput"]["badput_s"][
            "recovery"
        ],
        "chart": bars["recovery"],
        "export": {row[1]: float(row[2]) for row in list(exported)[1:]}["recovery"],
    }


def started_at_first_step(run: Run, first_start: float) -> None:
    """The run began with its first step (the server first saw it when the test posted the
    backdated reports, after them all)."""
    Run.objects.filter(pk=run.pk).update(created_at=datetime.fromtimestamp(first_start, UTC))


@pytest.mark.parametrize(
    ("event", "recovery"),
    [
        # inferred: the 300 lost steps (300 s) and the old timeline's end → the new one's
        # first step (310 s)
        (False, 300.0 + 310.0),
        # supervise's restart event 110 s before the new first step: the lost steps, and
        # the restart → the new first step; the crash → the restart is a stall, not recovery
        (True, 300.0 + 110.0),
    ],
)
def test_the_lost_steps_are_recovery_on_every_surface(agent, agent_token, event, recovery):
    cluster = agent_token[0].cluster
    name = f"rg-{int(event)}"
    # one step a second, all within the goodput's window (ALERT_EVENT_WINDOW_S, 900 s)
    now = time.time()
    stored(agent, steps(name, range(1, 301), end=now - 400, step_s=1.0))
    again = steps(name, range(1, 91), end=now, step_s=1.0)
    if event:
        again["events"] = [{"ts": now - 200, "kind": "restart", "rank": 0, "restart_count": 1}]
    stored(agent, again)
    run = Run.objects.get(cluster=cluster, name=name)
    assert (run.last_step, run.restarts) == (90, 1)
    started_at_first_step(run, now - 400 - 300 * 1.0)

    found = recovery_everywhere(agent, cluster.name, name)
    assert found == {key: pytest.approx(recovery, abs=0.5) for key in found}
    goodput = agent.get(f"/api/v1/runs/{name}").json()["goodput"]
    assert goodput["productive_s"] == pytest.approx(90.0, abs=0.5)  # the new steps only
    assert goodput["badput_s"]["hang"] == pytest.approx(200.0 if event else 0.0, abs=0.5)
    assert goodput["badput_s"]["wasted"] == 0.0  # the contract's old bucket: kept, always 0
