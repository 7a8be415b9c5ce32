"""The sender's retry discipline against stand-in HTTP servers on loopback (a stand-in for
an overloaded or misbehaving server; delivery to the real server is in
test_live_delivery.py)."""

import json
import random
import time

import pytest

from opsboard_agent.sender import Sender, backoff_delay, parse_retry_after
from opsboard_agent.spool import Spool
from tests.agent.conftest import closed_port_url

ACCEPTED = (202, {"Content-Type": "application/json"}, b'{"batch_id": "x", "accepted": {}}')


def spool_with(tmp_path, count=1):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(count):
        spool.put(f"b{i}", json.dumps({"batch_id": f"b{i}", "node": "n"}).encode())
    return spool


def drain(sender, seconds=15):
    sender.start()
    deadline = time.monotonic() + seconds
    while len(sender.spool) and time.monotonic() < deadline:
        time.sleep(0.05)
    sender.stop(0)


def test_it_honours_retry_after_on_503(tmp_path, loopback):
    answers = iter([(503, {"Retry-After": "2"}, b'{"errors": []}'), ACCEPTED])
    loopback.routes["/api/v1/ingest"] = lambda request: next(answers)
    sender = Sender(spool_with(tmp_path), server=loopback.url, token="secret")
    drain(sender)
    first, second = loopback.requests
    assert second.at - first.at >= 2.0
    assert first.body == second.body  # the same body again
    assert first.headers["Authorization"] == "Bearer secret"
    assert len(sender.spool) == 0 and sender.stats.delivered == 1


def test_it_honours_retry_after_on_429_while_new_batches_arrive(tmp_path, loopback):
    answers = iter([(429, {"Retry-After": "1"}, b"{}"), ACCEPTED, ACCEPTED])
    loopback.routes["/api/v1/ingest"] = lambda request: next(answers)
    spool = spool_with(tmp_path)
    sender = Sender(spool, server=loopback.url, token="t").start()
    time.sleep(0.2)
    spool.put("late", b'{"batch_id": "late"}')
    sender.notify()  # a new batch must not cut the Retry-After wait short
    deadline = time.monotonic() + 10
    while len(spool) and time.monotonic() < deadline:
        time.sleep(0.05)
    sender.stop(0)
    assert loopback.requests[1].at - loopback.requests[0].at >= 1.0
    assert sender.stats.delivered == 2


@pytest.mark.parametrize("status", [400, 401, 413])
def test_it_never_retries_a_rejected_batch(tmp_path, loopback, status):
    loopback.routes["/api/v1/ingest"] = lambda request: (status, {}, b'{"errors": []}')
    sender = Sender(spool_with(tmp_path, 2), server=loopback.url, token="t")
    assert sender.send_once() == 0.0
    assert sender.send_once() == 0.0
    assert sender.send_once() is None
    assert len(loopback.requests) == 2 and sender.stats.rejected == 2


def test_a_duplicate_answer_counts_as_delivered(tmp_path, loopback):
    loopback.routes["/api/v1/ingest"] = lambda request: (
        200,
        {},
        b'{"batch_id": "b0", "duplicate": true}',
    )
    sender = Sender(spool_with(tmp_path), server=loopback.url, token="t")
    assert sender.send_once() == 0.0
    assert len(sender.spool) == 0 and sender.stats.duplicates == 1


def test_server_errors_and_refused_connections_back_off_and_keep_the_batch(tmp_path, loopback):
    loopback.routes["/api/v1/ingest"] = lambda request: (500, {}, b"boom")
    sender = Sender(
        spool_with(tmp_path),
        server=loopback.url,
        token="t",
        backoff_base=1.0,
        backoff_cap=8.0,
        rng=lambda: 1.0,
    )
    assert [sender.send_once() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    sender.server = closed_port_url()
    assert sender.send_once() == 8.0
    assert len(sender.spool) == 1 and sender.stats.retries == 6
    sender.server = loopback.url
    loopback.routes["/api/v1/ingest"] = lambda request: ACCEPTED
    assert sender.send_once() == 0.0 and len(sender.spool) == 0


def test_backoff_is_full_jitter_below_an_exponential_ceiling():
    rng = random.Random(7).random
    for failures in range(1, 12):
        ceiling = min(60.0, 0.5 * 2 ** (failures - 1))
        delays = [backoff_delay(failures, base=0.5, cap=60.0, rng=rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8 and min(delays) < ceiling * 0.2


def test_it_reads_both_forms_of_retry_after():
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:05 GMT", now=1445412480.0) == 5.0
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


def test_large_bodies_are_gzipped(tmp_path, loopback):
    import gzip

    loopback.routes["/api/v1/ingest"] = lambda request: ACCEPTED
    spool = Spool(tmp_path, max_bytes=1 << 20)
    big = json.dumps({"batch_id": "big", "pad": "y" * 10000}).encode()
    spool.put("big", big)
    Sender(spool, server=loopback.url + "/", token="t").send_once()
    request = loopback.requests[0]
    assert request.path == "/api/v1/ingest"
    assert request.headers["Content-Encoding"] == "gzip" and gzip.decompress(request.body) == big
