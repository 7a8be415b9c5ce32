"""A step report's optional `gpu` (an extension of the contract): validated, stored on the
report, visible in the schema, and echoed where the rank is named (heat-map, rank page)."""

import json

import pytest
from django.test import Client

from apps.clusters.services import token_issue
from apps.ingest.services import inbox_drain
from apps.runs.models import StepReport
from tests.conftest import make_batch
from tests.dashboard.conftest import operator

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest"


@pytest.fixture
def token():
    return token_issue(cluster_name="alpha", name="t")


def post(client: Client, secret: str, body: dict):
    return client.post(
        URL, json.dumps(body).encode(), content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )  # fmt: skip


def batch_with_gpus(*gpus) -> dict:
    batch = make_batch(samples=0, steps=len(gpus))
    for step, gpu in zip(batch["steps"], gpus, strict=True):
        if gpu is not None:
            step["gpu"] = gpu
    return batch


def test_it_stores_the_gpu_of_a_step_and_the_pages_name_it(client, token):
    response = post(client, token[1], batch_with_gpus(5, None))
    assert response.status_code == 202
    inbox_drain(first_id=None, limit=10)
    assert dict(StepReport.objects.values_list("rank", "gpu")) == {0: 5, 1: None}

    client.force_login(operator())
    page = client.get("/clusters/alpha/runs/run-1/ranks/0/")
    assert page.status_code == 200
    assert "GPU 5" in page.content.decode()
    heatmap = client.get("/clusters/alpha/runs/run-1/charts/step_time.json?range=15m").json()
    assert heatmap["figure"]["data"][0]["y"] == ["r0 · node-01 · gpu5", "r1 · node-01"]


def test_it_accepts_steps_without_a_gpu(client, token):
    assert post(client, token[1], batch_with_gpus(None, None)).status_code == 202


@pytest.mark.parametrize("gpu", [64, -1, "5", 5.0, True])
def test_it_refuses_a_gpu_out_of_range_or_not_an_integer_naming_the_field(client, token, gpu):
    response = post(client, token[1], batch_with_gpus(3, gpu))
    assert response.status_code == 400
    assert [item["loc"] for item in response.json()["errors"]] == ["steps[1].gpu"]


def test_the_schema_shows_the_steps_gpu_and_its_bounds(client):
    schema = client.get("/api/v1/openapi.json").json()
    step = schema["components"]["schemas"]["Step"]["properties"]["gpu"]
    integer = next(option for option in step["anyOf"] if option.get("type") == "integer")
    assert (integer["minimum"], integer["maximum"]) == (0, 63)
