"""In Chromium, the overview of a fleet of 4,096 nodes × 8 GPUs (tests/dashboard/fleet.py):
128 blocks, the hot one's edge coloured as critical and the cordoned one's as cordoned; the
finder narrows them by a node's name and by state; the page's own refresh brings a GPU that
ran hot since it was drawn; the hot block opens on its 32 nodes' cards, the hot GPU's tile
critical."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from apps.telemetry.models import NodeHealth
from tests.browser import screenshot
from tests.dashboard.conftest import BrowserPage, operator
from tests.dashboard.fleet import HOT_BLOCK, HOT_GPU, HOT_NODE, fleet, node_name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

BLOCKS = """() => Object.fromEntries([...document.querySelectorAll('#block-grid .block')]
  .map((b) => [b.dataset.block, b.dataset.state]))"""
SHOWN = """() => [...document.querySelectorAll('#block-grid .block')].filter((b) => !b.hidden)
  .map((b) => b.dataset.block)"""
CARDS = "() => [...document.querySelectorAll('.node-card')].map((c) => c.dataset.node)"
COLOURS = """(keys) => keys.map((key) => getComputedStyle(
  [...document.querySelectorAll('#block-grid .block')].find((b) => b.dataset.block === key)
).borderLeftColor)"""
LATER_HOT = node_name(100)  # rack r03


def in_thread(call):
    """`call()` on a connection of its own, committed for the live stack to read."""

    def run():
        try:
            return call()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def runs_hot() -> int:
    health = NodeHealth.objects.filter(node__cluster__name="fleet", node__name=LATER_HOT, gpu=0)
    return health.update(values={"gpu.util": 95.0, "gpu.temp_c": 90.0})


def test_a_fleet_of_4096_nodes_finds_refreshes_and_opens_its_hot_block(
    chromium, live_stack, live_db
):
    operator("op")
    in_thread(lambda: fleet("fleet"))
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    began = time.perf_counter()
    page.goto(f"{live_stack.url}/clusters/fleet/")
    page.wait_for_selector("#block-grid .block")
    drawn_s = time.perf_counter() - began
    blocks = page.evaluate(BLOCKS)
    assert len(blocks) == 128, len(blocks)
    assert blocks[HOT_BLOCK] == "critical" and blocks["rack r01"] == "cordoned"
    assert blocks["rack r03"] == "ok"
    critical, ok, cordoned = page.evaluate(COLOURS, [HOT_BLOCK, "rack r00", "rack r01"])
    assert len({critical, ok, cordoned}) == 3, (critical, ok, cordoned)
    print(f"4,096 nodes: blocks drawn {drawn_s * 1e3:.0f} ms after navigating")

    page.fill("#block-search", HOT_NODE)
    assert page.evaluate(SHOWN) == [HOT_BLOCK]
    assert page.text_content("#block-shown") == "1 of 128 blocks"
    page.fill("#block-search", "")
    page.click('.state-filter button[data-filter="critical"]')
    assert page.evaluate(SHOWN) == [HOT_BLOCK]
    page.click('.state-filter button[data-filter="cordoned"]')
    assert page.evaluate(SHOWN) == ["rack r01"]
    page.click('.state-filter button[data-filter=""]')
    assert len(page.evaluate(SHOWN)) == 128
    screenshot(page, "dashboard-fleet-blocks")

    assert in_thread(runs_hot) == 1
    page.wait_for_function(  # the page fetches itself again every 10 s
        "() => [...document.querySelectorAll('#block-grid .block')]"
        ".find((b) => b.dataset.block === 'rack r03').dataset.state === 'critical'",
        timeout=30_000,
    )
    page.click('.state-filter button[data-filter="critical"]')  # the filter holds on refresh
    assert sorted(page.evaluate(SHOWN)) == sorted([HOT_BLOCK, "rack r03"])
    page.click('.state-filter button[data-filter=""]')

    page.click('.block[href*="node-2976"]')
    page.wait_for_selector(".node-card")
    cards = page.evaluate(CARDS)
    assert cards == [node_name(i) for i in range(2976, 3008)]
    tile = f'.node-card[data-node="{HOT_NODE}"] .tile[data-gpu="{HOT_GPU}"]'
    assert page.get_attribute(tile, "data-state") == "critical"
    assert browser.errors == []
    browser.close()
