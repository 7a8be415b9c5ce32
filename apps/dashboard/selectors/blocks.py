"""The overview of a fleet: past OVERVIEW_NODE_CARDS nodes a card per node (4,096 cards of 8
tiles) is no page a person reads, so nodes are shown as blocks — by the node_info field
OVERVIEW_BLOCK_FIELD (a rack, a row) where the agents send it, else OVERVIEW_BLOCK_NODES
nodes consecutive by name — each coloured by its worst member and opening on its nodes.

Postgres says which block each node is in (_KEYED_SQL, the one definition of a block: the
blocks page and a block's page both read it) and each GPU's own colour (gpu_colours_sql): a
fleet's overview builds no tile and reads no node's health values, and a block's page reads
only its own nodes."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import orjson
from django.conf import settings
from django.db import connections

from apps.core.bounds import MAX_GPUS
from apps.core.db_router import read_alias
from apps.dashboard.selectors.health import (
    gpu_colours_sql,
    gpu_colours_sql_params,
    gpu_count,
    node_tile_states,
)

# A block's colour: the worst of its tiles, in this order (worst last).
BLOCK_ORDER = ("ok", "nodata", "cordoned", "warning", "critical", "down")
BLOCK_KEY_MAX_LENGTH = 1100  # two node names and " … ", or the field and its value
BLOCK_NAME_SEPARATOR = " … "  # a name-order block's key: its first and last node's names

# The cluster's nodes, each with its block's key. `block`: the node's OVERVIEW_BLOCK_FIELD
# where it is a non-empty string or an integer (as apps.live.selectors' node_health_list
# reads its "block": orjson makes an int of an integer within 64 bits, a float of any other
# number); its block's key is the field's name and that value ("rack r07"). The nodes
# without one are cut in chunks of OVERVIEW_BLOCK_NODES by name, keyed "first … last" (the
# name alone for a chunk of one). Names in code-point order (COLLATE "C"), as Python sorts
# them, whatever the database's collation.
_KEYED_SQL = """
WITH node AS (
    SELECT n.id, n.name, n.state, n.down_by, n.last_seen, n.info -> 'gpus' AS claimed,
           CASE jsonb_typeof(n.info -> %(field)s)
               WHEN 'string' THEN nullif(n.info ->> %(field)s, '')
               WHEN 'number' THEN CASE WHEN n.info ->> %(field)s ~ '^-?[0-9]+$'
                   AND (n.info ->> %(field)s)::numeric
                       BETWEEN -9223372036854775808 AND 18446744073709551615
                   THEN n.info ->> %(field)s END
           END AS block
    FROM clusters_node n WHERE n.cluster_id = %(cluster)s
), ranked AS (
    SELECT node.*, (row_number() OVER (PARTITION BY block IS NULL
                                       ORDER BY name COLLATE "C") - 1) / %(size)s AS chunk
    FROM node
), keyed AS (
    SELECT ranked.*,
           CASE WHEN block IS NOT NULL THEN %(field)s || ' ' || block
                WHEN count(*) OVER chunk = 1 THEN name
                ELSE min(name COLLATE "C") OVER chunk || %(separator)s
                     || max(name COLLATE "C") OVER chunk
           END AS key
    FROM ranked WINDOW chunk AS (PARTITION BY block IS NULL, chunk)
)
"""
# Each node (name order) with its GPUs' indexes and own colours (gpu_colours_sql), both
# joined by commas in the same order (one aggregate pass: the n-th colour is the n-th GPU's);
# a colour is "" where gpu_health must decide, with the GPU's health entry, as
# node_health_list builds it, in `odd`. OFFSET 0 keeps the colour a column computed once
# (flattened, Postgres would compute it once per reference). MATERIALIZED: computed once
# whatever the planner thinks of the cluster's size (with statistics from before its nodes
# were added it estimated one node and ran the aggregate once per node: 16 s at 4,096).
_FLEET_SQL = """, health AS MATERIALIZED (
    SELECT node_id, string_agg(gpu::text, ',') AS gpus,
           string_agg(coalesce(colour, ''), ',') AS colours,
           (jsonb_object_agg(gpu, entry) FILTER (WHERE colour IS NULL))::text AS odd
    FROM (
        SELECT node_id, gpu, colour, CASE WHEN colour IS NULL
            THEN jsonb_build_object('ts', date_part('epoch', ts)) || "values" END AS entry
        FROM ({colours}) c
        OFFSET 0
    ) g
    GROUP BY node_id
)
SELECT k.id, k.name, k.state, k.down_by, date_part('epoch', k.last_seen), k.claimed,
       h.gpus, h.colours, h.odd, k.key, k.block IS NOT NULL
FROM keyed k LEFT JOIN health h ON h.node_id = k.id
ORDER BY k.name COLLATE "C"
"""
# The latest values of the cluster's GPUs (gpu >= 0: the host's row is none).
_GPUS_SQL = """
SELECT h.node_id, h.gpu, h.ts, h."values"
FROM telemetry_nodehealth h JOIN clusters_node n ON n.id = h.node_id
WHERE n.cluster_id = %(cluster)s AND h.gpu >= 0
"""


def _params(cluster_id: int) -> dict[str, Any]:
    return {
        "cluster": cluster_id,
        "field": settings.OVERVIEW_BLOCK_FIELD or "",
        "size": max(1, settings.OVERVIEW_BLOCK_NODES),
        "separator": BLOCK_NAME_SEPARATOR,
    }


def fleet_nodes(
    *, cluster_id: int, alerts: list[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """The cluster's nodes in name order (code points), each {"id", "node", "state",
    "down_by", "block" (its block's key), "by_field" (a block of OVERVIEW_BLOCK_FIELD, not
    of names), "states" (its tiles' states, node_tile_states: what node_tiles would say)}.
    `alerts`: the open alerts (alert_json). One query; no tile built."""
    params = _params(cluster_id) | gpu_colours_sql_params()
    sql = _KEYED_SQL + _FLEET_SQL.format(colours=gpu_colours_sql(_GPUS_SQL))
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for alert in alerts:
        by_node[alert["node"]].append(alert)
    nodes = []
    for (node_id, name, state, down_by, last_seen, claimed, gpus, colours, odd, key,
         by_field) in rows:  # fmt: skip
        node = {"id": node_id, "node": name, "state": state, "down_by": down_by,
                "last_seen": last_seen, "block": key, "by_field": by_field}  # fmt: skip
        own = _own_colours(claimed=claimed, gpus=gpus, colours=colours, odd=odd)
        mine = by_node.get(name, [])
        node["states"] = node_tile_states(node=node, own=own, alerts=mine, now=now)
        nodes.append(node)
    return nodes


def _own_colours(
    *, claimed: str | None, gpus: str | None, colours: str | None, odd: str | None
) -> list[Any]:
    """node_tile_states' `own` from a _FLEET_SQL row: each drawn GPU's colour, or its health
    entry where gpu_health must decide, or None where it never reported."""
    found = dict(zip(map(int, gpus.split(",")), colours.split(","), strict=True)) if gpus else {}
    highest = max(found, default=-1)
    drawn = min(gpu_count(orjson.loads(claimed) if claimed else None, highest), MAX_GPUS)
    own: list[Any] = [found.get(gpu) for gpu in range(drawn)]
    if odd:
        health = orjson.loads(odd)
        own = [health[str(gpu)] if colour == "" else colour for gpu, colour in enumerate(own)]
    return own


def block_node_ids(*, cluster_id: int, key: str) -> list[int]:
    """The ids of the nodes of the block named `key` (none: no block has that name). A block
    of the field wins over a node named like it (the blocks page lists it first). One query,
    of no node's health."""
    with connections[read_alias()].cursor() as cursor:
        cursor.execute(
            _KEYED_SQL + "SELECT id, block IS NOT NULL FROM keyed WHERE key = %(key)s",
            _params(cluster_id) | {"key": key},
        )
        rows = cursor.fetchall()
    by_field = any(field for _, field in rows)
    return [node_id for node_id, field in rows if field == by_field]


def node_blocks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks of the nodes (rows: fleet_nodes' nodes, each with its `runs`), in order:
    the field's blocks by key, then the name-order blocks."""
    by_field: dict[str, list[dict[str, Any]]] = {}
    by_name: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        (by_field if row["by_field"] else by_name).setdefault(row["block"], []).append(row)
    return [_block(key, members) for key, members in [*sorted(by_field.items()), *by_name.items()]]


def _block(key: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    tiles = Counter(state for row in members for state in row["states"])
    worst = max(tiles, key=BLOCK_ORDER.index, default="nodata")
    return {
        "key": key,
        "state": worst,
        "nodes": [row["node"] for row in members],
        # the page's data-nodes: one string to escape, not 32 names one by one (4,096 a page)
        "node_names": " ".join(row["node"] for row in members),
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
