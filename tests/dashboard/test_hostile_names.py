"""Names and claims stored before ingest refused them still give working, fast pages: links
built from a name reach its page whatever characters it holds, and a node claiming millions
of GPUs draws at most MAX_GPUS tiles."""

from __future__ import annotations

import html
import re
import time
from datetime import UTC, datetime
from urllib.parse import quote

import pytest

from apps.clusters.models import Cluster, Node
from apps.core.bounds import MAX_GPUS
from apps.runs.models import Run
from apps.telemetry.models import NodeHealth
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401
from tests.dashboard.test_pages import json_script

pytestmark = pytest.mark.django_db

ODD_NODES = ("a?b", "c#d", "e%f", "g%3Fh", "i&j=k")
ODD_RUNS = ("x#y", "r?s", "p%25q")


@pytest.fixture
def odd(db) -> Cluster:
    cluster = Cluster.objects.create(name="odd")
    now = datetime.now(UTC)
    for name in ODD_NODES:
        node = Node.objects.create(cluster=cluster, name=name, info={"gpus": 2}, last_seen=now)
        NodeHealth.objects.create(node=node, gpu=0, ts=now, values={"gpu.util": 50.0})
    for name in ODD_RUNS:
        Run.objects.create(cluster=cluster, name=name)
    return cluster


def hrefs(page: str, css_class: str) -> list[str]:
    found = re.findall(rf'class="{css_class}"[^>]* href="([^"]+)"', page)
    return [html.unescape(href) for href in found]


def test_links_to_odd_node_and_run_names_reach_their_pages(odd, client_in):
    overview = client_in.get("/clusters/odd/").content.decode()
    node_links = hrefs(overview, "node-name")
    assert len(node_links) == len(ODD_NODES)
    for link in node_links:
        page = client_in.get(link)
        assert page.status_code == 200, link
        name = re.search(r"<h1>Node (.*?) <small", page.content.decode()).group(1)
        assert html.unescape(name) in ODD_NODES
    run_links = re.findall(r'<a href="(/clusters/odd/runs/[^"]+)">', overview)
    assert len(run_links) == len(ODD_RUNS)
    for link in run_links:
        assert client_in.get(html.unescape(link)).status_code == 200, link


@pytest.mark.parametrize(
    ("page_of", "name"),
    [("nodes", name) for name in ODD_NODES] + [("runs", name) for name in ODD_RUNS],
)
def test_the_chart_and_export_links_of_an_odd_name_answer(odd, client_in, page_of, name):
    page = client_in.get(f"/clusters/odd/{page_of}/{quote(name, safe='')}/")
    assert page.status_code == 200
    text = page.content.decode()
    urls = [html.unescape(u) for u in re.findall(r'data-url="([^"]+)"', text)]
    exports = hrefs(text, "export")
    assert urls and len(exports) == 2 * len(urls)
    for url in urls[:2]:  # what charts.js fetches
        response = client_in.get(f"{url}.json?range=15m")
        assert response.status_code == 200, url
        assert response.json()["chart"] in url
    for export in exports[:2]:
        assert client_in.get(export).status_code == 200, export


def test_the_live_tiles_build_node_links_from_the_reversed_url(odd, client_in):
    data = json_script(client_in.get("/clusters/odd/").content.decode(), "page-data")
    assert data["max_gpus"] == MAX_GPUS
    head, _, tail = data["node_url"].rpartition(data["node_placeholder"])
    for name in ODD_NODES:
        # what overview.js does with encodeURIComponent
        assert client_in.get(head + quote(name, safe="") + tail).status_code == 200, name


@pytest.fixture
def boastful(db) -> Cluster:
    """A node claiming three million GPUs, and one that reported GPU 32767."""
    cluster = Cluster.objects.create(name="big")
    now = datetime.now(UTC)
    Node.objects.create(cluster=cluster, name="claims", info={"gpus": 3_000_000}, last_seen=now)
    far = Node.objects.create(cluster=cluster, name="far", info={"gpus": 8}, last_seen=now)
    NodeHealth.objects.create(node=far, gpu=32767, ts=now, values={"gpu.util": 1.0})
    Node.objects.create(cluster=cluster, name="odd-info", info={"gpus": "8"}, last_seen=now)
    return cluster


def tile_count(page: str) -> int:
    return len(re.findall(r'class="tile"', page))


def test_the_overview_draws_at_most_max_gpus_tiles_per_node_and_says_so(boastful, client_in):
    started = time.monotonic()
    response = client_in.get("/clusters/big/")
    assert time.monotonic() - started < 5
    assert response.status_code == 200
    page = response.content.decode()
    cards = page.split('<div class="node-card"')[1:]
    assert [tile_count(card) for card in cards] == [MAX_GPUS, MAX_GPUS, 0]
    assert f"{3_000_000 - MAX_GPUS} more GPUs claimed" in page
    assert f"{32768 - MAX_GPUS} more GPUs claimed" in page
    assert re.search(rf'id="count-gpus">{2 * MAX_GPUS}<', page)


def test_the_node_page_of_a_boastful_node_is_fast_and_capped(boastful, client_in):
    started = time.monotonic()
    response = client_in.get("/clusters/big/nodes/claims/")
    assert time.monotonic() - started < 5
    page = response.content.decode()
    assert response.status_code == 200 and tile_count(page) == MAX_GPUS
    assert f"{3_000_000 - MAX_GPUS} more GPUs claimed" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_live_overview_caps_tiles_and_links_odd_names_in_a_browser(
    chromium,  # noqa: F811
    live_stack,
    live_db,
):
    """overview.js draws the tiles of live node states itself: it caps them as the server
    does, and builds a new node card's link from the reversed URL."""
    cluster = Cluster.objects.create(name="live-odd")
    now = datetime.now(UTC)
    Node.objects.create(cluster=cluster, name="a?b#c", info={"gpus": 2}, last_seen=now)
    Node.objects.create(cluster=cluster, name="claims", info={"gpus": 3_000_000}, last_seen=now)
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/live-odd/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    assert page.locator('.node-card[data-node="claims"] .tile').count() == MAX_GPUS
    # a node the page has no card for yet, as a live delta brings it
    page.evaluate(
        """() => {
        const node = JSON.parse(document.getElementById("page-data").textContent).nodes
          .find((n) => n.node === "a?b#c");
        document.querySelector('.node-card[data-node="a?b#c"]').remove();
        document.dispatchEvent(new CustomEvent("opsboard:delta",
          { detail: { cluster: "live-odd", nodes: [{ ...node, gpus: 5000000 }] } }));
    }"""
    )
    card = page.locator('.node-card[data-node="a?b#c"]')
    assert card.locator(".tile").count() == MAX_GPUS
    href = card.locator("a.node-name").get_attribute("href")
    response = page.goto(f"{live_stack.url}{href}")
    assert response.status == 200 and page.locator("h1").inner_text().startswith("Node a?b#c")
    # (the Content-Security-Policy's own reports are tests/test_csp.py's business)
    assert [error for error in browser.errors if "Content Security Policy" not in error] == []
    browser.close()
