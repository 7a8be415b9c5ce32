"""One truth per number: the run page's goodput tile, the goodput chart (page and endpoint),
its CSV export and the API's run summary give the same goodput for the same moment; the
throughput chart has no plunge in its partial last bucket; an empty chart says what is
missing; a page-wide range can be absolute (?from=&to=)."""

from __future__ import annotations

import csv
import html
import io
import re
import statistics
import time

import pytest
from django.test import Client

from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.runs.models import Run, RunEvent
from apps.runs.selectors import run_goodput
from tests.dashboard.conftest import RUN, cluster_store
from tests.dashboard.test_pages import json_script

pytestmark = pytest.mark.django_db


def tile_text(page: str) -> str:
    return html.unescape(re.search(r'<span id="goodput">(.*?)</span>', page).group(1))


def test_the_goodput_tile_chart_export_and_api_agree_for_the_same_moment(cluster, client_in):
    run = Run.objects.get(cluster=cluster, name=RUN)
    _, secret = token_issue(cluster_name=cluster.name, name="reader")
    reader = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    base = f"/clusters/{cluster.name}/runs/{RUN}/"
    started = time.time()
    page = client_in.get(base).content.decode()
    chart = client_in.get(f"{base}charts/goodput.json?range=15m").json()
    rows = list(
        csv.reader(io.StringIO(client_in.get(f"{base}charts/goodput.csv").content.decode()))
    )
    api = reader.get(f"/api/v1/runs/{RUN}").json()["goodput"]
    finished = time.time()

    # the page's tile and its chart: one summary, one moment (the page's now, not the
    # range's end 5 minutes ahead), and the one selector's numbers for that moment
    on_page = json_script(page, "figure-goodput")["layout"]["meta"]
    assert started <= on_page["as_of"] <= finished
    assert on_page["goodput"] == run_goodput(run=run, now=on_page["as_of"])
    assert tile_text(page) == on_page["text"] == f"{on_page['goodput']['goodput'] * 100:.0f} %"
    # the endpoint (what the live refresh draws) likewise, as of its own now
    meta = chart["figure"]["layout"]["meta"]
    assert started <= meta["as_of"] <= finished and chart["end"] > finished + 200
    assert meta["goodput"] == run_goodput(run=run, now=meta["as_of"])
    bars = dict(zip(chart["figure"]["data"][0]["x"], chart["figure"]["data"][0]["y"], strict=True))
    assert bars["productive"] == meta["goodput"]["productive_s"]
    # the export and the API, asked a moment later: the same productive seconds, and only the
    # moments between the answers added to the wall (as of the range's end it would be 300 s)
    exported = {row[1]: float(row[2]) for row in rows[1:]}
    for later in (exported, {"productive": api["productive_s"], **api["badput_s"]}):
        assert later["productive"] == pytest.approx(bars["productive"])
        wall = sum(bars.values())
        assert wall - 0.01 <= sum(later.values()) <= wall + finished - started + 0.01
    assert api["productive_s"] == on_page["goodput"]["productive_s"]
    assert 0 <= api["wall_s"] - on_page["goodput"]["wall_s"] <= finished - started + 0.01


def test_a_goodput_as_of_a_past_range_end_is_computed_as_of_that_end(cluster, client_in):
    run = Run.objects.get(cluster=cluster, name=RUN)
    end = time.time() - 3
    url = f"/clusters/{cluster.name}/runs/{RUN}/charts/goodput.json?from={end - 600}&to={end}"
    meta = client_in.get(url).json()["figure"]["layout"]["meta"]
    assert meta["as_of"] == pytest.approx(end)
    assert meta["goodput"] == run_goodput(run=run, now=meta["as_of"])


def aligned_now(offset: float) -> float:
    """A moment `offset` seconds past a minute boundary (so past one of every bucket width
    the history may pick), in the next minute: the run's newest bucket is partial."""
    return (time.time() // 60) * 60 + 60 + offset


def test_the_throughput_has_no_plunge_in_its_partial_last_bucket(client_in):
    cluster = cluster_store("steady", nodes=1, gpus=2, steps=125, now=aligned_now(6.5))
    body = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/charts/throughput.json").json()
    tokens, steps = body["figure"]["data"]
    assert [tokens["name"], steps["name"]] == ["tokens/s", "steps/s"]
    for trace in (tokens, steps):
        values = trace["y"]
        assert len(values) >= 2, values
        assert values[-1] >= 0.5 * statistics.median(values), (trace["name"], values)
        assert values[0] >= 0.5 * statistics.median(values), (trace["name"], values)
    # one step per second of two ranks, 1000 tokens each
    assert statistics.median(steps["y"]) == pytest.approx(1.0, rel=0.05)
    assert statistics.median(tokens["y"]) == pytest.approx(2000, rel=0.05)


def test_tokens_and_steps_have_axes_of_their_own(cluster, client_in):
    layout = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/charts/throughput.json").json()[
        "figure"
    ]["layout"]
    assert "overlaying" not in layout["yaxis2"]
    assert layout["yaxis"]["domain"][0] > layout["yaxis2"]["domain"][1]  # one above the other
    assert layout["yaxis"]["title"]["text"] == "tokens/s"
    assert layout["yaxis2"]["title"]["text"] == "steps/s"
    assert layout["yaxis"]["automargin"] and layout["yaxis2"]["automargin"]


def test_the_tokens_tile_groups_thousands(cluster, client_in):
    page = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/").content.decode()
    assert re.search(r'<span id="tokens-per-s">\d{1,3}(,\d{3})+</span>', page)


def empty_message(page: str, chart: str) -> str | None:
    figure = json_script(page, f"figure-{chart}")
    if figure["layout"].get("meta", {}).get("empty"):
        assert figure["layout"]["xaxis"]["visible"] is False  # no bare year-2000 axis
    return figure["layout"].get("meta", {}).get("empty")


def test_a_node_without_gpus_says_so_on_its_page_and_charts(cluster, client_in):
    Node.objects.create(cluster=cluster, name="cpu-only", info={})
    page = client_in.get(f"/clusters/{cluster.name}/nodes/cpu-only/").content.decode()
    assert "No GPUs reported" in page and "? ×" not in page
    assert empty_message(page, "util") == "this node reports no GPUs"
    url = f"/clusters/{cluster.name}/nodes/cpu-only/charts/util.json"
    meta = client_in.get(url).json()["figure"]["layout"]["meta"]
    assert meta["empty"] == "this node reports no GPUs"
    four = client_in.get(f"/clusters/{cluster.name}/nodes/node-00/").content.decode()
    assert re.search(r'<p id="node-gpus">4 × GPU', four)
    assert empty_message(four, "util") is None


def test_a_run_without_checkpoints_or_steps_says_what_is_missing(cluster, client_in):
    RunEvent.objects.filter(kind="checkpoint").delete()
    page = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/").content.decode()
    assert empty_message(page, "checkpoints") == "no checkpoint reported yet"
    assert empty_message(page, "loss") is None
    # every rank agreed: the table says so rather than showing bare headers
    assert re.search(r'id="no-disagreement"><td colspan="6">No disagreement', page)

    Run.objects.create(cluster=cluster, name="fresh")
    fresh = client_in.get(f"/clusters/{cluster.name}/runs/fresh/").content.decode()
    for chart in ("throughput", "stages", "loss", "goodput"):
        assert empty_message(fresh, chart) == "no step reports yet", chart
    assert empty_message(fresh, "checksums") == "no checksummed step in this time range"
    assert "No checked step in this time range." in fresh


def test_a_range_can_be_absolute_in_the_chart_endpoints_and_the_page(cluster, client_in):
    now = time.time()
    start, end = now - 120, now - 2
    base = f"/clusters/{cluster.name}/runs/{RUN}/"
    body = client_in.get(f"{base}charts/loss.json", {"from": start, "to": end}).json()
    assert body["range"] == "custom" and (body["start"], body["end"]) == (start, end)
    iso = client_in.get(
        f"{base}charts/loss.json", {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00"}
    ).json()
    assert (iso["start"], iso["end"]) == (1767225600.0, 1767229200.0)
    page = client_in.get(base, {"from": start, "to": end}).content.decode()
    assert json_script(page, "page-data")["range"]["key"] == "custom"
    assert f"charts/loss.csv?from={start:.3f}&amp;to={end:.3f}" in page
    assert 'id="follow-live" aria-pressed="false"' in page
    csv_rows = client_in.get(f"{base}charts/loss.csv", {"from": start, "to": end})
    assert 'filename="loss-custom.csv"' in csv_rows["Content-Disposition"]


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ({"from": "yesterday", "to": "1"}, "from"),
        ({"from": "100", "to": "105"}, "from"),  # under 10 s
        ({"from": "0", "to": str(40 * 86_400)}, "from"),  # over 31 days
        ({"from": "nan", "to": "100"}, "from"),
        ({"to": "100"}, "from"),
    ],
)
def test_it_rejects_a_bad_absolute_range_naming_it(cluster, client_in, query, loc):
    response = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/charts/loss.json", query)
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == loc
    page = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/", query)
    assert page.status_code == 200  # a page never 400s on a stale link
