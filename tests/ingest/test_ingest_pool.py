"""The ingest pool (OPSBOARD_ROLE=ingest, as the launcher and compose start it) takes agents'
batches as the main server does, and serves nothing else."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest

from apps.ingest.models import InboxBatch
from apps.ingest.prompb import write_request_encode
from launcher.commands import server_commands
from launcher.procs import free_port, http_ok, wait_until
from tests.conftest import make_batch, stack_env
from tests.stackproc import LOG_DIR, Process


@pytest.fixture
def ingest_pool(live_stack, agent_token):
    """The launcher's ingest pool on the test database, and an agent's headers for it."""
    port = free_port()
    command = server_commands(
        host="127.0.0.1", port=free_port(), ws_port=free_port(), web_workers=1,
        worker_concurrency=1, queue="unused", beat_schedule=LOG_DIR / "unused",
        ingest_port=port, ingest_workers=1,
    )["ingest"]  # fmt: skip
    assert command[-2:] == ["--env", "OPSBOARD_ROLE=ingest"]
    pool = Process("ingest-pool", command, {**live_stack.env, **stack_env()}).start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/healthz"), 60, "the ingest pool")
        with httpx.Client(base_url=url, timeout=30) as client:
            yield client, {"Authorization": f"Bearer {agent_token[1]}"}
    finally:
        pool.stop()


def test_it_accepts_batches_plain_and_gzip_and_refuses_bad_ones_by_field(ingest_pool):
    client, auth = ingest_pool
    plain, packed = make_batch(), make_batch()
    response = client.post("/api/v1/ingest", json=plain, headers=auth)
    assert response.status_code == 202, response.text
    assert response.json()["accepted"]["samples"] == len(plain["samples"])
    assert int(response.headers["Content-Length"]) == len(response.content)
    response = client.post(
        "/api/v1/ingest",
        content=gzip.compress(json.dumps(packed).encode()),
        headers={**auth, "Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert response.status_code == 202, response.text
    assert (
        InboxBatch.objects.filter(batch_id__in=[plain["batch_id"], packed["batch_id"]]).count() == 2
    )

    bad = {**make_batch(), "node": "x" * 300}
    response = client.post("/api/v1/ingest", json=bad, headers=auth)
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "node"
    assert client.post("/api/v1/ingest", json=make_batch()).status_code == 401
    response = client.post(
        "/api/v1/ingest", content=b"{}", headers={**auth, "Content-Encoding": "br"}
    )
    assert response.status_code == 415


def test_it_serves_nothing_but_the_ingest_endpoint_and_healthz(ingest_pool):
    client, auth = ingest_pool
    elsewhere = [("GET", "/"), ("GET", "/admin/"), ("POST", "/accounts/login/"),
                 ("GET", "/api/v1/series"), ("GET", "/api/v1/ingest/"),
                 ("GET", "/static/x.css")]  # fmt: skip
    for method, path in elsewhere:
        response = client.request(method, path, headers=auth)
        assert response.status_code == 404, (path, response.status_code)
        assert response.json()["errors"][0]["loc"] == "path"
    assert client.get("/healthz").text == "ok"
    # the probes and the scrape answer on every pool (apps.metrics.middleware), on its address
    pod = {"Host": "10.1.2.3:8002"}
    assert client.get("/readyz", headers=pod).json()["ready"] is True
    assert client.get("/metrics", headers=pod).status_code == 401  # the scrape token, not theirs
    scrape = {**pod, "Authorization": "Bearer test-scrape-token"}  # tests/conftest.stack_env
    assert "opsboard_inbox_backlog_batches" in client.get("/metrics", headers=scrape).text


def test_it_takes_a_prometheus_remote_write(ingest_pool, agent_token):
    client, auth = ingest_pool
    now = int(time.time() * 1000)
    body = write_request_encode([({"__name__": "up", "instance": "gpu-1:9100"}, [(now, 1.0)])])
    headers = {**auth, "Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}
    response = client.post("/api/v1/write", content=body, headers=headers)
    assert response.status_code == 202, response.text
    assert response.json()["accepted"]["samples"] == 1
    assert client.post("/api/v1/write", content=b"nonsense", headers=headers).status_code == 400
    token = agent_token[0]
    wait_until(
        lambda: InboxBatch.objects.filter(token=token, processed_at__isnull=False).exists(),
        30,
        "the remote-written batch stored",
    )
