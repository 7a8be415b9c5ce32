"""Chart endpoints: JSON is the figure the page draws, CSV the same points; `range` checked."""

import csv
import gzip
import io
import json
import time

import pytest

from tests.dashboard.conftest import RUN

pytestmark = pytest.mark.django_db


def test_a_chart_goes_gzipped_to_a_browser_that_takes_it(cluster, client_in):
    url = f"/clusters/{cluster.name}/runs/{RUN}/charts/step_time.json?range=15m"
    plain = client_in.get(url)
    packed = client_in.get(url, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert "Content-Encoding" not in plain and packed["Content-Encoding"] == "gzip"
    assert len(packed.content) < len(plain.content) / 3
    assert json.loads(gzip.decompress(packed.content))["figure"] == plain.json()["figure"]
    node = client_in.get(
        f"/clusters/{cluster.name}/nodes/node-00/charts/util.json?range=15m",
        HTTP_ACCEPT_ENCODING="gzip",
    )
    assert node.status_code == 200 and node["Content-Encoding"] == "gzip"


def test_the_json_export_is_the_figure_for_the_range(cluster, client_in):
    before = time.time()
    response = client_in.get(f"/clusters/{cluster.name}/runs/{RUN}/charts/step_time.json?range=15m")
    assert response.status_code == 200
    body = response.json()
    assert body["chart"] == "step_time" and body["range"] == "15m"
    assert body["end"] - body["start"] == pytest.approx(900 + 300)  # and 5 min ahead
    assert body["end"] >= before + 300
    heatmap = body["figure"]["data"][0]
    assert heatmap["meta"]["ranks"] == list(range(8))
    assert [label.split(" · ")[0] for label in heatmap["y"]] == [f"r{rank}" for rank in range(8)]
    # every rank as fast as the median: 0.64 s each, 1.0 × the median
    assert all(
        value == pytest.approx(0.64) for row in heatmap["customdata"] for value in row if value
    )
    assert all(value == pytest.approx(1.0) for row in heatmap["z"] for value in row if value)


def test_the_csv_export_holds_the_points_of_the_json_export(cluster, client_in):
    base = f"/clusters/{cluster.name}/nodes/node-01/charts/temperature"
    figure = client_in.get(f"{base}.json?range=1h").json()["figure"]
    response = client_in.get(f"{base}.csv?range=1h")
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    assert 'filename="temperature-1h.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == ["series", "time", "°C"]
    points = sum(len(trace["y"]) for trace in figure["data"])
    assert len(rows) - 1 == points >= 4  # 1 h in ≤ 600 buckets: a few 10 s buckets per GPU
    assert {row[0] for row in rows[1:]} == {"GPU 0", "GPU 1", "GPU 2", "GPU 3"}
    assert all(float(row[2]) == 60.0 and row[1].endswith("+00:00") for row in rows[1:])


def test_the_checksum_csv_names_the_disagreeing_ranks_counts(cluster, client_in):
    url = f"/clusters/{cluster.name}/runs/{RUN}/charts/checksums.csv?range=all"
    rows = list(csv.reader(io.StringIO(client_in.get(url).content.decode())))
    assert rows[0] == ["series", "step", "ranks"]
    assert ["ranks agreeing", "0", "8"] in rows and ["ranks agreeing", "5", "8"] in rows
    assert ["gradient checksum differs", "5", "0"] in rows


@pytest.mark.parametrize("bad", ["2h", "", "all;drop", "15M"])
def test_it_rejects_an_unknown_range_naming_the_parameter(cluster, client_in, bad):
    for url in (
        f"/clusters/{cluster.name}/runs/{RUN}/charts/loss.json?range={bad}",
        f"/clusters/{cluster.name}/nodes/node-00/charts/util.csv?range={bad}",
    ):
        response = client_in.get(url)
        assert response.status_code == 400, url
        assert response.json()["errors"][0]["loc"] == "range"
        assert "15m, 1h, 6h, 24h, all" in response.json()["errors"][0]["msg"]


@pytest.mark.parametrize("key", ["15m", "1h", "6h", "24h", "all"])
def test_every_range_of_the_picker_is_served(cluster, client_in, key):
    url = f"/clusters/{cluster.name}/runs/{RUN}/charts/loss.json?range={key}"
    body = client_in.get(url).json()
    assert body["range"] == key
    assert any(value is not None for value in body["figure"]["data"][0]["y"])
