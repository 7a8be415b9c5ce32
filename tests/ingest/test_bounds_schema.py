"""The bounds as published and worded (in-process; nothing enqueued): the OpenAPI schema
shows each bound of apps.core.bounds, and a broken bound is answered in plain words."""

import json
import time

import pytest

from apps.clusters.services import token_issue
from apps.core import bounds
from apps.ingest.models import InboxBatch
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def secret():
    return token_issue(cluster_name="alpha", name="t")[1]


def post(client, secret: str, body: dict):
    return client.post(
        "/api/v1/ingest",
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


def nullable(prop: dict) -> dict:
    """The non-null branch of an optional field's schema."""
    return next((item for item in prop.get("anyOf", ()) if item.get("type") != "null"), prop)


def test_the_openapi_schema_shows_the_storage_bounds(client):
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    batch = schemas["IngestBatch"]["properties"]
    assert batch["node"]["pattern"] == bounds.NAME_PATTERN
    assert batch["node"]["maxLength"] == bounds.NAME_MAX_LENGTH
    assert nullable(batch["run"])["pattern"] == bounds.NAME_PATTERN
    assert batch["batch_id"]["pattern"] == bounds.NO_NUL_PATTERN
    step = schemas["Step"]["properties"]
    assert step["rank"]["maximum"] == bounds.RANK_MAX
    assert step["step"]["maximum"] == bounds.STEP_MAX
    assert nullable(step["tokens"])["maximum"] == bounds.TOKENS_MAX
    assert step["step_time"]["maximum"] == bounds.SECONDS_MAX
    assert nullable(step["shard"])["pattern"] == bounds.NO_NUL_PATTERN
    sample = schemas["Sample"]["properties"]
    assert sample["value"]["maximum"] == bounds.FLOAT_ABS_MAX
    assert sample["value"]["minimum"] == -bounds.FLOAT_ABS_MAX
    assert nullable(sample["gpu"])["maximum"] == bounds.GPU_MAX
    event = schemas["Event"]["properties"]
    assert nullable(event["message"])["maxLength"] == bounds.MESSAGE_MAX_LENGTH
    assert nullable(event["gpu"])["maximum"] == bounds.GPU_MAX
    node_info = schemas["NodeInfo"]
    assert nullable(node_info["properties"]["gpus"])["maximum"] == bounds.MAX_GPUS
    assert node_info["propertyNames"]["pattern"] == bounds.EXTRA_KEY_PATTERN
    assert "array" not in node_info["additionalProperties"]["type"]


def test_it_words_each_broken_bound_plainly(client, secret):
    batch = make_batch(samples=1, steps=1, run="r?")
    batch["steps"][0]["rank"] = 2**31
    batch["samples"][0]["value"] = 1.7e308
    batch["node"] = "a\x00b"
    batch["batch_id"] = "a\x00b"
    response = post(client, secret, batch)
    assert response.status_code == 400
    found = {item["loc"]: item["msg"] for item in response.json()["errors"]}
    assert found == {
        "batch_id": "must not contain NUL (\\u0000)",
        "node": found["node"],
        "run": found["node"],
        "steps[0].rank": f"must be at most {bounds.RANK_MAX}",
        "samples[0].value": "must be at most 1e+150",
    }
    assert found["node"].startswith("must work as a URL path segment")
    assert not InboxBatch.objects.exists()


def test_it_counts_the_records_of_every_list_against_the_limit(client, secret, settings):
    half = settings.INGEST_MAX_RECORDS // 2
    batch = make_batch(samples=half + 1)
    batch["events"] = [{"ts": time.time(), "kind": "log", "message": "m"}] * half
    response = post(client, secret, batch)
    assert response.status_code == 413
    assert f"{2 * half + 1} records" in response.json()["errors"][0]["msg"]
    assert not InboxBatch.objects.exists()


def test_it_refuses_a_number_where_the_contract_has_an_integer(client, secret):
    batch = make_batch(samples=1, steps=1)
    batch["steps"][0]["step"] = 100.0
    batch["samples"][0]["gpu"] = "0"
    response = post(client, secret, batch)
    assert response.status_code == 400
    assert {item["loc"] for item in response.json()["errors"]} == {
        "steps[0].step",
        "samples[0].gpu",
    }
