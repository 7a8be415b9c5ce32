"""Through the real stack: ASGI server → inbox → Celery worker process → Postgres → websocket."""

import time

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.test import Client

from apps.clusters.models import Node
from apps.ingest.models import InboxBatch
from apps.runs.models import RunEvent, StepReport
from apps.telemetry.models import NodeHealth
from apps.telemetry.selectors import chunk_storage
from launcher.procs import wait_until
from tests.conftest import make_batch
from tests.websockets import cluster_socket

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def all_processed(token) -> bool:
    return not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists()


def test_it_stores_a_posted_batch_exactly_as_sent(agent, agent_token):
    now = time.time()
    batch = make_batch(
        node="node-07",
        samples=0,
        steps=2,
        run="llama",
        ts=now,
        node_info={"gpus": 8, "gpu_model": "H100"},
    )
    batch["samples"] = [
        {"ts": now - 1, "metric": "gpu.util", "gpu": 0, "value": 97.5},
        {"ts": now, "metric": "gpu.util", "gpu": 0, "value": 88.0},
        {"ts": now, "metric": "host.cpu_util", "value": 12.5},
    ]
    batch["steps"][0].update(
        grad_checksum="9f2c",
        param_checksum="41aa",
        shard="tp0",
        canary={"norm": 3.04, "proj": [0.125, -0.872]},
        loss=2.31,
    )
    batch["events"] = [
        {
            "ts": now,
            "kind": "checkpoint",
            "step": 100,
            "tier": "durable",
            "state": "completed",
            "path": "/ckpt/100",
            "bytes": 1400,
        }
    ]
    assert agent.post(batch).status_code == 202
    wait_until(lambda: all_processed(agent_token[0]), 30, "the worker to store the batch")

    node = Node.objects.get(name="node-07", cluster=agent_token[0].cluster)
    assert node.info == {"gpus": 8, "gpu_model": "H100"} and node.last_seen is not None
    series = agent.get(
        "/api/v1/series", node="node-07", metric="gpu.util", gpu=0, start=now - 10, end=now + 1
    ).json()
    assert series["points"] == [
        [pytest.approx(now - 1, abs=1e-3), 97.5],
        [pytest.approx(now, abs=1e-3), 88.0],
    ]
    host = agent.get(
        "/api/v1/series", node="node-07", metric="host.cpu_util", start=now - 10, end=now + 1
    ).json()
    assert [point[1] for point in host["points"]] == [12.5]

    rank0 = StepReport.objects.get(node=node, rank=0)
    assert (rank0.grad_checksum, rank0.param_checksum, rank0.shard) == ("9f2c", "41aa", "tp0")
    assert rank0.canary_norm == 3.04 and rank0.canary_proj == [0.125, -0.872]
    assert StepReport.objects.filter(node=node).count() == 2
    event = RunEvent.objects.get(node=node)
    assert (event.kind, event.step, event.data["tier"], event.data["bytes"]) == (
        "checkpoint",
        100,
        "durable",
        1400,
    )
    health = {row.gpu: row.values for row in NodeHealth.objects.filter(node=node)}
    assert health == {0: {"gpu.util": 88.0}, -1: {"host.cpu_util": 12.5}}

    summary = agent.get("/api/v1/runs/llama").json()
    assert summary["ranks"] == 2 and summary["last_step"] == 100
    assert summary["checkpoint"]["durable"]["step"] == 100
    assert summary["nodes"] == ["node-07"]


def test_it_stores_a_batch_posted_three_times_once(agent, agent_token):
    batch = make_batch(samples=50, steps=4)
    answers = [agent.post(batch).status_code for _ in range(3)]
    assert answers == [202, 200, 200]
    wait_until(lambda: all_processed(agent_token[0]), 30, "the worker")
    assert InboxBatch.objects.filter(token=agent_token[0]).count() == 1
    assert chunk_storage()["samples"] == 50
    assert StepReport.objects.count() == 4


def test_it_stores_20_concurrent_identical_posts_once(agent, agent_token):
    from concurrent.futures import ThreadPoolExecutor

    batch = make_batch(samples=100, steps=8)
    with ThreadPoolExecutor(20) as pool:
        codes = sorted(pool.map(lambda _: agent.post(batch).status_code, range(20)))
    assert codes == [200] * 19 + [202]
    wait_until(lambda: all_processed(agent_token[0]), 30, "the worker")
    assert InboxBatch.objects.filter(token=agent_token[0]).count() == 1
    assert chunk_storage()["samples"] == 100
    assert StepReport.objects.count() == 8


def test_a_token_of_another_cluster_cannot_write_a_node_of_this_one(agent, agent_token, live_stack):
    from apps.clusters.services import token_issue
    from tests.conftest import AgentClient

    assert agent.post(make_batch(node="shared-name", samples=3)).status_code == 202
    _, other_secret = token_issue(cluster_name="other-cluster")
    intruder = AgentClient(live_stack.url, other_secret)
    assert (
        intruder.post(make_batch(node="shared-name", samples=5, node_info={"gpus": 16})).status_code
        == 202
    )
    wait_until(
        lambda: not InboxBatch.objects.filter(processed_at__isnull=True).exists(), 30, "the worker"
    )
    ours = Node.objects.get(cluster=agent_token[0].cluster, name="shared-name")
    assert ours.info == {}  # untouched by the other cluster's batch
    theirs = Node.objects.get(cluster__name="other-cluster", name="shared-name")
    assert theirs.pk != ours.pk and theirs.info == {"gpus": 16}
    count = agent.get("/api/v1/series", node="shared-name", metric="gpu.util", gpu=0).json()[
        "points"
    ]
    assert len(count) == 1  # samples 0 of our 3-sample batch on gpu 0; not theirs


def test_a_posted_batch_reaches_a_websocket_client_as_a_numbered_delta(agent, agent_token):
    # a superuser sees the cluster the agent's token created (apps.access scoping)
    user = get_user_model().objects.create_superuser("op", password="pw-12345-long")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    cluster = agent_token[0].cluster.name
    assert agent.post(make_batch(node="node-a", samples=2)).status_code == 202
    wait_until(lambda: all_processed(agent_token[0]), 30, "the first batch")

    async def scenario():
        communicator, snapshot = await cluster_socket(cluster, cookie)
        assert snapshot["type"] == "snapshot"
        assert [node["node"] for node in snapshot["nodes"]] == ["node-a"]
        batch = make_batch(node="node-b", samples=0)
        batch["samples"] = [{"ts": time.time(), "metric": "gpu.temp_c", "gpu": 3, "value": 71.5}]
        assert agent.post(batch).status_code == 202
        # Deltas numbered after the snapshot until the one carrying node-b (periodic work may
        # re-send node-a meanwhile: a delta of its own, numbered in order). Bounded.
        seqs, delta = [], {"nodes": []}
        for _ in range(10):
            delta = await communicator.receive_json_from(timeout=15)
            if delta["seq"] <= snapshot["seq"]:  # already in the snapshot: a client skips it
                continue
            seqs.append(delta["seq"])
            if any(node["node"] == "node-b" for node in delta["nodes"]):
                break
        await communicator.disconnect()
        return snapshot, delta, seqs

    snapshot, delta, seqs = async_to_sync(scenario)()
    assert delta["type"] == "delta" and delta["seq"] > snapshot["seq"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # numbered, in order
    [node_b] = [node for node in delta["nodes"] if node["node"] == "node-b"]
    assert node_b["health"]["3"]["gpu.temp_c"] == 71.5
