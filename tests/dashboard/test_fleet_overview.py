"""The overview of a fleet of 4,096 nodes (tests/dashboard/fleet.py), in-process: blocks by
rack where nodes say it and by name otherwise, each coloured by its worst GPU; a body well
under a megabyte; a block opens on its nodes' cards; the counts are the fleet's (and the
block's on its page)."""

from __future__ import annotations

import re

import pytest

from tests.dashboard.fleet import CORDONED, GPUS, HOT_BLOCK, HOT_NODE, NODES, fleet

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
