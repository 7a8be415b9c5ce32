"""One test per rule of the contract's POST /api/v1/ingest (in-process; nothing enqueued)."""

import gzip
import json
import time

import pytest
from django.test import Client

from apps.clusters.services import token_issue, token_revoke
from apps.ingest.models import InboxBatch
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest"


@pytest.fixture
def token():
    return token_issue(cluster_name="alpha", name="t")


def post(client: Client, secret: str | None, body, *, gzip_body=False, **headers):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    if gzip_body:
        raw = gzip.compress(raw)
        headers["HTTP_CONTENT_ENCODING"] = "gzip"
    if secret is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {secret}"
    return client.post(URL, raw, content_type="application/json", **headers)


def errors(response) -> dict[str, str]:
    return {item["loc"]: item["msg"] for item in response.json()["errors"]}


def test_it_accepts_a_valid_batch_with_202_and_counts(client, token):
    batch = make_batch(
        samples=5,
        steps=2,
        events=[
            {
                "ts": time.time(),
                "kind": "checkpoint",
                "step": 100,
                "tier": "local",
                "state": "completed",
            }
        ],
    )
    response = post(client, token[1], batch)
    assert response.status_code == 202
    assert response.json() == {
        "batch_id": batch["batch_id"],
        "accepted": {"samples": 5, "steps": 2, "events": 1},
    }
    stored = InboxBatch.objects.get()
    assert stored.batch_id == batch["batch_id"] and stored.processed_at is None
    assert json.loads(stored.body) == batch


def test_it_rejects_a_missing_token_with_401(client):
    response = post(client, None, make_batch())
    assert response.status_code == 401
    assert response.json()["errors"][0]["loc"] == "Authorization"
    assert not InboxBatch.objects.exists()


def test_it_rejects_a_wrong_token_with_401(client, token):
    response = post(client, token[1] + "x", make_batch())
    assert response.status_code == 401
    assert not InboxBatch.objects.exists()


def test_it_rejects_a_revoked_token_with_401(client, token):
    token_revoke(token=token[0])
    response = post(client, token[1], make_batch())
    assert response.status_code == 401
    assert not InboxBatch.objects.exists()


def test_it_names_every_bad_field_and_stores_nothing(client, token):
    batch = make_batch(samples=5)
    batch["samples"][3]["value"] = "NaN"
    batch["samples"][1]["metric"] = "9starts-with-digit"
    del batch["node"]
    response = post(client, token[1], batch)
    assert response.status_code == 400
    found = errors(response)
    assert found["samples[3].value"] == "must be a finite number"
    assert "samples[1].metric" in found
    assert "node" in found
    assert not InboxBatch.objects.exists()


@pytest.mark.parametrize("value", ["Infinity", "-Infinity"])
def test_it_rejects_infinite_values(client, token, value):
    raw = json.dumps(make_batch(samples=1)).replace('"value": 0.0', f'"value": {value}')
    response = post(client, token[1], raw.encode())
    assert response.status_code == 400
    assert "samples[0].value" in errors(response)


def test_it_rejects_a_metric_name_over_128_characters(client, token):
    batch = make_batch(samples=1)
    batch["samples"][0]["metric"] = "m" * 129
    response = post(client, token[1], batch)
    assert response.status_code == 400
    assert "samples[0].metric" in errors(response)


def test_it_requires_run_when_steps_are_sent(client, token):
    batch = make_batch(samples=0, steps=1)
    del batch["run"]
    response = post(client, token[1], batch)
    assert response.status_code == 400
    assert errors(response) == {"run": "required when steps is not empty"}


def test_it_rejects_a_checkpoint_event_without_its_fields(client, token):
    batch = make_batch(events=[{"ts": time.time(), "kind": "checkpoint", "step": 1}])
    response = post(client, token[1], batch)
    assert response.status_code == 400
    assert "needs tier, state" in errors(response)["events[0]"]


def test_it_rejects_an_unknown_event_kind(client, token):
    batch = make_batch(events=[{"ts": time.time(), "kind": "party"}])
    assert post(client, token[1], batch).status_code == 400


def test_it_rejects_a_batch_id_over_128_characters(client, token):
    response = post(client, token[1], make_batch(batch_id="b" * 129))
    assert response.status_code == 400
    assert "batch_id" in errors(response)


def test_it_rejects_invalid_json(client, token):
    response = post(client, token[1], b'{"batch_id": ')
    assert response.status_code == 400
    assert not InboxBatch.objects.exists()


@pytest.mark.parametrize(
    ("offset", "reason"),
    [
        (6 * 60, "more than 5 minutes in the future"),
        (-8 * 24 * 3600, "more than 7 days in the past"),
    ],
)
def test_it_rejects_ts_outside_the_window(client, token, offset, reason):
    batch = make_batch(samples=2)
    batch["samples"][1]["ts"] = time.time() + offset
    response = post(client, token[1], batch)
    assert response.status_code == 400
    assert errors(response) == {"samples[1].ts": reason}
    assert not InboxBatch.objects.exists()


def test_it_accepts_ts_just_inside_the_window(client, token):
    batch = make_batch(samples=2)
    batch["samples"][0]["ts"] = time.time() + 4 * 60
    batch["samples"][1]["ts"] = time.time() - 6.9 * 24 * 3600
    assert post(client, token[1], batch).status_code == 202


def test_it_answers_a_repeated_batch_id_with_200_duplicate(client, token):
    batch = make_batch()
    assert post(client, token[1], batch).status_code == 202
    response = post(client, token[1], batch)
    assert response.status_code == 200
    assert response.json() == {"batch_id": batch["batch_id"], "duplicate": True}
    assert InboxBatch.objects.count() == 1


def test_it_scopes_batch_ids_to_the_token(client, token):
    other = token_issue(cluster_name="alpha", name="other")
    batch = make_batch()
    assert post(client, token[1], batch).status_code == 202
    assert post(client, other[1], batch).status_code == 202
    assert InboxBatch.objects.count() == 2


def test_it_accepts_a_gzip_body(client, token):
    batch = make_batch(samples=100)
    response = post(client, token[1], batch, gzip_body=True)
    assert response.status_code == 202
    stored = InboxBatch.objects.get()
    assert stored.payload_encoding == "gzip"  # kept as it came
    assert json.loads(stored.body) == batch


def test_it_rejects_a_corrupt_gzip_body(client, token):
    response = post(client, token[1], b"\x1f\x8b\x08\x00garbage", HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 400
    assert errors(response)["body"].startswith("not a valid gzip stream")


def test_it_rejects_a_body_over_8_mib_with_413(client, token):
    body = json.dumps(make_batch(node_info={"pad": "x" * (8 * 1024 * 1024)})).encode()
    response = post(client, token[1], body)
    assert response.status_code == 413
    assert not InboxBatch.objects.exists()


def test_it_rejects_a_gzip_body_that_decodes_over_8_mib_with_413(client, token):
    body = json.dumps(make_batch(node_info={"pad": " " * (9 * 1024 * 1024)})).encode()
    compressed = gzip.compress(body)
    assert len(compressed) < 100_000  # small on the wire, large decoded
    response = post(client, token[1], compressed, HTTP_CONTENT_ENCODING="gzip")
    assert response.status_code == 413
    assert not InboxBatch.objects.exists()


def test_it_rejects_over_20000_records_with_413(client, token):
    batch = make_batch(samples=20_001)
    response = post(client, token[1], batch, gzip_body=True)
    assert response.status_code == 413
    assert "20001 records" in response.json()["errors"][0]["msg"]
    assert not InboxBatch.objects.exists()


def test_it_accepts_exactly_20000_records(client, token):
    response = post(client, token[1], make_batch(samples=20_000), gzip_body=True)
    assert response.status_code == 202


def test_the_openapi_schema_describes_ingest(client):
    schema = client.get("/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/ingest"]["post"]
    assert {"202", "200", "400", "401", "413"} <= set(operation["responses"])
    assert "Sample" in json.dumps(schema["components"])


def test_the_schema_says_what_a_shard_is_and_how_the_reporter_derives_it(client):
    schema = client.get("/api/v1/openapi.json").json()
    shard = schema["components"]["schemas"]["Step"]["properties"]["shard"]
    text = next(option for option in shard["anyOf"] if option.get("type") == "string")
    assert text["maxLength"] == 128
    assert "only ranks reporting the same shard are compared" in shard["description"]
    assert "fsdp2-shard=1of2-" in shard["description"]
