"""In Chromium: the overview colours the straggler's GPU alone and counts the rest healthy,
the heat-map's hover names node and GPU and a click on its row opens the rank's page, and the
overview's finder (name, run, state; an empty state; one tab stop with arrow keys)."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from tests.browser import screenshot
from tests.dashboard.conftest import RUN, BrowserPage, operator
from tests.dashboard.culprit import GPUS, NODES, SLOW_RANK, slow_rank_cluster

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

# Where the straggler's row is, in page pixels (Plotly's category axis: row index → pixel).
ROW_POINT = """(rank) => {
  const gd = document.getElementById('chart-step_time'), layout = gd._fullLayout;
  const row = gd.data[0].meta.ranks.indexOf(rank), box = gd.getBoundingClientRect();
  return {x: box.left + layout.xaxis._offset + layout.xaxis._length / 2,
          y: box.top + layout.yaxis._offset + layout.yaxis.l2p(row)};
}"""


def stored(name: str, **kwargs):
    """slow_rank_cluster off this thread: Playwright's event loop runs here, and the alert
    broadcast (async_to_sync) must not."""

    def store():
        try:
            return slow_rank_cluster(name, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(store).result()


def tile_states(page) -> dict[str, str]:
    return page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll('#node-grid .tile')].map("
        "(t) => [t.closest('.node-card').dataset.node + '/' + t.dataset.gpu, t.dataset.state]))"
    )


def test_the_straggler_colours_its_gpu_alone_and_its_row_opens_the_rank(
    chromium, live_stack, live_db
):
    operator("op")
    cluster = stored("culprit")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/{cluster.name}/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    states = tile_states(page)
    assert len(states) == NODES * GPUS
    assert {key for key, state in states.items() if state != "ok"} == {f"node-00/{SLOW_RANK}"}
    assert page.inner_text("#count-healthy") == str(NODES * GPUS - 1)
    screenshot(page, "dashboard-overview-culprit")

    page.goto(f"{live_stack.url}/clusters/{cluster.name}/runs/{RUN}/")
    page.wait_for_function("() => document.getElementById('chart-step_time').data")
    point = page.evaluate(ROW_POINT, SLOW_RANK)
    page.mouse.move(point["x"], point["y"])
    hover = page.wait_for_selector(".hoverlayer .hovertext", timeout=5_000).text_content()
    assert f"r{SLOW_RANK} · node-00 · gpu{SLOW_RANK}" in hover and " s per step" in hover
    page.mouse.click(point["x"], point["y"])
    page.wait_for_url(re.compile(rf".*/runs/{RUN}/ranks/{SLOW_RANK}/$"), timeout=10_000)
    page.wait_for_function("() => (document.getElementById('chart-compute_time') || {}).data")
    assert "GPU 5" in page.inner_text("#rank-place")
    screenshot(page, "dashboard-rank")
    assert browser.errors == []
    browser.close()


def test_an_alert_on_a_rank_of_unknown_gpu_colours_no_tile(chromium, live_stack, live_db):
    operator("op")
    cluster = stored("unplaced", with_gpu=False)
    browser = BrowserPage(chromium, live_stack.url, "op")
    browser.page.goto(f"{live_stack.url}/clusters/{cluster.name}/")
    browser.page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    assert set(tile_states(browser.page).values()) == {"ok"}
    assert browser.page.inner_text("#count-healthy") == str(NODES * GPUS)
    browser.close()


def test_the_overview_finds_nodes_by_name_run_and_state_and_is_one_tab_stop(
    chromium, live_stack, live_db
):
    operator("op")
    cluster = stored("finder")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/{cluster.name}/")
    shown = "() => [...document.querySelectorAll('#node-grid .node-card')].filter((c) => !c.hidden).map((c) => c.dataset.node)"  # noqa: E501
    assert page.locator(".node-card .node-runs").first.inner_text() == RUN

    page.fill("#node-search", "node-01")
    assert page.evaluate(shown) == ["node-01"]
    page.fill("#node-search", RUN)  # a run's name finds the nodes it runs on
    assert page.evaluate(shown) == ["node-00", "node-01"]
    page.fill("#node-search", "")
    page.click('.state-filter button[data-filter="warning"]')
    assert page.evaluate(shown) == ["node-00"]  # the straggler's node
    page.click('.state-filter button[data-filter="critical"]')
    assert page.evaluate(shown) == []
    assert page.locator("#node-grid-empty").is_visible()
    assert page.inner_text("#node-grid-empty") == "No nodes match 'critical'."
    screenshot(page, "dashboard-overview-no-match")
    page.click('.state-filter button[data-filter=""]')
    assert page.locator("#node-grid-empty").is_hidden()

    # Tab: the search box, the state chips, then one stop in the grid; arrows move in it
    tabbable = page.evaluate(
        "() => [...document.querySelectorAll('#node-grid a')].filter((a) => a.tabIndex >= 0).length"
    )
    assert tabbable == 1
    page.focus("#node-search")
    for _ in range(len(page.locator(".state-filter button").all())):
        page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    focused = "() => document.activeElement.closest('.node-card')?.dataset.node"
    assert page.evaluate(focused) == "node-00"
    page.keyboard.press("ArrowRight")
    assert page.evaluate(focused) == "node-01"
    page.keyboard.press("Home")
    assert page.evaluate(focused) == "node-00"
    page.keyboard.press("End")
    assert page.evaluate(focused) == "node-01"
    page.keyboard.press("Tab")  # leaves the grid: no tile takes the focus
    assert page.evaluate(focused) is None
    assert browser.errors == []
    browser.close()
