"""The run, node and alerts pages in a real browser, fed by the cluster simulator (the real
agent code) through the live stack: every chart is drawn with data, a straggler shows in the
heat-map and as an alert, and an acknowledgement reaches another open browser."""

import itertools
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from django.db import connections

from apps.alerts.services import alerts_evaluate
from tests.browser import screenshot
from tests.conftest import AgentClient
from tests.dashboard.conftest import BrowserPage, operator
from tests.sim.test_live import Sim

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

RUN_CHARTS = ("throughput", "step_time", "stages", "loss", "checksums", "checkpoints", "goodput")
NODE_CHARTS = ("util", "memory", "temperature", "power", "throttle")
STRAGGLER = 5

DRAWN = """(ids) => ids.every((id) => {
  const div = document.getElementById(id);
  const some = (v) => (Array.isArray(v) ? v.some((x) => x !== null) : v !== null);
  return div && div.data && div.data.some((trace) => (trace.z || trace.y || []).some(some));
})"""


def evaluate_now(cluster, now: float) -> None:
    """Run the detectors as the beat task would, off this thread: Playwright's event loop
    runs here, and the alert broadcast (async_to_sync) must not."""

    def evaluate() -> None:
        try:
            alerts_evaluate(cluster=cluster, now=now)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(evaluate).result()


def wait_drawn(page, charts) -> None:
    page.wait_for_function(DRAWN, arg=[f"chart-{name}" for name in charts], timeout=15_000)


def heatmap_rows(page) -> dict[int, float]:
    trace = page.evaluate(
        "() => { const t = document.getElementById('chart-step_time').data[0];"
        " return {ranks: t.meta.ranks, y: Array.from(t.y), z: t.z.map((row) => Array.from(row))}; }"
    )
    # the simulator sends each rank's GPU: every row is labelled with its node and GPU
    assert all(re.fullmatch(r"r\d+ · \S+ · gpu\d+", label) for label in trace["y"]), trace["y"]
    return {
        rank: statistics.mean(v for v in row if v is not None)
        for rank, row in zip(trace["ranks"], trace["z"], strict=True)
    }


def test_the_run_page_shows_a_straggler_and_an_acknowledgement_reaches_other_browsers(
    chromium, live_stack, agent_token, live_db, tmp_path
):
    operator("op")
    cluster = agent_token[0].cluster
    sim = Sim(
        live_stack, agent_token, tmp_path, "--nodes", "2", "--gpus", "4", "--duration", "120",
        "--speed", "10", "--fault", f"straggler:rank={STRAGGLER},at=0,factor=1.5",
        "--fault", "sdc:rank=2,mode=param,at=30",
    )  # fmt: skip
    run = sim.scenario["layout"]["runs"][0]["run"]
    evaluate_now(cluster, sim.finished_at)
    run_url = f"{live_stack.url}/clusters/{cluster.name}/runs/{run}/"

    watcher = BrowserPage(chromium, live_stack.url, "op")
    watcher.page.goto(run_url)
    watcher.page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    wait_drawn(watcher.page, RUN_CHARTS)
    rows = heatmap_rows(watcher.page)
    assert sorted(rows) == list(range(8))
    others = statistics.median(v for rank, v in rows.items() if rank != STRAGGLER)
    assert rows[STRAGGLER] > 1.3 * others, rows
    param_differs = watcher.page.evaluate(
        "() => document.getElementById('chart-checksums').data"
        ".find((t) => t.name === 'parameter checksum differs').y.reduce((a, b) => a + b, 0)"
    )
    assert param_differs > 0
    straggler_row = watcher.page.locator("tr[data-alert-id]", has_text="straggler")
    assert straggler_row.count() == 1
    alert_id = straggler_row.get_attribute("data-alert-id")
    assert straggler_row.get_attribute("data-state") == "firing"
    assert f"rank {STRAGGLER}" in straggler_row.inner_text()
    screenshot(watcher.page, "dashboard-run")

    # new steps of the run extend its charts without reload: steps in the bucket after the
    # chart's last (x values are bucket starts, Unix ms in the page's default UTC zone). A
    # fixed "now + 15 s" could fall in the simulator's last bucket, and never extend it.
    xs = watcher.page.evaluate("() => Array.from(document.getElementById('chart-loss').data[0].x)")
    last_x, width = max(xs), min(b - a for a, b in itertools.pairwise(sorted(xs)))
    agent = AgentClient(live_stack.url, agent_token[1])
    node = sim.scenario["layout"]["nodes"][0]
    later = (last_x + width) / 1000 + 1
    assert later < time.time() + 300  # the contract accepts ts up to 5 minutes ahead
    steps = [
        {"ts": later, "rank": rank, "step": 5000, "step_time": 1.0, "tokens": 32768, "loss": 1.5}
        for rank in range(4)
    ]
    batch = {"batch_id": "later-steps", "node": node, "run": run, "steps": steps}
    assert agent.post(batch).status_code == 202
    watcher.page.wait_for_function(
        f"() => Math.max(...document.getElementById('chart-loss').data[0].x) > {last_x}",
        timeout=10_000,
    )
    agent.http.close()

    # the page's range picker refetches the charts and their export links follow
    panel = watcher.page.locator('.chart-panel[data-chart="loss"]')
    watcher.page.locator('#time-range button[data-range="15m"]').click()
    watcher.page.wait_for_function(
        "() => document.querySelector('[data-chart=loss]').dataset.loading === 'false'"
    )
    assert (
        panel.locator("a.export[data-format=csv]")
        .get_attribute("href")
        .endswith("charts/loss.csv?range=15m")
    )
    wait_drawn(watcher.page, ["loss"])

    actor = BrowserPage(chromium, live_stack.url, "op")
    actor.page.goto(f"{live_stack.url}/alerts/?cluster={cluster.name}&kind=straggler")
    row = actor.page.locator(f'tr[data-alert-id="{alert_id}"]')
    row.locator("input[name=note]").fill("looking at rank 5")
    row.locator("button[type=submit]").click()
    actor.page.wait_for_selector(f'tr[data-alert-id="{alert_id}"][data-state="acknowledged"]')
    assert "looking at rank 5" in actor.page.locator(f'tr[data-alert-id="{alert_id}"]').inner_text()
    screenshot(actor.page, "dashboard-alerts")
    watcher.page.wait_for_selector(
        f'tr[data-alert-id="{alert_id}"][data-state="acknowledged"]', timeout=5_000
    )

    actor.page.goto(f"{live_stack.url}/clusters/{cluster.name}/nodes/{node}/")
    wait_drawn(actor.page, NODE_CHARTS)
    traces = actor.page.evaluate("() => document.getElementById('chart-util').data.length")
    assert traces == 4
    assert actor.page.locator(".node-tiles .tile").count() == 4
    screenshot(actor.page, "dashboard-node")
    assert watcher.errors == [] and actor.errors == []
    hosts = {urlsplit(url).hostname for url in watcher.requests + actor.requests}
    assert hosts == {"127.0.0.1"}  # Plotly and everything else from our own server
    assert any(url.endswith("/vendor/plotly.min.js") for url in watcher.requests)
    watcher.close()
    actor.close()
