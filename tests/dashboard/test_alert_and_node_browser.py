"""In Chromium: the alert page draws its evidence (the straggler against its peers' median)
and the node page singles out the GPU named in ?gpu= (the picker moves it), without a
console error."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from apps.alerts.models import Alert
from tests.browser import screenshot
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401
from tests.dashboard.test_alert_detail import SLOW_RANK, raise_alerts, training_store

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

EVIDENCE_DRAWN = """() => {
  const div = document.getElementById("chart-evidence");
  return div && div.data && div.data.length === 2
    && div.data.every((t) => t.y.some((v) => v !== null));
}"""
# per GPU trace of the utilisation chart: [gpu, line colour, line width]
UTIL_LINES = """() => document.getElementById("chart-util").data
  .map((t) => [t.meta.gpu, t.line.color, t.line.width])"""
GREY = "#c9ccd1"


def off_the_event_loop(call, *args):
    """Run on another thread: Playwright's event loop runs on this one, and the alerts'
    broadcast on commit (async_to_sync) must not."""

    def run():
        try:
            return call(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def wait_highlighted(page, gpu: int | None) -> list:
    page.wait_for_function(
        """(gpu) => { const d = document.getElementById("chart-util");
          return d && d.data && d.data.every((t) => gpu === null
            ? t.line.color === t.meta.color : (t.meta.gpu === gpu) === (t.line.width === 3)); }""",
        arg=gpu,
        timeout=15_000,
    )
    return page.evaluate(UTIL_LINES)


def test_the_alert_page_draws_the_evidence_and_the_node_page_highlights_a_gpu(
    chromium,  # noqa: F811
    live_stack,
    live_db,
):
    now = time.time()
    cluster = training_store("alpha", now)
    alerts = off_the_event_loop(raise_alerts, cluster, now)
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    try:
        straggler: Alert = alerts["straggler"]
        page.goto(f"{live_stack.url}/alerts/{straggler.id}/")
        page.wait_for_function(EVIDENCE_DRAWN, timeout=15_000)
        names = page.evaluate(
            "() => document.getElementById('chart-evidence').data.map((t) => t.name)"
        )
        assert names == [f"rank {SLOW_RANK}", "median of its peers"]
        assert page.inner_text("#alert-duration") == "firing for 20 min"
        screenshot(page, "alert-straggler")

        page.goto(f"{live_stack.url}/alerts/{alerts['sdc'].id}/")
        # the live stack's detectors may have refreshed the evidence with more checks
        suspect_rows = page.locator("#evidence-checksums tr[data-rank='2']").count()
        assert suspect_rows >= 3
        assert page.locator("#evidence-checksums td.differs").count() == suspect_rows
        screenshot(page, "alert-sdc")

        page.goto(f"{live_stack.url}/clusters/{cluster.name}/nodes/node-01/?gpu=1")
        lines = wait_highlighted(page, 1)
        assert [(gpu, color == GREY) for gpu, color, _ in lines] == [
            (0, True), (1, False), (2, True), (3, True)
        ]  # fmt: skip
        screenshot(page, "node-gpu-highlight")
        page.click("#gpu-picker button[data-gpu='3']")
        assert [width for _, _, width in wait_highlighted(page, 3)] == [1, 1, 1, 3]
        assert page.evaluate("() => new URLSearchParams(location.search).get('gpu')") == "3"
        page.click("#gpu-picker button[data-gpu='']")
        assert all(color != GREY for _, color, _ in wait_highlighted(page, None))
        assert browser.errors == []
    finally:
        browser.close()
