"""In Chromium, a frontier run of 16,384 ranks (tests/dashboard/frontier.py): the heat-map
draws groups of nodes, the straggler's group is the hot row and the straggler has a row of
its own; a click on the group draws its ranks, where the straggler's row names it, and a
button goes back to the whole run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from tests.browser import screenshot
from tests.dashboard.conftest import BrowserPage, operator
from tests.dashboard.frontier import RUN, SLOW_RANK, frontier_run, node_name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# A row's point in the viewport (Plotly's category axis: row index → pixel), scrolled to
# its middle first: the grouped heat-map is taller than the window.
ROW_POINT = """(row) => {
  const gd = document.getElementById('chart-step_time'), layout = gd._fullLayout;
  const inside = layout.yaxis._offset + layout.yaxis.l2p(row);
  window.scrollTo(0, gd.getBoundingClientRect().top + window.scrollY + inside
                     - window.innerHeight / 2);
  const box = gd.getBoundingClientRect();
  return {x: box.left + layout.xaxis._offset + layout.xaxis._length / 2,
          y: box.top + inside};
}"""
META = "() => document.getElementById('chart-step_time').data[0].meta"


def stored(name: str):
    def store():
        try:
            return frontier_run(name)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(store).result()


def test_the_stragglers_group_is_hot_and_opens_on_its_ranks(chromium, live_stack, live_db):
    operator("op")
    run = stored("frontier")
    slow_node = node_name(SLOW_RANK // 8)
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/{run.cluster.name}/runs/{RUN}/")
    page.wait_for_function(
        "() => (document.getElementById('chart-step_time').data || [{}])[0].meta", timeout=60_000
    )
    meta = page.evaluate(META)
    assert meta["ranks"][0] == SLOW_RANK
    hot = next(i for i, g in enumerate(meta["groups"]) if g and g[0] <= slow_node <= g[1])
    point = page.evaluate(ROW_POINT, hot)
    page.mouse.move(point["x"], point["y"])
    hover = page.wait_for_selector(".hoverlayer .hovertext", timeout=5_000).text_content()
    assert f"worst rank r{SLOW_RANK} · {slow_node} · gpu5" in hover, hover
    screenshot(page, "dashboard-heatmap-frontier")

    page.mouse.click(point["x"], point["y"])
    page.wait_for_function(
        "() => document.getElementById('chart-step_time').data[0].meta.group", timeout=60_000
    )
    drilled = page.evaluate(META)
    assert len(drilled["ranks"]) == 128 and SLOW_RANK in drilled["ranks"]
    point = page.evaluate(ROW_POINT, drilled["ranks"].index(SLOW_RANK))
    page.mouse.move(point["x"], point["y"])
    hover = page.wait_for_selector(".hoverlayer .hovertext", timeout=5_000).text_content()
    assert f"r{SLOW_RANK} · {slow_node} · gpu5" in hover and "worst rank" not in hover
    screenshot(page, "dashboard-heatmap-frontier-group")

    page.click(".heatmap-back")
    page.wait_for_function(
        "() => !document.getElementById('chart-step_time').data[0].meta.group", timeout=60_000
    )
    assert page.is_hidden(".heatmap-back")
    assert browser.errors == []
    browser.close()
