"""The overview of a fleet of 4,096 nodes (tests/dashboard/fleet.py), in-process: blocks by
rack where nodes say it and by name otherwise, each coloured by its worst GPU; a body well
under a megabyte; a block opens on its nodes' cards; the counts are the fleet's (and the
block's on its page). On a mixed fleet (fleet.mixed_fleet): the blocks page, which takes
its tiles' states from Postgres, says what every node's tiles say (node_tiles, as the cards
draw them); a block's page reads its own nodes alone; Postgres colours a GPU as gpu_health."""

from __future__ import annotations

import random
import re
import time
from collections import Counter

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.html import escape

from apps.alerts.selectors import alert_json
from apps.clusters.models import Cluster, Node
from apps.core.bounds import MAX_GPUS
from apps.dashboard.selectors.alerts import open_alerts
from apps.dashboard.selectors.blocks import BLOCK_ORDER, block_node_ids, fleet_nodes, node_blocks
from apps.dashboard.selectors.health import (
    TILE_STATES,
    gpu_colours_sql,
    gpu_colours_sql_params,
    gpu_health,
    node_tiles,
)
from apps.live.selectors import node_health_list
from apps.telemetry.models import NodeHealth
from tests.dashboard.fleet import (
    ALERTED,
    CORDONED,
    GPUS,
    HOT_BLOCK,
    HOT_NODE,
    NODES,
    fleet,
    mixed_fleet,
    mixed_name,
)

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]


def blocks_of(html: str) -> dict[str, str]:
    return dict(re.findall(r'class="block" href="[^"]*" data-block="([^"]*)" data-state="(\w+)"',
                           html))  # fmt: skip


def test_a_fleet_overview_shows_blocks_coloured_by_their_worst_gpu(client_in):
    fleet("fleet")
    response = client_in.get("/clusters/fleet/")
    html = response.content.decode()
    assert len(response.content) < 1_000_000, len(response.content)
    blocks = blocks_of(html)
    assert len(blocks) == 128 and 'class="node-card"' not in html
    assert blocks["rack r00"] == "ok" and blocks["rack r01"] == "cordoned"
    assert blocks[HOT_BLOCK] == "critical"
    assert sum(state == "ok" for state in blocks.values()) == 126
    assert f'<span id="count-gpus">{NODES * GPUS}</span>' in html
    assert f'<span id="count-healthy">{NODES * GPUS - GPUS - 1}</span>' in html
    assert '<span id="count-cordoned">1</span>' in html
    assert 'id="live-config"' not in html  # the blocks page reloads itself, no socket

    block = client_in.get("/clusters/fleet/", {"block": HOT_BLOCK}).content.decode()
    cards = re.findall(r'<div class="node-card" data-node="([^"]+)"', block)
    assert cards == [f"node-{i:04d}" for i in range(2976, 3008)]
    hot = re.search(rf'data-node="{HOT_NODE}".*?</div>', block, re.S)[0]
    assert 'data-gpu="3" data-state="critical"' in hot
    assert f'<span id="count-gpus">{32 * GPUS}</span>' in block  # the block's own counts
    assert 'id="live-config"' in block
    rack = client_in.get("/clusters/fleet/", {"block": "rack r01"}).content.decode()
    assert f'data-node="{CORDONED}" data-node-state="cordoned"' in rack
    assert client_in.get("/clusters/fleet/", {"block": "rack r99"}).status_code == 404


def test_a_small_cluster_keeps_its_cards(client_in, cluster):
    html = client_in.get(f"/clusters/{cluster.name}/").content.decode()
    assert 'class="node-card"' in html and 'id="block-grid"' not in html


# A fleet's blocks page takes its tiles' states from Postgres (selectors.blocks.fleet_nodes);
# the cards and a block's page build every tile in Python (node_tiles). Both must say the same.
SMALL_FLEET = {"OVERVIEW_NODE_CARDS": 16, "OVERVIEW_BLOCK_NODES": 5}


def tiled(cluster: Cluster, now: float) -> tuple[list[dict], list[dict]]:
    """The open alerts and every node with its tiles' states, as the cards draw them."""
    alerts = [alert_json(alert) for alert in open_alerts(cluster=cluster)]
    nodes = node_health_list(cluster_id=cluster.id)
    for node in nodes:
        node["states"] = [tile["state"] for tile in node_tiles(node=node, alerts=alerts, now=now)]
    return alerts, nodes


def blocks_by_tiles(nodes: list[dict]) -> list[dict]:
    """The blocks as the overview grouped every node's tiles in Python before issue 27: by
    rack, in key order, then OVERVIEW_BLOCK_NODES (5) nodes by name."""
    by_field: dict[str, list[dict]] = {}
    rest = []
    for node in sorted(nodes, key=lambda n: n["node"]):
        if node["block"]:
            by_field.setdefault(f"rack {node['block']}", []).append(node)
        else:
            rest.append(node)
    groups = sorted(by_field.items())
    for start in range(0, len(rest), 5):
        members = rest[start : start + 5]
        first, last = members[0]["node"], members[-1]["node"]
        groups.append((first if len(members) == 1 else f"{first} … {last}", members))
    return [summary(key, members) for key, members in groups]


def summary(key: str, members: list[dict]) -> dict:
    tiles = Counter(state for node in members for state in node["states"])
    return {"key": key, "nodes": [node["node"] for node in members],
            "tiles": list(tiles.items()),
            "state": max(tiles, key=BLOCK_ORDER.index, default="nodata")}  # fmt: skip


def counts_of(html: str) -> str:
    return re.search(r'<section class="counts">.*?</section>', html, re.S)[0]


@override_settings(**SMALL_FLEET)
def test_the_blocks_count_every_tile_as_the_cards_do(client_in):
    cluster = mixed_fleet("mixed")
    now = time.time()
    alerts, slow = tiled(cluster, now)
    assert {state for node in slow for state in node["states"]} == set(TILE_STATES)

    xid, ecc, rank, heartbeat, hot = ([n["states"] for n in slow if n["node"] == mixed_name(i)][0]
                                      for i in ALERTED)  # fmt: skip
    assert xid == ["ok", "ok", "critical", *["ok"] * 5]  # the GPU an alert names
    assert ecc == [*["warning"] * 7, "nodata"]  # a node's alert: every GPU with a reading
    assert rank == ["ok"] * 6  # a rank's alert, its GPU unknown: no GPU
    assert heartbeat == ["down"] * MAX_GPUS  # it claims 100 GPUs: MAX_GPUS tiles
    assert hot == ["ok", "critical", *["ok"] * 6, "nodata", "ok"]  # its own colour is worse

    fast = fleet_nodes(cluster_id=cluster.id, alerts=alerts, now=now)
    assert [node["node"] for node in fast] == sorted(node["node"] for node in slow)
    assert {n["node"]: n["states"] for n in fast} == {n["node"]: n["states"] for n in slow}
    blocks = node_blocks(fast)
    assert [(b["key"], b["nodes"], list(b["tiles"].items()), b["state"]) for b in blocks] == [
        (b["key"], b["nodes"], b["tiles"], b["state"]) for b in blocks_by_tiles(slow)
    ]

    html = client_in.get(f"/clusters/{cluster.name}/").content.decode()
    assert 'id="block-grid"' in html and 'class="node-card"' not in html
    assert re.findall(r'data-block="([^"]*)"', html) == [escape(b["key"]) for b in blocks]
    with override_settings(OVERVIEW_NODE_CARDS=10_000):
        cards = client_in.get(f"/clusters/{cluster.name}/").content.decode()
    assert 'class="node-card"' in cards
    assert counts_of(html) == counts_of(cards)  # healthy GPUs, GPUs, alerts, nodes out
    healthy = sum(state == "ok" for node in slow for state in node["states"])
    assert f'<span id="count-healthy">{healthy}</span>' in html


@override_settings(**SMALL_FLEET)
def test_a_block_page_reads_its_own_nodes_alone(client_in):
    cluster = mixed_fleet("mixed")
    _, slow = tiled(cluster, time.time())
    ids = {node["node"]: node["id"] for node in slow}
    blocks = blocks_by_tiles(slow)
    assert [block["key"] for block in blocks].count("rack r01") == 2  # a rack, a node's name
    expected = {}
    for block in blocks:
        expected.setdefault(block["key"], block)  # the rack's block (listed first) wins
    for key, block in expected.items():
        assert sorted(block_node_ids(cluster_id=cluster.id, key=key)) == sorted(
            ids[name] for name in block["nodes"]
        ), key
    assert block_node_ids(cluster_id=cluster.id, key="rack r99") == []
    assert block_node_ids(cluster_id=cluster.id, key="rack ") == []  # an empty rack is none

    odd = [key for key in expected if "a … b" in key or key == "rack 7"]
    assert len(odd) == 2
    for key in odd:
        with CaptureQueriesContext(connection) as queries:
            html = client_in.get(f"/clusters/{cluster.name}/", {"block": key}).content.decode()
        cards = re.findall(r'<div class="node-card" data-node="([^"]+)"', html)
        assert sorted(cards) == sorted(escape(name) for name in expected[key]["nodes"])
        gpus = sum(n for _, n in expected[key]["tiles"])
        assert f'<span id="count-gpus">{gpus}</span>' in html
        health = [q["sql"] for q in queries.captured_queries if "telemetry_nodehealth" in q["sql"]]
        assert len(health) == 1 and "n.id = ANY(" in health[0]  # its nodes' health alone


def test_postgres_colours_a_gpu_as_gpu_health_does():
    """gpu_colours_sql against gpu_health, over the values as the cards read them: plain
    numbers are coloured in Postgres, at and around every threshold; what Postgres would
    compute otherwise than Python (a string, a bool, a huge integer, a ratio that overflows)
    is left to gpu_health."""
    pick = random.Random(27).choice
    temps = [None, 0.0, 60.0, 79.99999, 80.0, 80, 84.99, 85.0, 85, 91.5, -3.0]
    memory = [None, 0.0, 0, 95.0, 100.0, 94.99, 76e9, 80e9, 0.95 * 80e9, 1.0, 3]
    throttles = [None, 0.0, 0, 1.0, 8.0, 8.9, 7.999999, 32, 0xE8, 255.5, -1.0, -8.5, 2**40]
    plain = [
        {key: value for key, value in (("gpu.temp_c", pick(temps)),
         ("gpu.mem_used_bytes", pick(memory)), ("gpu.mem_total_bytes", pick(memory)),
         ("gpu.throttle_reasons", pick(throttles)), ("gpu.util", 90.0)) if value is not None}
        for _ in range(400)
    ]  # fmt: skip
    odd = [
        {"gpu.temp_c": "90"}, {"gpu.temp_c": True}, {"gpu.temp_c": None},
        {"gpu.mem_used_bytes": 1.0, "gpu.mem_total_bytes": 1e-300},
        {"gpu.mem_used_bytes": 1e-300, "gpu.mem_total_bytes": 1e150},
        {"gpu.mem_used_bytes": 2**60 + 1, "gpu.mem_total_bytes": 2**60},
        {"gpu.mem_used_bytes": True, "gpu.mem_total_bytes": True},
        {"gpu.throttle_reasons": 2**60 + 8}, {"gpu.throttle_reasons": float(2**53 + 8)},
        {"gpu.throttle_reasons": False}, {"gpu.throttle_reasons": [8]},
        {"gpu.mem_total_bytes": {"x": 1}, "gpu.mem_used_bytes": 1.0},
    ]  # fmt: skip
    values = plain + odd
    node = Node.objects.create(cluster=Cluster.objects.create(name="colours"), name="n")
    NodeHealth.objects.bulk_create(
        NodeHealth(node=node, gpu=gpu, ts=timezone.now(), values=value)
        for gpu, value in enumerate(values)
    )
    health = node_health_list(node_ids=[node.id])[0]["health"]
    with connection.cursor() as cursor:
        rows = 'SELECT gpu, "values" FROM telemetry_nodehealth WHERE node_id = %(node)s'
        cursor.execute(
            f"SELECT gpu, colour FROM ({gpu_colours_sql(rows)}) c",
            gpu_colours_sql_params() | {"node": node.id},
        )
        colours = dict(cursor.fetchall())
    for gpu, value in enumerate(values):
        try:
            expected = gpu_health(health[str(gpu)])
        except (TypeError, ValueError, AttributeError):
            expected = None  # the cards fail on it: the fast path must hand it to gpu_health
        if gpu < len(plain):
            assert colours[gpu] == expected, value
        else:
            assert colours[gpu] in (None, expected), value
    assert {colours[gpu] for gpu in range(len(plain))} == {"ok", "warning", "critical"}
