"""The live feed of a fleet over a real websocket (uvicorn): however many node deltas the
cluster's group carries, a socket sends at most one message per LIVE_SOCKET_FLUSH_S (4 a
second), each node's newest state arrives (nothing lost), and a reconnect, a client's resync
or a delta lost on the way is answered with one snapshot.

The deltas go to the group numbered as the publisher numbers them (apps.live.services), each
after its states are stored: ten nodes a message, or one (each node's change broadcast on its
own, as ingest once did: more than a socket's channel holds, so the group drops some and the
socket makes them good with a snapshot)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.utils import timezone
from websockets.sync.client import ClientConnection, connect

from apps.clusters.models import Cluster, Node
from apps.core.redis import redis_client
from apps.live.groups import cluster_group, cluster_seq_key
from apps.live.selectors import node_health_list
from apps.telemetry.models import NodeHealth
from tests.conftest import stack_env
from tests.live.test_socket_ends import log_in, user_with
from tests.stackproc import Stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
NODES, VERSIONS = 500, 4  # 2,000 node deltas: every node changes 4 times
ROUNDS, ROUND_S = 20, 0.05  # sent in 20 rounds of 100, one every 50 ms: one second
FLUSH_S = 0.25  # LIVE_SOCKET_FLUSH_S's default: the bound is 4 messages a second


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker):
    """gunicorn and uvicorn on the test database; no publisher: the test is the sender."""
    with django_db_blocker.unblock():
        started = Stack(stack_env(), name="coalesce", publisher=False, workers=False).start()
    yield started
    started.stop()


@pytest.fixture
def fleet(live_db) -> Cluster:
    cluster = Cluster.objects.create(name="fleet")
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"node-{i:04d}", last_seen=now, info={"gpus": 1})
        for i in range(NODES)
    )
    NodeHealth.objects.bulk_create(
        NodeHealth(node=node, gpu=0, ts=now, values={"gpu.util": -1.0}) for node in nodes
    )
    user_with("vera", cluster)
    return cluster


def util(version: int, index: int) -> float:
    return float(version * 1000 + index)


def store(ids: list[int], version: int) -> list[dict]:
    """Store `version` of these nodes' GPU 0 (what ingest commits), and read their states."""
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE telemetry_nodehealth h
               SET values = jsonb_build_object('gpu.util', %s * 1000.0 + substr(n.name, 6)::int)
               FROM clusters_node n WHERE n.id = h.node_id AND h.gpu = 0 AND n.id = ANY(%s)""",
            [version, ids],
        )
    return node_health_list(node_ids=ids)


async def send_node_deltas(
    cluster_id: int, rounds: list[dict[int, list[int]]], per_message: int = 1
) -> float:
    """A round every ROUND_S: its versions ({version: node ids}) stored, then the states in
    numbered deltas of `per_message` nodes to the group. Returns when it started (monotonic)."""
    layer, client = get_channel_layer(), redis_client()
    started = time.monotonic()
    for number, versions in enumerate(rounds):
        await asyncio.sleep(max(0.0, started + number * ROUND_S - time.monotonic()))
        states = [
            state
            for version, ids in versions.items()
            for state in await sync_to_async(store)(ids, version)
        ]
        messages = [states[at : at + per_message] for at in range(0, len(states), per_message)]
        last = client.incrby(cluster_seq_key(cluster_id), len(messages))
        for seq, nodes in enumerate(messages, start=last - len(messages) + 1):
            await layer.group_send(
                cluster_group(cluster_id), {"type": "live.delta", "seq": seq, "nodes": nodes}
            )
    return started


class Listener:
    """A socket's messages, each with the monotonic time it arrived, read on a thread; and
    the node states the messages leave (a snapshot replaces them, a delta updates them)."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket, self.messages = socket, []
        self.view: dict[str, dict] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                text = self.socket.recv(timeout=0.2)
            except TimeoutError:
                continue
            message = json.loads(text)
            if message["type"] == "snapshot":
                self.view = {node["node"]: node for node in message["nodes"]}
            elif message["type"] == "delta":
                self.view = {**self.view, **{node["node"]: node for node in message["nodes"]}}
            self.messages.append((time.monotonic(), message))

    def utils(self) -> dict[str, float]:
        return {name: node["health"]["0"]["gpu.util"] for name, node in self.view.items()}

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)


@contextmanager
def listening(stack: Stack, cookie: str) -> Iterator[Listener]:
    with connect(
        f"ws://127.0.0.1:{stack.ws_port}/ws/clusters/fleet/",
        additional_headers={"Cookie": f"sessionid={cookie}", "Origin": "http://127.0.0.1"},
        open_timeout=10,
        max_size=None,
    ) as socket:
        listener = Listener(socket)
        try:
            wait_for(lambda: listener.messages, 10, "the snapshot")
            yield listener
        finally:
            listener.close()


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {seconds} s"
        time.sleep(0.05)


def final_utils() -> dict[str, float]:
    return {f"node-{i:04d}": util(VERSIONS - 1, i) for i in range(NODES)}


@pytest.mark.parametrize("per_message", [10, 1], ids=["ten-a-message", "one-a-message"])
def test_it_sends_2000_node_deltas_in_a_second_as_at_most_4_messages_and_loses_none(
    stack, fleet, per_message
):
    assert settings.LIVE_SOCKET_FLUSH_S == FLUSH_S  # the stack's too: neither environment sets it
    ids = list(Node.objects.filter(cluster=fleet).order_by("name").values_list("id", flat=True))
    browser = log_in(stack, "vera")
    per_round = NODES * VERSIONS // ROUNDS
    deltas = [(k % NODES, k // NODES) for k in range(NODES * VERSIONS)]  # (node, version)
    with listening(stack, browser.cookies["sessionid"]) as listener:
        assert [m["type"] for _, m in listener.messages] == ["snapshot"]
        assert set(listener.utils().values()) == {-1.0}
        rounds: list[dict[int, list[int]]] = []
        for start in range(0, len(deltas), per_round):
            rounds.append({})
            for index, version in deltas[start : start + per_round]:
                rounds[-1].setdefault(version, []).append(ids[index])
        assert sum(len(i) for r in rounds for i in r.values()) == 2000
        started = async_to_sync(send_node_deltas)(fleet.id, rounds, per_message)
        sent_in = time.monotonic() - started
        wait_for(lambda: listener.utils() == final_utils(), 15, "newest state of every node")
        time.sleep(2 * FLUSH_S)  # nothing more comes after
        received = [(at, m) for at, m in listener.messages[1:]]

    # Each flush starts at least FLUSH_S after the one before and after the first delta
    # was sent, and a message arrives after its flush: whatever the delays on the way, the
    # messages that arrived in the first second are at most 1 / FLUSH_S, all of them at most
    # one per FLUSH_S from the first delta to the last arrival, plus one.
    first_second = [m for at, m in received if at < started + 1.0]
    span = received[-1][0] - started
    counts = [sum(int(at - started) == s for at, _ in received) for s in range(int(span) + 1)]
    types = [m["type"] for _, m in received]
    print(f"2,000 node deltas, {per_message} a message, sent in {sent_in:.2f} s; messages "
          f"received in each second from the first: {counts}; {types}")  # fmt: skip
    assert len(first_second) <= 1 / FLUSH_S
    assert len(received) <= span / FLUSH_S + 1
    assert len(received) <= 2000 / per_message / 10  # not one message per group message
    for _, message in received:
        assert message["type"] in ("delta", "snapshot")
        names = [node["node"] for node in message["nodes"]]
        assert len(names) == len(set(names))  # one state per node: the newest
    seqs = [m["seq"] for _, m in listener.messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # the socket's own, no gap
    if per_message > 1:
        # the group lost none: every node's newest state came in a delta, not a snapshot
        assert "snapshot" not in types, types


def test_a_reconnect_gets_one_snapshot_of_what_changed_while_it_was_away(stack, fleet):
    ids = list(Node.objects.filter(cluster=fleet).order_by("name").values_list("id", flat=True))
    browser = log_in(stack, "vera")
    with listening(stack, browser.cookies["sessionid"]) as listener:
        assert set(listener.utils().values()) == {-1.0}
    async_to_sync(send_node_deltas)(fleet.id, [{VERSIONS - 1: ids}])  # while none is open
    with listening(stack, browser.cookies["sessionid"]) as listener:
        time.sleep(3 * FLUSH_S)
        assert [m["type"] for _, m in listener.messages] == ["snapshot"]
        assert listener.utils() == final_utils()

        # a client's resync: one snapshot, and nothing else
        listener.socket.send(json.dumps({"type": "resync"}))
        wait_for(lambda: len(listener.messages) == 2, 5, "the resync's snapshot")
        time.sleep(3 * FLUSH_S)
        assert [m["type"] for _, m in listener.messages] == ["snapshot", "snapshot"]
        assert listener.utils() == final_utils()


def test_a_delta_lost_on_the_way_is_made_good_by_a_snapshot(stack, fleet):
    ids = list(Node.objects.filter(cluster=fleet).order_by("name").values_list("id", flat=True))
    browser = log_in(stack, "vera")
    with listening(stack, browser.cookies["sessionid"]) as listener:
        # two versions stored; the group carries only the second (the first was lost: a
        # channel over its capacity drops what is sent to it)
        store(ids[:10], 1)
        redis_client().incrby(cluster_seq_key(fleet.id), 10)
        async_to_sync(send_node_deltas)(fleet.id, [{2: ids[10:20]}])
        wait_for(lambda: len(listener.messages) == 2, 5, "a message after the gap")
        time.sleep(3 * FLUSH_S)
        assert [m["type"] for _, m in listener.messages] == ["snapshot", "snapshot"]
        utils = listener.utils()
        assert [utils[f"node-{i:04d}"] for i in (0, 9, 10, 19, 20)] == [
            util(1, 0), util(1, 9), util(2, 10), util(2, 19), -1.0,
        ]  # fmt: skip
