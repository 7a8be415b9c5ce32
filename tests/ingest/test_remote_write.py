"""POST /api/v1/write (Prometheus remote write 1.0) through the live stack: the label rules,
counters as rates, replays and resends stored once, refusals named per series, and bad
bodies answered 4xx, never 500. A real Prometheus writes in test_prometheus_remote_write."""

from __future__ import annotations

import math
import time
from collections import defaultdict

import cramjam
import httpx
import pytest
from django.db import connection

from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch, RemoteSeries
from apps.ingest.prompb import write_request_encode
from apps.runs.models import RunEvent
from launcher.procs import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def post(url: str, secret: str, body: bytes, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/write",
        content=body,
        headers={
            "Authorization": f"Bearer {secret}",
            "Content-Encoding": "snappy",
            "Content-Type": "application/x-protobuf",
            "X-Prometheus-Remote-Write-Version": "0.1.0",
            **headers,
        },
        timeout=30,
    )


def stored(cluster_id: int) -> dict[tuple[str, str, int], list[tuple[float, float]]]:
    """{(node, metric, gpu or -1): [(ts, value), ...]} of the cluster's stored samples."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n.name, m.name, c.gpu, date_part('epoch', c.t0) + u.o / 1000.0, u.v"
            " FROM telemetry_chunk c JOIN telemetry_metric m ON m.id = c.metric_id"
            " JOIN clusters_node n ON n.id = c.node_id, unnest(c.offsets_ms, c.vals) AS u(o, v)"
            " WHERE n.cluster_id = %s ORDER BY 4",
            [cluster_id],
        )
        points = defaultdict(list)
        for node, metric, gpu, ts, value in cursor.fetchall():
            points[(node, metric, gpu)].append((round(ts, 3), value))
    return dict(points)


def drained(token) -> bool:
    return not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists()


INSTANCE = "gpu-17:9100"


def node_series(ms: int, cpu_seconds: float, mem: float) -> list:
    return [
        (
            {
                "__name__": "node_cpu_seconds_total",
                "job": "node",
                "instance": "gpu-17:9100",
                "cpu": "0",
                "mode": "user",
            },
            [(ms, cpu_seconds)],
        ),
        (
            {
                "__name__": "node_memory_MemAvailable_bytes",
                "job": "node",
                "instance": "gpu-17:9100",
            },
            [(ms, mem)],
        ),
    ]


def dcgm_series(ms: int, temp: float, xid: float) -> list:
    identity = {"job": "dcgm", "instance": "10.0.0.17:9400", "Hostname": "gpu-17", "gpu": "3"}
    return [
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", **identity, "UUID": "GPU-abc"}, [(ms, temp)]),
        ({"__name__": "DCGM_FI_DEV_XID_ERRORS", **identity}, [(ms, xid)]),
    ]


def test_series_are_stored_under_their_node_gpu_and_source_counters_as_rates(
    live_stack, agent_token
):
    token, secret = agent_token
    t0 = int(time.time() * 1000) - 60_000
    first = write_request_encode(node_series(t0, 100.0, 5e9) + dcgm_series(t0, 61.0, 0.0))
    answer = post(live_stack.url, secret, first)
    assert answer.status_code == 202, answer.text
    # memory and temperature; the counter has no rate yet, the last XID is 0 (no event)
    assert answer.json()["accepted"] == {"samples": 2, "events": 0}
    second = write_request_encode(
        node_series(t0 + 15_000, 130.0, 4e9) + dcgm_series(t0 + 15_000, 63.0, 79.0)
    )
    answer = post(live_stack.url, secret, second)
    assert answer.status_code == 202, answer.text
    assert answer.json()["accepted"] == {"samples": 3, "events": 1}
    wait_until(lambda: drained(token), 30, "the worker to store the batches")

    points = stored(token.cluster_id)
    s0, s1 = t0 / 1000, (t0 + 15_000) / 1000
    assert points[("gpu-17", "node:node_cpu_seconds_total.cpu_0.mode_user.rate", -1)] == [
        (round(s1, 3), 2.0)
    ]
    assert points[("gpu-17", "node:node_memory_MemAvailable_bytes", -1)] == [
        (round(s0, 3), 5e9),
        (round(s1, 3), 4e9),
    ]
    # dcgm-exporter's GPU temperature is the core metric, under GPU 3 of the node named by
    # its Hostname label (not by the exporter's address)
    assert points[("gpu-17", "gpu.temp_c", 3)] == [(round(s0, 3), 61.0), (round(s1, 3), 63.0)]
    assert set(Node.objects.filter(cluster_id=token.cluster_id).values_list("name", flat=True)) == {
        "gpu-17"
    }
    xid = RunEvent.objects.get(cluster_id=token.cluster_id, kind="xid")
    assert (xid.node.name, xid.gpu, xid.data["code"]) == ("gpu-17", 3, 79)


def test_a_request_sent_again_or_replayed_is_stored_once(live_stack, agent_token):
    token, secret = agent_token
    t0 = int(time.time() * 1000) - 60_000
    first = write_request_encode(node_series(t0, 10.0, 1e9))
    assert post(live_stack.url, secret, first).status_code == 202
    again = post(live_stack.url, secret, first)  # Prometheus's retry: the same bytes
    assert again.status_code == 200, again.text
    assert again.json()["accepted"] == {"samples": 0, "events": 0}
    # After a Prometheus restart its WAL replay resends samples in new requests: the old
    # ones are dropped by their series' watermark, the new one is stored.
    # (as Prometheus 2 writes them: each sample a series entry of its own, labels repeated)
    replay = write_request_encode(
        [
            (labels, [sample])
            for labels, [(_, value)] in node_series(t0, 10.0, 1e9)
            for sample in ((t0 + 5_000, value + 5), (t0, value))
        ]
    )
    answer = post(live_stack.url, secret, replay)
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["replayed"], body["accepted"]["samples"]) == (2, 2)
    wait_until(lambda: drained(token), 30, "the worker to store the batches")
    points = stored(token.cluster_id)
    for series in points.values():
        times = [ts for ts, _ in series]
        assert len(times) == len(set(times)), series
    assert points[("gpu-17", "node:node_cpu_seconds_total.cpu_0.mode_user.rate", -1)] == [
        (round((t0 + 5_000) / 1000, 3), 1.0)
    ]
    assert RemoteSeries.objects.filter(token=token).count() == 2


def test_refusals_are_named_per_series_and_a_bad_body_is_a_4xx(live_stack, agent_token):
    token, secret = agent_token
    now = int(time.time() * 1000)
    body = write_request_encode(
        [
            ({"__name__": "up", "job": "node", "instance": "gpu-1:9100"}, [(now, 1.0)]),
            ({"__name__": "up", "job": "node"}, [(now, 1.0)]),  # no node label
            ({"__name__": "temp", "instance": "gpu-1:9100"}, [(now - 8 * 86_400_000, 1.0)]),
            ({"__name__": "huge", "instance": "gpu-1:9100"}, [(now, 1e200)]),
            ({"__name__": "gone", "instance": "gpu-1:9100"}, [(now, math.nan)]),  # stale
        ]
    )
    answer = post(live_stack.url, secret, body)
    assert answer.status_code == 202, answer.text
    refused = answer.json()["refused"]
    reasons = {e["series"]: e["reason"] for e in refused["examples"]}
    assert refused["series"] == 3 and answer.json()["dropped"] == 1
    assert "no node label" in reasons['up{job="node"}']
    assert "timestamp outside" in reasons['temp{instance="gpu-1:9100"}']
    assert "beyond" in reasons['huge{instance="gpu-1:9100"}']

    only_bad = write_request_encode([({"__name__": "up"}, [(now, 1.0)])])
    answer = post(live_stack.url, secret, only_bad)
    assert answer.status_code == 400 and "no node label" in answer.json()["errors"][0]["msg"]
    for bad, expected in (
        (b"not snappy at all", 400),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), 400),  # not protobuf
        (bytes(cramjam.snappy.compress_raw(b"\x0a\x05ab")), 400),  # a truncated series
    ):
        answer = post(live_stack.url, secret, bad)
        assert answer.status_code == expected, answer.text
        assert answer.json()["errors"][0]["loc"] == "body"
    assert post(live_stack.url, secret, body, **{"Content-Encoding": "gzip"}).status_code == 415
    assert post(live_stack.url, "not-a-token", body).status_code == 401
    wait_until(lambda: drained(token), 30, "the worker to store the batches")
    assert not InboxBatch.objects.filter(token=token, quarantined_at__isnull=False).exists()


def test_a_node_bound_token_writes_its_own_node_only(live_stack, agent_token):
    token, _ = agent_token
    bound, secret = token_issue(cluster_name=token.cluster.name, name="gpu-1", nodes=["gpu-1"])
    now = int(time.time() * 1000)
    body = write_request_encode(
        [
            ({"__name__": "up", "instance": "gpu-1:9100"}, [(now, 1.0)]),
            ({"__name__": "up", "instance": "gpu-2:9100"}, [(now, 1.0)]),
        ]
    )
    answer = post(live_stack.url, secret, body)
    assert answer.status_code == 202, answer.text
    assert answer.json()["accepted"]["samples"] == 1
    assert "acts for other nodes only" in answer.json()["refused"]["examples"][0]["reason"]
    wait_until(lambda: drained(bound), 30, "the worker to store the batch")
    assert {node for node, _, _ in stored(token.cluster_id)} == {"gpu-1"}
