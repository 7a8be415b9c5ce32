"""In Chromium: from a straggler's alert page to its incident (rooted at the hot GPU), and
acknowledging the incident there acknowledges both alerts, without a console error."""

from __future__ import annotations

import time
import uuid

import pytest

from apps.alerts.models import Alert, ClusterDetectorConfig, Incident
from apps.alerts.services import alerts_sync
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from tests.alerts.test_incidents import straggler, thermal
from tests.browser import screenshot
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401
from tests.dashboard.test_alert_and_node_browser import off_the_event_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]


def fold_a_hot_gpu(name: str, *, lasted_s: float = 0.0, rate: float = 2.0) -> Cluster:
    """Node-02's GPU 3 runs hot and its rank (3 of run-1) straggles, costing `rate` GPU-h/h,
    seen `lasted_s` ago and again now: one incident."""
    cluster = Cluster.objects.create(name=name)
    # the live stack's beat would resolve these hand-made alerts (no data behind them)
    ClusterDetectorConfig.objects.create(cluster=cluster, paused=True)
    Node.objects.create(cluster=cluster, name="node-02")
    Run.objects.create(cluster=cluster, name="run-1", world_size=8)
    now = time.time()
    for at in sorted({now - lasted_s, now}):
        alerts_sync(cluster=cluster, findings=[thermal(), straggler(rate=rate)], now=at)
    return cluster


def test_the_alert_page_leads_to_its_incident_which_acknowledges_both(
    chromium,  # noqa: F811
    live_stack,
    live_db,
):
    cluster = off_the_event_loop(fold_a_hot_gpu, f"inc-{uuid.uuid4().hex[:6]}")
    incident = Incident.objects.get(cluster=cluster)
    slow = Alert.objects.get(cluster=cluster, kind="straggler")
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    try:
        page.goto(f"{live_stack.url}/alerts/{slow.pk}/")
        page.click("#alert-incident")
        page.wait_for_url(f"**/incidents/{incident.pk}/")
        assert "Root cause: thermal on node-02, GPU 3" in page.inner_text("#incident-root")
        kinds = page.eval_on_selector_all(
            "#incident-symptoms tr[data-kind]", "rows => rows.map(r => r.dataset.kind).sort()"
        )
        assert kinds == ["straggler", "thermal"]
        assert page.locator("#incident-actions form[data-kind='cordon']").count() == 1
        screenshot(page, "incident")
        page.fill("#incident-ack input[name=note]", "fans replaced")
        page.click("#incident-ack button[type=submit]")
        page.wait_for_selector("#incident-timeline li[data-event='incident acknowledged']")
        assert "acknowledged" in page.inner_text("#incident-state")
        assert browser.errors == []
    finally:
        browser.close()
    states = set(Alert.objects.filter(incident=incident).values_list("state", flat=True))
    assert states == {"acknowledged"}
