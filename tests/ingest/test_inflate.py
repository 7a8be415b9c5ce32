"""Inflate is bounded wherever a body is decompressed: at the edge (one gzip member, nothing
after it, 400 otherwise) and in the worker (decode_payload: a hard cap on the decoded size)."""

import gzip
import json
import tracemalloc
import zlib

import pytest
from django.conf import settings
from django.test import Client

from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch, PayloadError, decode_payload
from tests.conftest import make_batch

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest"
MIB = 1 << 20


def spaces_member(mib: int) -> bytes:
    """One gzip member of `mib` MiB of spaces, compressed chunk by chunk (≈ 1 KB a MiB)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b" " * MIB
    return b"".join(packer.compress(chunk) for _ in range(mib)) + packer.flush()


def valid_member() -> bytes:
    return gzip.compress(json.dumps(make_batch()).encode())


@pytest.fixture
def secret():
    return token_issue(cluster_name="alpha", name="t")[1]


def post_gzip(secret: str, raw: bytes):
    return Client().post(
        URL,
        raw,
        content_type="application/json",
        HTTP_CONTENT_ENCODING="gzip",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


@pytest.mark.parametrize(
    "after",
    [
        pytest.param(lambda: spaces_member(512), id="a_second_member_of_512_mib"),
        pytest.param(lambda: gzip.compress(b" "), id="a_small_second_member"),
        pytest.param(lambda: b"garbage", id="trailing_garbage"),
        pytest.param(lambda: b"\x00" * 8, id="trailing_zero_padding"),
    ],
)
def test_the_edge_refuses_anything_after_the_gzip_member_with_400(secret, after):
    response = post_gzip(secret, valid_member() + after())
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "body"
    assert "one gzip member" in response.json()["errors"][0]["msg"]
    assert not InboxBatch.objects.exists()


def test_the_edge_still_accepts_a_single_member(secret):
    assert post_gzip(secret, valid_member()).status_code == 202


def test_the_worker_passes_a_single_member_through():
    body = json.dumps(make_batch()).encode()
    assert decode_payload(gzip.compress(body), "gzip") == body
    assert decode_payload(body, "identity") == body


def test_the_worker_stops_inflating_at_the_decoded_limit():
    bomb = spaces_member(64)  # a single member: nothing but its size is wrong
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match="over"):
            decode_payload(bomb, "gzip")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * settings.INGEST_MAX_BODY_BYTES + MIB


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (lambda: valid_member() + spaces_member(512), "after the gzip member"),
        (lambda: valid_member() + b"garbage", "after the gzip member"),
        (lambda: valid_member()[:-6], "truncated"),
        (lambda: b"\x1f\x8b\x08\x00garbage", "not a valid gzip stream"),
    ],
    ids=["second_member", "trailing_garbage", "truncated", "corrupt"],
)
def test_the_worker_refuses_what_the_edge_refuses(payload, message):
    with pytest.raises(PayloadError, match=message):
        decode_payload(payload(), "gzip")


def test_the_worker_refuses_a_plain_body_over_the_limit():
    with pytest.raises(PayloadError):
        decode_payload(b" " * (settings.INGEST_MAX_BODY_BYTES + 1), "identity")


def test_an_inbox_rows_body_is_bounded_too():
    row = InboxBatch(payload=valid_member() + spaces_member(16), payload_encoding="gzip")
    with pytest.raises(PayloadError):
        row.body  # noqa: B018 (the property is the thing under test)
