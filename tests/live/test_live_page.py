"""The cluster overview in a real browser: a tile per GPU of every node, recoloured live."""

import time

import pytest

from launcher.procs import wait_until
from tests.browser import screenshot
from tests.conftest import make_batch
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
GPUS = 4


def gpu_batch(node: str, util: float, temp: float) -> dict:
    batch = make_batch(node=node, samples=0, node_info={"gpus": GPUS})
    now = time.time()
    batch["samples"] = [
        {"ts": now, "metric": metric, "gpu": gpu, "value": value}
        for gpu in range(GPUS)
        for metric, value in (("gpu.util", util), ("gpu.temp_c", temp))
    ]
    return batch


def test_the_overview_recolours_a_tile_live_without_reload(
    chromium,  # noqa: F811
    live_stack,
    agent,
    agent_token,
):
    from apps.telemetry.models import NodeHealth

    operator("op")
    assert agent.post(gpu_batch("node-a", 50.0, 60.0)).status_code == 202
    assert agent.post(gpu_batch("node-b", 70.0, 61.0)).status_code == 202
    cluster = agent_token[0].cluster.name
    wait_until(
        lambda: NodeHealth.objects.filter(node__cluster__name=cluster).count() == 2 * GPUS,
        30,
        "the worker to store the first batches",
    )
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/{cluster}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    assert page.locator(".node-card").count() == 2
    assert page.locator('.tile[data-state="ok"]').count() == 2 * GPUS
    assert page.locator("#count-healthy").inner_text() == str(2 * GPUS)
    page.evaluate("window.__notReloaded = true")

    posted = time.monotonic()
    assert agent.post(gpu_batch("node-b", 12.5, 91.0)).status_code == 202
    tile = '.node-card[data-node="node-b"] .tile[data-gpu="0"][data-state="critical"]'
    page.wait_for_selector(tile, timeout=2_000)
    assert time.monotonic() - posted < 2.0
    assert page.locator('.node-card[data-node="node-a"] .tile[data-state="ok"]').count() == GPUS
    assert page.locator("#count-healthy").inner_text() == str(GPUS)
    assert page.evaluate("window.__notReloaded") is True

    # a lost connection shows, and the page resyncs from a new snapshot when it is back
    page.evaluate("window.opsboardLive.drop(4000)")
    page.wait_for_selector("#live-status[data-state=reconnecting]", timeout=2_000)
    assert agent.post(gpu_batch("node-a", 40.0, 82.0)).status_code == 202
    wait_until(
        lambda: NodeHealth.objects.filter(
            node__name="node-a", values__contains={"gpu.temp_c": 82.0}
        ).exists(),
        5,
        "the worker to store the batch",
    )
    warm = '.node-card[data-node="node-a"] .tile[data-gpu="3"][data-state="warning"]'
    assert page.locator(warm).count() == 0  # the delta went out while the page was offline
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    page.wait_for_selector(warm, timeout=3_000)
    assert page.evaluate("window.__notReloaded") is True

    page.click('.state-filter button[data-filter="critical"]')
    assert page.locator('.node-card[data-node="node-a"]').is_hidden()
    assert page.locator('.node-card[data-node="node-b"]').is_visible()
    page.click('.state-filter button[data-filter=""]')
    screenshot(page, "dashboard-overview")
    assert browser.errors == []
    browser.close()


def test_the_overview_keeps_128_nodes_of_8_gpus_on_one_screen(chromium, live_stack, live_db):  # noqa: F811
    from datetime import UTC, datetime

    from apps.clusters.models import Cluster
    from apps.ingest.services import ClaimedBatch, batches_store

    operator("op")
    cluster = Cluster.objects.create(name="big")
    now = time.time()
    batches = []
    for index in range(128):
        temp = 90.0 if index == 7 else 82.0 if index % 16 == 3 else 60.0
        body = make_batch(node=f"gpu-node-{index:03d}", samples=0, node_info={"gpus": 8})
        body["samples"] = [
            {"ts": now, "metric": "gpu.temp_c", "gpu": gpu, "value": temp if gpu == 2 else 60.0}
            for gpu in range(8)
        ]
        batches.append(ClaimedBatch.of(cluster.id, datetime.fromtimestamp(now, UTC), body))
    batches_store(batches=batches)

    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/big/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    assert page.locator(".node-card").count() == 128
    assert page.locator(".tile").count() == 1024
    assert page.locator('.tile[data-state="critical"]').count() == 1
    assert page.locator('.tile[data-state="warning"]').count() == 8
    assert page.locator("#count-healthy").inner_text() == "1015"
    grid = page.locator("#node-grid").bounding_box()
    assert grid["height"] < 900, grid  # 1400 px wide: the whole cluster without scrolling far
    tile = page.locator(".tile").first.bounding_box()
    assert tile["width"] >= 10  # still big enough to see and to hover
    screenshot(page, "dashboard-overview-128x8")
    assert browser.errors == []
    browser.close()
