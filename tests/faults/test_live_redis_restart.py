"""Fault 7: 200 live-page websocket clients while Redis restarts. Node health changes while
Redis is down and after it is back; within 10 s of Redis' return every client shows what
the database holds, node for node."""

import os
import random
import statistics
import time
import uuid

import pytest
from django.contrib.auth import get_user_model

from apps.access.models import ClusterRole
from apps.clusters.services import token_issue
from apps.live.selectors import node_health_list
from launcher.procs import wait_until
from tests.conftest import AgentClient, make_batch
from tests.faults.ingest import unprocessed
from tests.faults.live_clients import LiveClients
from tests.faults.redis_server import stack_on_private_redis
from tests.live.test_session_lifetime import PASSWORD
from tests.live.test_socket_ends import log_in

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

CLIENTS, USERS, NODES = 200, 10, 8
CONVERGE_S = 10.0
DOWN_S = float(os.environ.get("FAULTS_WS_REDIS_DOWN_S", "20"))


@pytest.fixture
def ws_stack(live_stack, tmp_path, live_db):
    """A stack of its own on a private Redis (tests.faults.redis_server)."""
    with stack_on_private_redis(live_stack, tmp_path / "redis", name="faults-ws") as pair:
        yield pair


def db_view(cluster_id: int) -> dict[str, dict]:
    return {node["node"]: node for node in node_health_list(cluster_id=cluster_id)}


def ingest_round(agent: AgentClient, label: str) -> None:
    """One small batch from every node: each node's health and last_seen change."""
    for index in range(NODES):
        batch = make_batch(batch_id=f"{label}-{index}", node=f"node-{index}", samples=16)
        response = agent.post(batch)
        assert response.status_code == 202, response.text


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def test_every_live_client_shows_the_database_within_10_s_of_redis_return(ws_stack):
    stack, server = ws_stack
    token, secret = token_issue(cluster_name=f"faults-ws-{uuid.uuid4().hex[:6]}")
    cluster = token.cluster
    agent = AgentClient(stack.url, secret)
    ingest_round(agent, "before")
    wait_until(lambda: unprocessed(token) == 0 and len(db_view(cluster.pk)) == NODES, 60, "nodes")
    cookies = []
    for index in range(USERS):
        user = get_user_model().objects.create_user(f"ws-{index}", password=PASSWORD)
        ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
        cookies.append(f"sessionid={log_in(stack, user.username).cookies['sessionid']}")
    seed = random.randrange(1 << 30)
    url = f"ws://127.0.0.1:{stack.ws_port}/ws/clusters/{cluster.name}/"
    clients = LiveClients(url, cookies, CLIENTS, seed).start()
    try:
        expected = db_view(cluster.pk)
        wait_until(
            lambda: all(c.view == expected for c in clients.clients), 60, "every client's snapshot"
        )
        server.stop()
        down_at = time.monotonic()
        ingest_round(agent, "down")  # accepted into the inbox; stored once Redis is back
        time.sleep(DOWN_S)
        server.start()
        back = time.monotonic()
        ingest_round(agent, "back")
        converged = settle(clients, token, cluster.pk, back)
    finally:
        clients.stop()
        agent.http.close()
    times = [converged[id(c)] for c in clients.clients]
    print(
        f"\nfaults: {CLIENTS} live clients, Redis down {back - down_at:.0f} s (seed {seed}):"
        f" converged after its return p50 {statistics.median(times):.1f} s,"
        f" p99 {percentile(times, 0.99):.1f} s, max {max(times):.1f} s;"
        f" connects {sum(c.connects for c in clients.clients)},"
        f" closes {sum(c.closes for c in clients.clients)}"
    )
    late = [c for c in clients.clients if converged[id(c)] > CONVERGE_S]
    assert not late, (
        f"{len(late)} clients late; one: {differences(late[0].view, db_view(cluster.pk))}"
    )


def differences(view: dict, truth: dict) -> list:
    """(node, the client's, the database's) for each node where they differ."""
    return [
        (n, view.get(n), truth.get(n)) for n in sorted(view | truth) if view.get(n) != truth.get(n)
    ]


def settle(clients: LiveClients, token, cluster_id: int, back: float) -> dict[int, float]:
    """Compare every client with the database every 0.2 s until all agree and the inbox is
    empty (or 2 × CONVERGE_S passed). A client's time: since `back`, of the first sample of
    its last run of agreement (0 when it never disagreed after `back`)."""
    since: dict[int, float | None] = {id(c): 0.0 for c in clients.clients}
    deadline = back + 2 * CONVERGE_S
    while True:
        now = time.monotonic()
        drained = unprocessed(token) == 0
        truth = db_view(cluster_id)
        for client in clients.clients:
            agrees = client.view == truth
            if not agrees:
                since[id(client)] = None
            elif since[id(client)] is None:
                since[id(client)] = now - back
        if (drained and all(t is not None for t in since.values())) or now > deadline:
            return {key: (t if t is not None else float("inf")) for key, t in since.items()}
        time.sleep(0.2)
