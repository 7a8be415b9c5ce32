"""The overview in Chromium takes a batched update: 256 nodes × 8 GPUs (the most a page shows
as cards, OVERVIEW_NODE_CARDS), two versions of every node sent to the cluster's group as 32
deltas, arrive coalesced in a few socket messages, each drawn in one pass; the page ends on
every node's newest state."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from apps.clusters.models import Cluster, Node
from apps.core.redis import redis_client
from apps.live.groups import cluster_group, cluster_seq_key
from apps.live.selectors import node_health_list
from apps.live.send import group_send
from apps.telemetry.models import NodeHealth
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
NODES, GPUS, PER_MESSAGE = 256, 8, 16

# Every delta event, and every batch of DOM changes to the grid (a MutationObserver callback:
# one per task that wrote): how many nodes and cards each touched.
RECORD = """() => {
  window.__deltas = []; window.__writes = [];
  document.addEventListener("opsboard:delta", (e) => window.__deltas.push(e.detail.nodes.length));
  const element = (r) => (r.target.closest ? r.target : r.target.parentElement);
  new MutationObserver((records) => {
    window.__writes.push(new Set(records.map((r) => element(r).closest(".node-card"))).size);
  }).observe(document.getElementById("node-grid"),
             { subtree: true, attributes: true, childList: true, characterData: true });
}"""


@pytest.fixture
def cards(live_db) -> Cluster:
    cluster = Cluster.objects.create(name="cards")
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"node-{i:03d}", last_seen=now, info={"gpus": GPUS})
        for i in range(NODES)
    )
    NodeHealth.objects.bulk_create(
        NodeHealth(node=node, gpu=gpu, ts=now, values={"gpu.temp_c": 60.0})
        for node in nodes
        for gpu in range(GPUS)
    )
    return cluster


def send_version(cluster: Cluster, hot: str) -> None:
    """Store a version of every node (`hot`: SQL of the GPU temperature, from n.name and
    h.gpu), then send it as the publisher would: numbered deltas of PER_MESSAGE nodes."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""UPDATE telemetry_nodehealth h SET values = jsonb_build_object('gpu.temp_c', {hot})
                FROM clusters_node n WHERE n.id = h.node_id AND n.cluster_id = %s""",
            [cluster.id],
        )
    states = node_health_list(cluster_id=cluster.id)
    last = redis_client().incrby(cluster_seq_key(cluster.id), NODES // PER_MESSAGE)
    for number, at in enumerate(range(0, NODES, PER_MESSAGE)):
        message = {"nodes": states[at : at + PER_MESSAGE], "type": "live.delta"}
        group_send(
            cluster_group(cluster.id), {**message, "seq": last - NODES // PER_MESSAGE + number + 1}
        )


def test_the_overview_applies_a_batched_update_of_every_node_in_one_pass_each(
    chromium,  # noqa: F811
    live_stack,
    cards,
):
    operator("op")
    browser = BrowserPage(chromium, live_stack.url, "op")
    page = browser.page
    page.goto(f"{live_stack.url}/clusters/cards/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    page.wait_for_function(
        f"() => document.getElementById('count-healthy').textContent === '{NODES * GPUS}'"
    )
    page.wait_for_timeout(settings.LIVE_SOCKET_FLUSH_S * 2000)  # the snapshot is drawn
    page.evaluate(RECORD)

    started = time.monotonic()
    send_version(cards, "82.0")  # every GPU warm: a warning, replaced before or after drawn
    # then one GPU of each node hot (node-i's GPU i % 8), the others cool
    send_version(
        cards, f"CASE WHEN h.gpu = substr(n.name, 6)::int %% {GPUS} THEN 95.0 ELSE 60.0 END"
    )
    sent_in = time.monotonic() - started
    page.wait_for_function(
        f"""() => document.querySelectorAll('.tile[data-state="critical"]').length === {NODES}
             && document.querySelectorAll('.tile[data-state="warning"]').length === 0""",
        timeout=10_000,
    )
    for index in (0, 9, 255):
        hot = page.locator(f'.node-card[data-node="node-{index:03d}"] .tile[data-state="critical"]')
        assert hot.get_attribute("data-gpu") == str(index % GPUS)
    assert page.locator("#count-healthy").inner_text() == str(NODES * GPUS - NODES)
    deltas, writes = page.evaluate("[window.__deltas, window.__writes]")
    print(f"{2 * NODES // PER_MESSAGE} group deltas sent in {sent_in:.2f} s: socket deltas of "
          f"{deltas} nodes; cards written in each pass: {writes}")  # fmt: skip
    assert sum(deltas) >= NODES  # every node's newest state came, some maybe twice
    # coalesced: a message per LIVE_SOCKET_FLUSH_S at most, not one per group delta
    assert len(deltas) <= (time.monotonic() - started) / settings.LIVE_SOCKET_FLUSH_S + 1
    assert len(deltas) < 2 * NODES // PER_MESSAGE
    # each message drawn in one pass: no more passes than messages, each card written once
    assert len(writes) <= len(deltas) and max(writes) <= NODES
    assert browser.errors == []
    browser.close()
