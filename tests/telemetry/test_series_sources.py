"""Series kept apart by their scrape target (source): reading one by source, 404s naming
what a node never sent, the node's series grouped by source (API and node page)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.test import Client

from apps.clusters.models import Cluster
from apps.clusters.services import token_issue
from apps.ingest.services import ClaimedBatch, batches_store
from apps.telemetry.selectors import series_grouped, source_of
from tests.dashboard.conftest import operator

pytestmark = pytest.mark.django_db

# Two exporters exposing the same names, as node_exporter and process-exporter do.
SCRAPED = {
    "node:go_goroutines": 7.0,
    "node:node_load1": 0.5,
    "process:go_goroutines": 8.0,
    "process:namedprocess_namegroup_num_procs.groupname_x": 1.0,
}


def store(cluster: Cluster, node: str, samples: list[dict], batch_id: str) -> None:
    body = {"batch_id": batch_id, "node": node, "samples": samples, "steps": [], "events": []}
    batches_store(batches=[ClaimedBatch.of(cluster.id, datetime.now(UTC), body)])


@pytest.fixture
def stored():
    """Cluster `c`: node `n` sent the scraped series above (twice) and gpu.util of GPU 0;
    node `other` sent `only.other`. Returns (reader client, ts of the last batch)."""
    cluster = Cluster.objects.create(name="c")
    now = time.time()
    for n, ts in enumerate((now - 2, now - 1)):
        samples = [{"ts": ts, "metric": m, "value": v + n} for m, v in SCRAPED.items()]
        samples.append({"ts": ts, "metric": "gpu.util", "gpu": 0, "value": 90.0})
        store(cluster, "n", samples, f"n-{n}")
    store(cluster, "other", [{"ts": now, "metric": "only.other", "value": 1.0}], "o-0")
    _, secret = token_issue(cluster_name="c")
    return Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {secret}"), now - 1


def test_it_reads_same_named_series_of_two_sources_apart(stored):
    reader, ts = stored
    for source, value in (("node", 8.0), ("process", 9.0)):
        response = reader.get("/api/v1/series", {"node": "n", "metric": "go_goroutines",
                                                 "source": source})  # fmt: skip
        assert response.status_code == 200, response.content
        body = response.json()
        assert body["source"] == source and body["metric"] == "go_goroutines"
        assert [p[1] for p in body["points"]] == [value - 1, value]  # one value per timestamp
    stored_name = reader.get("/api/v1/series", {"node": "n", "metric": "node:node_load1"})
    assert [p[1] for p in stored_name.json()["points"]] == [0.5, 1.5]


@pytest.mark.parametrize(
    "params, loc, words",
    [
        ({"metric": "gpu.utl"}, "metric", "never sent gpu.utl"),  # no node sent it
        ({"metric": "only.other"}, "metric", "never sent only.other"),  # another node did
        ({"metric": "gpu.util", "gpu": 5}, "metric", "never sent gpu.util for GPU 5"),
        ({"metric": "gpu.util"}, "metric", "never sent gpu.util"),  # sent per GPU, not host
        ({"metric": "go_goroutines", "source": "dcgm"}, "source", "nothing from dcgm"),
        ({"metric": "node_load1", "source": "process"}, "metric", "never sent node_load1"),
    ],
)
def test_it_answers_404_naming_what_the_node_never_sent(stored, params, loc, words):
    reader, _ = stored
    response = reader.get("/api/v1/series", {"node": "n", **params})
    assert response.status_code == 404, response.content
    (error,) = response.json()["errors"]
    assert error["loc"] == loc and words in error["msg"], error


def test_a_range_without_points_of_a_series_the_node_sends_is_an_empty_200(stored):
    reader, ts = stored
    response = reader.get(
        "/api/v1/series",
        {"node": "n", "metric": "gpu.util", "gpu": 0, "start": ts - 7200, "end": ts - 3600},
    )
    assert response.status_code == 200 and response.json()["points"] == []


def test_it_refuses_a_source_that_is_not_a_target_name(stored):
    reader, _ = stored
    response = reader.get("/api/v1/series", {"node": "n", "metric": "x", "source": "a-b"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "source"


def test_it_lists_a_nodes_series_grouped_by_source(stored):
    reader, _ = stored
    body = reader.get("/api/v1/nodes/n/series").json()
    assert body["sources"] == [
        {"source": None, "series": 1},
        {"source": "node", "series": 2},
        {"source": "process", "series": 2},
    ]
    assert len(body["series"]) == 5
    process = reader.get("/api/v1/nodes/n/series", {"source": "process"}).json()
    assert process["sources"] == body["sources"]
    assert process["series"] == [
        {"metric": "process:go_goroutines", "source": "process", "name": "go_goroutines",
         "gpu": None},
        {"metric": "process:namedprocess_namegroup_num_procs.groupname_x", "source": "process",
         "name": "namedprocess_namegroup_num_procs.groupname_x", "gpu": None},
    ]  # fmt: skip
    core = [s for s in body["series"] if s["source"] is None]
    assert core == [{"metric": "gpu.util", "source": None, "name": "gpu.util", "gpu": 0}]


def test_the_listing_answers_404_for_an_unknown_source_or_node(stored):
    reader, _ = stored
    unknown = reader.get("/api/v1/nodes/n/series", {"source": "dcgm"})
    assert unknown.status_code == 404 and unknown.json()["errors"][0]["loc"] == "source"
    assert reader.get("/api/v1/nodes/nope/series").status_code == 404


def test_the_openapi_schema_shows_the_source_parameter_and_the_listing(stored):
    reader, _ = stored
    paths = reader.get("/api/v1/openapi.json").json()["paths"]
    series_params = {p["name"] for p in paths["/api/v1/series"]["get"]["parameters"]}
    assert "source" in series_params
    listing = paths["/api/v1/nodes/{name}/series"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {"name", "source", "cluster"}


def test_the_node_page_lists_sources_and_filters_series_by_source(stored):
    page = Client()
    page.force_login(operator())
    overview = page.get("/clusters/c/nodes/n/").content.decode()
    assert 'data-source="node"' in overview and 'data-source="process"' in overview
    assert "?source=process#series" in overview and ": 2 series" in overview
    assert 'id="series-list"' not in overview  # no source chosen: only the sources
    chosen = page.get("/clusters/c/nodes/n/", {"source": "process", "range": "6h"})
    html = chosen.content.decode()
    table = html[html.index('id="series-list"') : html.index("</table>", html.index("series-list"))]
    assert "namedprocess_namegroup_num_procs.groupname_x" in table and "go_goroutines" in table
    assert "node_load1" not in table
    assert "range=6h" in html[html.index('id="series-sources"') :]  # the range is kept


def test_source_of_splits_only_a_target_name_prefix():
    assert source_of("node:node_load1") == ("node", "node_load1")
    assert source_of("process:job:rate:5m") == ("process", "job:rate:5m")
    assert source_of("gpu.util") == (None, "gpu.util")
    assert source_of(":x") == (None, ":x") and source_of("a.b:c") == (None, "a.b:c")
    assert source_of("node:") == (None, "node:")


def test_series_grouped_counts_every_source_and_lists_the_chosen_one_sorted():
    grouped = series_grouped(
        series=[("b:x", None), ("a:y", 1), ("a:y", 0), ("gpu.util", 0), ("a:y", 0)],
        source="a",
    )
    assert grouped["sources"] == [
        {"source": None, "series": 1},
        {"source": "a", "series": 2},
        {"source": "b", "series": 1},
    ]
    assert [(s["name"], s["gpu"]) for s in grouped["series"]] == [("y", 0), ("y", 1)]


def test_a_chart_read_takes_three_round_trips(stored, django_assert_num_queries):
    """The token, the node with the metric's id, the chunks: under ingest each round trip
    waits for a core again, so the chart read keeps to these."""
    reader, _ = stored
    with django_assert_num_queries(3):
        response = reader.get("/api/v1/series", {"node": "n", "metric": "gpu.util", "gpu": 0})
    assert response.status_code == 200
    assert [p[1] for p in response.json()["points"]] == [90.0, 90.0]
