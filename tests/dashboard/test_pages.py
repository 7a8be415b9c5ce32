"""The pages render what they promise, for logged-in users only, with 404 on unknown names."""

import json
import re

import pytest
from django.test import Client

from tests.dashboard.conftest import RUN, cluster_store

pytestmark = pytest.mark.django_db


def page_urls(cluster: str) -> list[str]:
    return [
        "/",
        f"/clusters/{cluster}/",
        f"/clusters/{cluster}/runs/{RUN}/",
        f"/clusters/{cluster}/nodes/node-00/",
        "/alerts/",
        f"/clusters/{cluster}/runs/{RUN}/charts/throughput.json",
        f"/clusters/{cluster}/nodes/node-00/charts/util.csv",
    ]


def json_script(html: str, element_id: str):
    pattern = rf'<script id="{element_id}" type="application/json">(.*?)</script>'
    found = re.search(pattern, html, re.S)
    assert found, f"no json_script {element_id}"
    return json.loads(found.group(1))


def test_it_sends_anonymous_visitors_to_the_login_page(cluster):
    for url in page_urls(cluster.name):
        response = Client().get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/accounts/login/?next="), url


def test_it_answers_404_for_unknown_names(cluster, client_in):
    for url in (
        "/clusters/nope/",
        f"/clusters/{cluster.name}/runs/nope/",
        f"/clusters/{cluster.name}/nodes/nope/",
        f"/clusters/{cluster.name}/runs/{RUN}/charts/nope.json",
        f"/clusters/{cluster.name}/nodes/node-00/charts/nope.csv",
        "/alerts/?cluster=nope",
    ):
        assert client_in.get(url).status_code == 404, url


def test_home_goes_straight_to_the_only_cluster(cluster, client_in):
    response = client_in.get("/")
    assert response.status_code == 302
    assert response["Location"] == f"/clusters/{cluster.name}/"
    cluster_store("beta", nodes=1, steps=1)
    listing = client_in.get("/").content.decode()
    assert 'href="/clusters/alpha/"' in listing and 'href="/clusters/beta/"' in listing


def test_the_overview_has_a_tile_per_gpu_of_every_node(cluster, client_in):
    html = client_in.get(f"/clusters/{cluster.name}/").content.decode()
    assert html.count('class="node-card"') == 2
    assert len(re.findall(r'class="tile"[^>]*data-state="ok"', html)) == 8
    assert re.search(r'id="count-healthy">8</span> / <span id="count-gpus">8<', html)
    assert f'href="/clusters/{cluster.name}/runs/{RUN}/"' in html
    data = json_script(html, "page-data")
    assert [node["node"] for node in data["nodes"]] == ["node-00", "node-01"]


def test_the_run_page_hands_every_figure_over_with_data(cluster, client_in):
    html = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/").content.decode()
    throughput = json_script(html, "figure-throughput")
    assert any(v for v in throughput["data"][0]["y"] if v)
    # the heat-map is not embedded: the page fetches it from its endpoint after load
    assert 'id="figure-step_time"' not in html
    panel = re.search(r'<section class="chart-panel" data-chart="step_time"[^>]*>', html)[0]
    url = f"/clusters/{cluster.name}/runs/{RUN}/charts/step_time"
    assert f'data-url="{url}"' in panel and 'data-loading="true"' in panel
    shown = re.search(r'data-range="([^"]+)"', panel)[1]  # the page's range
    heatmap = client_in.get(f"{url}.json?range={shown}").json()["figure"]["data"][0]
    assert heatmap["type"] == "heatmap" and heatmap["meta"]["ranks"] == list(range(8))
    assert heatmap["y"] == [f"r{rank} · node-0{rank // 4}" for rank in range(8)]  # no gpu sent
    stages = json_script(html, "figure-stages")["data"]
    assert [trace["name"] for trace in stages] == [
        "data loading", "host-to-device", "compute", "collective wait"
    ]  # fmt: skip
    checks = json_script(html, "figure-checksums")["data"]
    assert checks[0]["x"] == [0, 5] and checks[0]["y"] == [8, 8]
    checkpoints = json_script(html, "figure-checkpoints")["data"]
    completed = next(trace for trace in checkpoints if trace["name"] == "completed")
    assert sorted(completed["y"]) == ["durable", "local"]
    assert json_script(html, "figure-goodput")["data"][0]["x"][0] == "productive"
    assert re.search(r'src="/static/vendor/plotly\.min(\.[0-9a-f]+)?\.js"', html)


def test_the_node_page_has_a_series_per_gpu(cluster, client_in):
    html = client_in.get(f"/clusters/{cluster.name}/nodes/node-00/").content.decode()
    for chart in ("util", "memory", "temperature", "power", "throttle"):
        figure = json_script(html, f"figure-{chart}")
        assert [trace["name"] for trace in figure["data"]] == [f"GPU {g}" for g in range(4)]
        assert all(trace["y"] for trace in figure["data"]), chart
    assert re.search(
        r'<tr data-kind="xid">.*?<td>1</td>\s*<td>79</td><td>fell off the bus</td>', html, re.S
    )
    assert "No XID or ECC events" not in html
    other = client_in.get(f"/clusters/{cluster.name}/nodes/node-01/").content.decode()
    assert "No XID or ECC events" in other
    util = json_script(html, "figure-util")["data"]
    assert [set(trace["y"]) for trace in util] == [{90.0}, {91.0}, {92.0}, {93.0}]


def test_a_run_without_steps_yet_renders_empty_charts(cluster, client_in):
    from apps.runs.models import Run

    Run.objects.create(cluster=cluster, name="fresh")
    response = client_in.get(f"/clusters/{cluster.name}/runs/fresh/")
    assert response.status_code == 200
    figure = json_script(response.content.decode(), "figure-throughput")
    assert figure["data"][0]["x"] == []
    assert client_in.get(f"/clusters/{cluster.name}/runs/fresh/charts/goodput.csv").content == (
        b"series,bucket,seconds\nseconds,productive,0.0\n"
    )


def test_plotly_is_served_from_the_plotly_package_with_its_licence():
    from pathlib import Path

    import plotly
    from django.contrib.staticfiles import finders

    bundle = Path(finders.find("vendor/plotly.min.js"))
    assert bundle == Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    assert bundle.read_text()[:200].count("plotly.js v") == 1
    assert "MIT" in Path(finders.find("vendor/plotly.LICENSE.txt")).read_text()
