"""Hostile reads: every bad query value, path or form field is a 400 naming it (never a 500),
and no answer carries NaN or Infinity, even over data stored before ingest bounded floats."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest
from django.db import connection
from django.test import Client

from apps.alerts.models import Alert
from apps.alerts.services import alerts_sync
from apps.clusters.services import token_issue
from apps.runs.models import StepReport
from detectors.types import Finding
from tests.dashboard.conftest import PASSWORD, RUN, cluster_store, operator

NUL_MESSAGE = "must not contain a NUL character"


def strict_json(text: str | bytes):
    """json.loads that refuses the NaN / Infinity tokens Python's json would accept."""

    def refuse(token: str):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def first_error(response: httpx.Response) -> dict:
    assert response.status_code == 400, (response.status_code, response.text[:300])
    return response.json()["errors"][0]


# --- against the live stack: gunicorn, the middleware, the views -----------------------------


@pytest.fixture
def hostile(live_stack, live_db):
    """A cluster with data, an agent token, an operator's session and a firing alert, read
    over real HTTP."""
    cluster = cluster_store("alpha", nodes=1, gpus=2, steps=4)
    _, secret = token_issue(cluster_name="alpha", name="reader")
    alerts_sync(
        cluster=cluster,
        findings=[Finding(kind="xid", subject="node:node-00/gpu:0", severity="critical",
                          summary="XID", node="node-00", gpu=0)],
        now=time.time(),
    )  # fmt: skip
    agent = httpx.Client(base_url=live_stack.url, headers={"Authorization": f"Bearer {secret}"})
    browser = httpx.Client(base_url=live_stack.url)
    log_in(browser, operator().username)
    yield agent, browser, Alert.objects.get(cluster=cluster)
    agent.close()
    browser.close()


def log_in(browser: httpx.Client, username: str) -> None:
    """Through the login form of the stack (whose SECRET_KEY is not the test process's)."""
    form = browser.get("/accounts/login/")
    response = browser.post(
        "/accounts/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": csrf(form.text)},
    )
    assert response.status_code == 302, response.text[:300]


def csrf(page: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


API_NULS = [
    ("/api/v1/series?node=node%0000&metric=gpu.util", "node"),
    ("/api/v1/series?node=node-00&metric=gpu.util&cluster=al%00pha", "cluster"),
    ("/api/v1/runs/run%00-1", "path"),
    ("/api/v1/runs/run-1?cluster=%00", "cluster"),
    ("/api/v1/alerts?run=r%00", "run"),
    ("/api/v1/alerts?node=%00", "node"),
    ("/api/v1/alerts?cluster=alpha%00", "cluster"),
]
PAGE_NULS = [
    ("/clusters/al%00pha/", "path"),
    ("/clusters/alpha/nodes/node%00-00/", "path"),
    (f"/clusters/alpha/runs/{RUN}%00/", "path"),
    (f"/clusters/alpha/runs/{RUN}/charts/loss.json?range=1h%00", "range"),
    ("/clusters/alpha/nodes/node-00/charts/util.csv?range=%00", "range"),
    (f"/clusters/alpha/runs/{RUN}/?range=%00", "range"),
    ("/alerts/?node=node%00", "node"),
    ("/alerts/?kind=xid&cluster=%00", "cluster"),
]


def test_a_nul_in_any_read_parameter_or_path_is_a_400_naming_it(hostile):
    agent, browser, _ = hostile
    for url, loc in API_NULS:
        error = first_error(agent.get(url))
        assert error == {"loc": loc, "msg": NUL_MESSAGE}, url
    for url, loc in PAGE_NULS:
        error = first_error(browser.get(url))
        assert error == {"loc": loc, "msg": NUL_MESSAGE}, url
    # the same requests without the NUL are served
    assert agent.get("/api/v1/alerts?run=r").status_code == 200
    assert browser.get(f"/clusters/alpha/runs/{RUN}/?range=1h").status_code == 200


BAD_NUMBERS = [
    ("/api/v1/series?node=node-00&metric=gpu.util&start=NaN", "start"),
    ("/api/v1/series?node=node-00&metric=gpu.util&start=1e20", "start"),
    ("/api/v1/series?node=node-00&metric=gpu.util&start=-1", "start"),
    ("/api/v1/series?node=node-00&metric=gpu.util&end=inf", "end"),
    ("/api/v1/series?node=node-00&metric=gpu.util&step=inf", "step"),
    ("/api/v1/series?node=node-00&metric=gpu.util&step=NaN", "step"),
    ("/api/v1/series?node=node-00&metric=gpu.util&step=1e30", "step"),
    ("/api/v1/series?node=node-00&metric=gpu.util&gpu=32767", "gpu"),
    ("/api/v1/series?node=node-00&metric=gpu.util&gpu=99999999999999999999", "gpu"),
    ("/api/v1/alerts?since=1e20", "since"),
    ("/api/v1/alerts?since=NaN", "since"),
    ("/api/v1/alerts?since=-inf", "since"),
]


def test_non_finite_and_out_of_range_numbers_are_a_400_naming_the_field(hostile):
    agent, _, _ = hostile
    for url, loc in BAD_NUMBERS:
        assert first_error(agent.get(url))["loc"] == loc, url
    now = time.time()
    fine = agent.get(
        "/api/v1/series",
        params={"node": "node-00", "metric": "gpu.util", "gpu": 0, "start": now - 60, "step": 10},
    )
    assert fine.status_code == 200 and strict_json(fine.content)["points"]


def test_a_nul_in_an_acknowledgement_note_is_a_400_and_acknowledges_nothing(hostile):
    _, browser, alert = hostile
    page = browser.get("/alerts/").text
    token = csrf(page)
    form = browser.post(
        f"/alerts/{alert.id}/ack",
        data={"csrfmiddlewaretoken": token, "note": "on it\x00", "next": "/alerts/"},
    )
    assert first_error(form) == {"loc": "note", "msg": NUL_MESSAGE}
    api = browser.post(
        f"/api/v1/alerts/{alert.id}/ack",
        json={"note": "on it\x00"},
        headers={"X-CSRFToken": browser.cookies["csrftoken"]},
    )
    assert first_error(api) == {"loc": "note", "msg": NUL_MESSAGE}
    alert.refresh_from_db()
    assert alert.state == "firing"
    # a clean note still goes through the form
    done = browser.post(
        f"/alerts/{alert.id}/ack",
        data={"csrfmiddlewaretoken": token, "note": "on it", "next": "/alerts/"},
    )
    assert done.status_code == 302
    alert.refresh_from_db()
    assert alert.state == "acknowledged" and alert.ack_note == "on it"


# --- data stored before ingest bounded its floats ----------------------------------------------


@pytest.fixture
def poisoned(transactional_db):
    """A cluster whose stored history overflows: a sample chunk of node-00 GPU 0 with an
    infinite sum and value, and step reports of 1.7e308 s (whose sum overflows float8).
    Transactional, as a request runs in production: a failed query ends only its statement."""
    cluster = cluster_store("alpha", nodes=2, gpus=2, steps=12)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE telemetry_chunk SET vsum = 'Infinity', vmax = 'Infinity',"
            " vals[1] = 'Infinity' WHERE gpu = 0 AND node_id = ("
            "  SELECT id FROM clusters_node WHERE name = 'node-00' AND cluster_id = %s)",
            [cluster.id],
        )
        assert cursor.rowcount > 0
    StepReport.objects.filter(rank__in=(0, 1)).update(
        step_time=1.7e308, compute_time=1.7e308, loss=1.7e308
    )
    client = Client()
    client.force_login(operator())
    yield cluster, client
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE telemetry_chunk")


def json_scripts(html: str) -> dict[str, str]:
    found = re.findall(r'<script id="([^"]+)" type="application/json">(.*?)</script>', html, re.S)
    assert found
    return dict(found)


def test_the_series_api_answers_null_for_stored_infinities(poisoned):
    cluster, client = poisoned
    _, secret = token_issue(cluster_name=cluster.name, name="reader")
    reader = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
    now = time.time()
    for step in (0, 5, 60):
        response = reader.get(
            "/api/v1/series",
            {"node": "node-00", "metric": "gpu.util", "gpu": 0, "start": now - 600, "step": step},
        )
        assert response.status_code == 200
        points = strict_json(response.content)["points"]
        assert points and any(None in point for point in points), step


def test_the_run_page_and_every_run_chart_answer_with_overflowing_data(poisoned):
    cluster, client = poisoned
    base = f"/clusters/{cluster.name}/runs/{RUN}/"
    page = client.get(base)
    assert page.status_code == 200
    figures = {
        name: strict_json(text) for name, text in json_scripts(page.content.decode()).items()
    }
    # the step sums overflow float8 in the database: those charts say so, the others draw
    assert "not drawn" in figures["figure-throughput"]["layout"]["title"]["text"]
    assert figures["figure-checksums"]["data"][0]["y"]
    for chart in ("throughput", "step_time", "stages", "loss", "checksums", "checkpoints",
                  "goodput"):  # fmt: skip
        for fmt in ("json", "csv"):
            response = client.get(f"{base}charts/{chart}.{fmt}?range=1h")
            assert response.status_code == 200, (chart, fmt, response.content[:200])
            if fmt == "json":
                strict_json(response.content)
            else:
                assert b"inf" not in response.content.lower(), chart


def test_the_node_page_and_its_charts_answer_with_an_infinite_chunk(poisoned):
    cluster, client = poisoned
    base = f"/clusters/{cluster.name}/nodes/node-00/"
    page = client.get(base)
    assert page.status_code == 200
    scripts = json_scripts(page.content.decode())
    util = strict_json(scripts["figure-util"])
    assert None in util["data"][0]["y"]  # the infinite value drawn as a gap
    for chart in ("util", "temperature"):
        body = strict_json(client.get(f"{base}charts/{chart}.json?range=15m").content)
        assert body["figure"]["data"]
        csv = client.get(f"{base}charts/{chart}.csv?range=15m").content.decode()
        assert "inf" not in csv.lower()


def test_the_api_renderer_never_writes_nan_or_infinity():
    from opsboard.api import StrictJSONRenderer

    body = StrictJSONRenderer().render(
        None, {"a": [1.5, float("inf"), float("-inf"), float("nan")], 3: 2**70}, response_status=200
    )
    assert strict_json(body) == {"a": [1.5, None, None, None], "3": 2**70}
