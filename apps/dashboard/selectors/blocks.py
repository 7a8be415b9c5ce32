"""The overview of a fleet: past OVERVIEW_NODE_CARDS nodes a card per node (4,096 cards of 8
tiles) is no page a person reads, so nodes are shown as blocks — by the node_info field
OVERVIEW_BLOCK_FIELD (a rack, a row) where the agents send it, else OVERVIEW_BLOCK_NODES
nodes consecutive by name — each coloured by its worst member and opening on its nodes.
Plain dicts in, plain dicts out (the rows are the overview's nodes with their tiles)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.conf import settings

# A block's colour: the worst of its tiles, in this order (worst last).
BLOCK_ORDER = ("ok", "nodata", "cordoned", "warning", "critical", "down")
BLOCK_KEY_MAX_LENGTH = 1100  # two node names and " … ", or the field and its value


def node_blocks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks of the nodes (rows: the overview's nodes, each with its `tiles`), in
    order: by the block field's value, the nodes without it in name-order chunks after."""
    by_field: dict[str, list[dict[str, Any]]] = {}
    rest = []
    for row in sorted(rows, key=lambda r: r["node"]):
        if row.get("block"):  # apps.live.selectors: the node's OVERVIEW_BLOCK_FIELD
            by_field.setdefault(f"{settings.OVERVIEW_BLOCK_FIELD} {row['block']}", []).append(row)
        else:
            rest.append(row)
    blocks = [_block(key, members) for key, members in sorted(by_field.items())]
    size = max(1, settings.OVERVIEW_BLOCK_NODES)
    for start in range(0, len(rest), size):
        members = rest[start : start + size]
        key = (
            members[0]["node"]
            if len(members) == 1
            else (f"{members[0]['node']} … {members[-1]['node']}")
        )
        blocks.append(_block(key, members))
    return blocks


def block_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]] | None:
    """The nodes of the block named `key`, or None when no block has that name."""
    for block in node_blocks(rows):
        if block["key"] == key:
            members = set(block["nodes"])
            return [row for row in rows if row["node"] in members]
    return None


def _block(key: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    tiles = Counter(tile["state"] for row in members for tile in row["tiles"])
    worst = max(tiles, key=BLOCK_ORDER.index, default="nodata")
    return {
        "key": key,
        "state": worst,
        "nodes": [row["node"] for row in members],
        "runs": sorted({run for row in members for run in row.get("runs", ())}),
        "gpus": sum(tiles.values()),
        "tiles": dict(tiles),
        "label": _label(key, len(members), tiles),
    }


def _label(key: str, nodes: int, tiles: Counter) -> str:
    """What the block's title says: its name, its size and what is not ok in it."""
    bad = [f"{tiles[state]} {state}" for state in reversed(BLOCK_ORDER[1:]) if tiles[state]]
    return f"{key}: {nodes} nodes, {sum(tiles.values())} GPUs" + (
        f" ({', '.join(bad)})" if bad else ", all ok"
    )
