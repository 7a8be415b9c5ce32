"""In Chromium: the incidents list follows the live feed and leads to the incident; the
fleet's ledger and the run's reliability report show what the API says of the same
incident (its GPU-hours), without a console error."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest

from apps.alerts.models import Incident
from apps.alerts.services import alerts_sync
from apps.clusters.models import Cluster
from tests.alerts.test_incidents import straggler, thermal
from tests.browser import screenshot
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401
from tests.dashboard.test_alert_and_node_browser import off_the_event_loop
from tests.dashboard.test_incident_browser import fold_a_hot_gpu

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def hot_gpu_for_twenty_minutes(name: str) -> Cluster:
    """3 GPU-h/h for 20 minutes: 1 GPU-hour lost."""
    return fold_a_hot_gpu(name, lasted_s=1200, rate=3.0)


def test_the_list_follows_the_live_feed_and_leads_to_the_incident(
    chromium,  # noqa: F811
    live_stack,
    live_db,
):
    cluster = off_the_event_loop(hot_gpu_for_twenty_minutes, f"incl-{uuid.uuid4().hex[:6]}")
    incident = Incident.objects.get(cluster=cluster)
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    try:
        page.goto(f"{live_stack.url}/incidents/?cluster={cluster.name}")
        row = page.locator(f"tr[data-incident-id='{incident.pk}']")
        assert "thermal on node-02, GPU 3" in row.locator(".root").inner_text()
        assert row.locator("[data-col=alerts]").inner_text() == "2"
        page.wait_for_selector("#live-status[data-state='live']")
        assert page.locator("#incidents-changed").is_hidden()
        # the straggler turns critical: its incident changed, and the page says so
        escalated = replace(straggler(rate=3.0), severity="critical")
        off_the_event_loop(
            lambda: alerts_sync(cluster=cluster, findings=[thermal(), escalated], now=time.time())
        )
        page.wait_for_selector("#incidents-changed:not([hidden])")
        assert row.get_attribute("data-changed") == "true"
        screenshot(page, "incidents")
        page.click(f"tr[data-incident-id='{incident.pk}'] a")
        page.wait_for_url(f"**/incidents/{incident.pk}/")
        assert "Root cause: thermal" in page.inner_text("#incident-root")
        assert browser.errors == []
    finally:
        browser.close()


def test_the_ledger_and_the_report_show_the_apis_gpu_hours(
    chromium,  # noqa: F811
    live_stack,
    live_db,
):
    cluster = off_the_event_loop(hot_gpu_for_twenty_minutes, f"incr-{uuid.uuid4().hex[:6]}")
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    scope = f"cluster={cluster.name}"
    try:
        api = page.request.get(f"{live_stack.url}/api/v1/incidents?run=run-1&{scope}").json()
        (incident,) = api["incidents"]
        lost = incident["gpu_hours_lost"]
        assert lost == pytest.approx(1.0, abs=0.01)  # 3 GPU-h/h for 20 minutes

        page.goto(f"{live_stack.url}/fleet/?cluster={cluster.name}")
        ledger = page.request.get(f"{live_stack.url}/api/v1/ledger?days=7&{scope}").json()
        (node,) = ledger["nodes"]
        assert node["gpu_hours_lost"] == pytest.approx(lost, abs=1e-3)
        shown = page.inner_text("tr[data-node='node-02'] [data-col=gpu-hours]")
        assert float(shown) == node["gpu_hours_lost"]
        screenshot(page, "fleet")

        page.goto(f"{live_stack.url}/clusters/{cluster.name}/runs/run-1/report/")
        report = page.request.get(f"{live_stack.url}/api/v1/runs/run-1/report?{scope}").json()
        (heat,) = report["incidents"]
        assert heat["ids"] == [incident["id"]] and heat["gpu_hours_lost"] == lost
        row = page.locator("table.report-incidents tr[data-root='thermal']")
        assert float(row.locator("[data-col=lost]").inner_text()) == lost
        page.click(f"table.report-incidents a[href='/incidents/{incident['id']}/']")
        page.wait_for_url(f"**/incidents/{incident['id']}/")
        shown = page.get_attribute("#incident-gpu-hours", "data-value")
        assert float(shown) == lost
        screenshot(page, "run-report")
        assert browser.errors == []
    finally:
        browser.close()
