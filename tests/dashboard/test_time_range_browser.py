"""The page-wide time range, follow-live, the UTC/local switch, empty states and the goodput
tile in a real browser (Chromium, the live stack serving data stored by the ingest service)."""

from __future__ import annotations

import re
import statistics
import time

import pytest

from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.runs.models import Run, RunEvent
from tests.browser import log_in, screenshot
from tests.conftest import AgentClient
from tests.dashboard.conftest import PASSWORD, RUN, chromium, cluster_store, operator  # noqa: F401
from tests.dashboard.test_one_truth import aligned_now

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

ZONE = "America/New_York"  # the browser's own zone: never UTC, so the switch shows
DRAWN = """(ids) => ids.every((id) => { const d = document.getElementById(id);
  return d && d.data && d.layout; })"""
LOSS_RANGE = "() => document.getElementById('chart-loss').layout.xaxis.range"
LOSS_TITLE = "() => document.getElementById('chart-loss').layout.xaxis.title.text"
REFRESH_S = 5


@pytest.fixture
def page(chromium, live_stack, live_db):  # noqa: F811
    operator("op")
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, timezone_id=ZONE)
    tab = context.new_page()
    tab.errors = []
    tab.on("console", lambda m: m.type == "error" and tab.errors.append(m.text))
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    log_in(tab, live_stack.url, "op", PASSWORD)
    yield tab
    assert [e for e in tab.errors if "Content Security Policy" not in e] == []
    context.close()


def wait_drawn(tab, *charts: str) -> None:
    tab.wait_for_function(DRAWN, arg=[f"chart-{c}" for c in charts], timeout=15_000)


def shown_ms(tab, values: list[str]) -> list[float]:
    """Plotly's range strings (in the page's zone) as Unix ms, read back by timezone.js."""
    return tab.evaluate("(vs) => vs.map((v) => window.opsboardZone.parse(v))", values)


def test_a_zoom_is_the_page_range_in_the_url_and_survives_live_updates_and_reloads(
    page, live_stack
):
    cluster = cluster_store("zoomy", nodes=1, gpus=2, steps=125, now=aligned_now(6.5))
    run_url = f"{live_stack.url}/clusters/{cluster.name}/runs/{RUN}/"
    page.goto(run_url)
    wait_drawn(page, "loss", "throughput", "stages", "checkpoints")
    assert page.get_attribute("#follow-live", "aria-pressed") == "true"

    # the steady run's last, partial bucket does not plunge
    rates = page.evaluate("() => Array.from(document.getElementById('chart-throughput').data[1].y)")
    assert len(rates) >= 2 and rates[-1] >= 0.5 * statistics.median(rates), rates

    # a brush on the loss chart sets the range of every time chart, and the URL
    now = time.time()
    start, end = now - 100, now - 40
    page.evaluate(
        """([a, b]) => { const z = window.opsboardZone;
        Plotly.relayout('chart-loss',
          {'xaxis.range': [z.format(a * 1000), z.format(b * 1000)]}); }""",
        [start, end],
    )
    page.wait_for_function("() => location.search.includes('from=')")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.chart-panel')]"
        ".every((p) => p.dataset.loading === 'false')"
    )
    assert page.get_attribute("#follow-live", "aria-pressed") == "false"
    for chart in ("loss", "throughput", "checkpoints"):
        got = shown_ms(page, page.evaluate(LOSS_RANGE.replace("chart-loss", f"chart-{chart}")))
        assert got == pytest.approx([start * 1000, end * 1000], abs=5), chart
    url = page.url
    export = page.get_attribute('.chart-panel[data-chart="loss"] a.export[data-format=csv]', "href")
    assert re.search(r"loss\.csv\?from=[0-9.]+&to=[0-9.]+$", export), export

    # a live delta naming the run's node refetches every chart; the zoom stays
    fetched = []
    page.on("request", lambda r: "/charts/loss.json" in r.url and fetched.append(r.url))
    page.evaluate(
        """() => document.dispatchEvent(new CustomEvent('opsboard:delta',
        {detail: {cluster: 'zoomy', nodes: [{node: 'node-00'}]}}))"""
    )
    page.wait_for_timeout((REFRESH_S + 1.5) * 1000)
    assert fetched, "no live refresh happened"
    assert shown_ms(page, page.evaluate(LOSS_RANGE)) == pytest.approx(
        [start * 1000, end * 1000], abs=5
    )
    assert page.url == url

    # a reload (or the link shared) shows the same range
    page.reload()
    wait_drawn(page, "loss")
    assert shown_ms(page, page.evaluate(LOSS_RANGE)) == pytest.approx(
        [start * 1000, end * 1000], abs=5
    )
    assert page.get_attribute("#follow-live", "aria-pressed") == "false"

    # follow live: on returns to the last relative range (the run page's 1h), zoom is lost
    page.click("#follow-live")
    page.wait_for_function("() => new URLSearchParams(location.search).get('range') === '1h'")
    assert "from=" not in page.url
    assert page.get_attribute("#follow-live", "aria-pressed") == "true"
    page.click('#time-range button[data-range="15m"]')
    page.wait_for_function("() => new URLSearchParams(location.search).get('range') === '15m'")
    page.click("#follow-live")  # off: the window shown, fixed
    page.wait_for_function("() => location.search.includes('from=')")
    page.click("#follow-live")  # on: back to 15m, not the page's default
    page.wait_for_function("() => new URLSearchParams(location.search).get('range') === '15m'")
    screenshot(page, "dashboard-run-range")


def test_the_zone_switch_relabels_axes_and_tables_and_is_remembered(page, live_stack):
    cluster = cluster_store("zones", nodes=1, gpus=2, steps=20)
    page.goto(f"{live_stack.url}/clusters/{cluster.name}/nodes/node-00/")
    wait_drawn(page, "util")
    title = "() => document.getElementById('chart-util').layout.xaxis.title.text"
    first_x = "() => document.getElementById('chart-util').data[0].x[0]"
    assert page.evaluate(title).endswith("(UTC)")
    assert page.locator("th", has_text="Time (UTC)").count() == 1
    utc_x = page.evaluate(first_x)
    page.click("#zone-switch")
    page.wait_for_function(f"() => ({title})().includes('local time, {ZONE}')")
    assert page.locator("th", has_text=f"Time (local time, {ZONE})").count() == 1
    local_x = page.evaluate(first_x)
    # the same moment drawn at New York's wall clock: 4 or 5 hours behind UTC
    assert (utc_x - local_x) / 3_600_000 in (4.0, 5.0), (utc_x, local_x)
    event_time = page.inner_text("tr[data-kind=xid] time")
    page.reload()
    wait_drawn(page, "util")
    assert f"local time, {ZONE}" in page.evaluate(title)
    assert page.inner_text("tr[data-kind=xid] time") == event_time
    page.click("#zone-switch")
    page.wait_for_function(f"() => ({title})().endsWith('(UTC)')")


def test_empty_states_say_what_is_missing_and_the_goodput_tile_is_the_charts(page, live_stack):
    cluster = cluster_store("quiet", nodes=1, gpus=2, steps=30, now=time.time() - 5)
    Node.objects.create(cluster=cluster, name="cpu-only", info={})
    RunEvent.objects.filter(kind="checkpoint").delete()
    Run.objects.filter(cluster=cluster, name=RUN).update(state="finished")
    page.goto(f"{live_stack.url}/clusters/{cluster.name}/nodes/cpu-only/")
    wait_drawn(page, "util")
    util = page.locator('.chart-panel[data-chart="util"] .annotation-text')
    assert util.text_content() == "this node reports no GPUs"
    assert "No GPUs reported" in page.inner_text("#node-gpus")
    assert page.locator("#chart-util .xtick").count() == 0  # no year-2000 axis

    page.goto(f"{live_stack.url}/clusters/{cluster.name}/runs/{RUN}/")
    wait_drawn(page, "checkpoints", "goodput")
    empty = page.locator('.chart-panel[data-chart="checkpoints"] .annotation-text')
    assert empty.text_content() == "no checkpoint reported yet"
    assert page.inner_text("#no-disagreement").startswith("No disagreement")

    # a finished run's goodput does not move: tile, drawn chart, its JSON and the API agree
    tile = page.inner_text("#goodput")
    assert re.fullmatch(r"\d+ %", tile)
    body = page.evaluate(
        """async () => (await (await fetch(document.querySelector('[data-chart=goodput]')
        .dataset.url + '.json?range=1h')).json())"""
    )
    assert body["figure"]["layout"]["meta"]["text"] == tile
    drawn = page.evaluate("() => document.getElementById('chart-goodput').layout.title.text")
    assert drawn == f"Goodput {tile}"
    _, secret = token_issue(cluster_name=cluster.name, name="reader")
    api = AgentClient(live_stack.url, secret)
    summary = api.get(f"/api/v1/runs/{RUN}").json()
    api.http.close()
    assert f"{summary['goodput']['goodput'] * 100:.0f} %" == tile
    # the live refresh redraws the tile from the chart it fetched
    page.evaluate("() => { document.getElementById('goodput').textContent = 'stale'; }")
    page.evaluate("() => window.opsboardCharts.refreshAll()")
    page.wait_for_function(f"() => document.getElementById('goodput').textContent === '{tile}'")
