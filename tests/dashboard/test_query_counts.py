"""Each page runs a fixed number of queries, whatever the number of nodes, GPUs and ranks."""

import time

import pytest
from django.test import override_settings

from apps.alerts.services import alerts_sync
from detectors.types import Finding
from tests.dashboard.conftest import RUN, cluster_store

pytestmark = pytest.mark.django_db


def xid_alerts(cluster, nodes: int) -> None:
    alerts_sync(
        cluster=cluster,
        findings=[
            Finding(kind="xid", subject=f"node:node-{n:02d}/gpu:0", severity="critical",
                    summary="XID", node=f"node-{n:02d}", gpu=0)
            for n in range(nodes)
        ],
        now=time.time(),
    )  # fmt: skip


# Pinned: a change here is a change in how the page reads (session and user included).
PAGES = {
    # + ended runs, the detectors' last pass, runs per node; the nodes with their health in
    # one query (two before the fleet overview of issue 27)
    "overview": ("/clusters/{c}/", 9),
    # + its commands, the plan (4: its newest checkpoints' events, the reports around the
    # newest, raw and a chunk probe, to see that the ranks agree on it; its nodes); a chunk
    # probe each for the run's first report and the checksum table (step reports older than
    # the raw window live in chunks). 22, not 27: the heat-map (its history plan, cells and
    # rank places) is fetched after load; tokens/s comes from the goodput's completions (not
    # a chunk probe and a read of the last minute's reports)
    "run": ("/clusters/{c}/runs/" + RUN + "/", 22),
    # + its commands, its runs and ranks, and (for an operator) its state once its node
    # commands still issued are carried out (the buttons it offers), its ledger (6: its
    # alerts, its XID and ECC events, the restarts it caused, its stays in maintenance, the
    # incidents it is the root cause of and their alerts)
    "node": ("/clusters/{c}/nodes/node-00/", 26),
    # session, user, the clusters; the ledger's 6 and its nodes for this window, and for the
    # one before (the trend) the same less the incidents' alerts (it roots none there)
    "fleet": ("/fleet/?cluster={c}", 15),
    "alerts": ("/alerts/?cluster={c}", 5),
    # session, user, the clusters; the incidents (one per XID here) and all their alerts
    "incidents": ("/incidents/?cluster={c}", 5),
}


@pytest.mark.parametrize("page", PAGES)
def test_the_page_reads_in_a_fixed_number_of_queries(client_in, django_assert_num_queries, page):
    small = cluster_store("small", nodes=1, gpus=2, steps=6)
    large = cluster_store("large", nodes=4, gpus=8, steps=6)
    xid_alerts(small, 1)
    xid_alerts(large, 4)
    url, expected = PAGES[page]
    for cluster in (small, large):
        with django_assert_num_queries(expected):
            assert client_in.get(url.format(c=cluster.name)).status_code == 200


# A fleet's overview (past OVERVIEW_NODE_CARDS nodes) and a block's page, pinned too (issue
# 27). The overview reads the cluster with its node count, then, for a fleet, every node's
# block and tile states in one query (selectors.blocks.fleet_nodes) instead of its health:
# 9, as the cards. A block's page: its nodes by block (block_node_ids), then their health
# alone: 10 (9 when it read every node's health and kept one block's).
FLEET_PAGES = {
    "fleet overview": ("/clusters/{c}/", {}, 9, b'id="block-grid"'),
    "block": ("/clusters/{c}/", {"block": "node-00 … node-01"}, 10, b'class="node-card"'),
}


@pytest.mark.parametrize("page", FLEET_PAGES)
@override_settings(OVERVIEW_NODE_CARDS=2, OVERVIEW_BLOCK_NODES=2)
def test_a_fleet_page_reads_in_a_fixed_number_of_queries(
    client_in, django_assert_num_queries, page
):
    small = cluster_store("small", nodes=3, gpus=2, steps=6)
    large = cluster_store("large", nodes=8, gpus=8, steps=6)
    xid_alerts(small, 3)
    xid_alerts(large, 8)
    url, query, expected, shows = FLEET_PAGES[page]
    for cluster in (small, large):
        with django_assert_num_queries(expected):
            response = client_in.get(url.format(c=cluster.name), query)
            assert response.status_code == 200 and shows in response.content
