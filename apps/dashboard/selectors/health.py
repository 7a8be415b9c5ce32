"""A GPU tile's colour: its own latest values (HEALTH_RULES) and the open alerts that colour
it. static/js/overview.js applies the same rules to live deltas; gpu_colours_sql is the same
rules again, in SQL, for the fleet overview (selectors.blocks), checked against gpu_health by
tests/dashboard/test_fleet_overview.py."""

from __future__ import annotations

from typing import Any

from apps.alerts.choices import OPEN_STATES
from apps.clusters.choices import OUT_OF_PLANS, NodeState
from apps.core.bounds import MAX_GPUS
from detectors.config import DEFAULT_CONFIG

# Tile colours, worst last; "cordoned" and "nodata" are states of their own, not severities.
TILE_ORDER = ("ok", "warning", "critical", "down")
TILE_STATES = ("ok", "warning", "critical", "down", "cordoned", "nodata")
# Thresholds of a GPU tile's own colour (alerts can only make it worse). The page's JS
# applies the same rules to live deltas, with these values handed over by json_script.
HEALTH_RULES = {
    "temp_warning_c": 80.0,
    "temp_critical_c": 85.0,
    "mem_warning_ratio": 0.95,
    # NVML clocks-event reasons: HW slowdown, SW thermal, HW thermal, HW power brake
    "throttle_warning_mask": 0x08 | 0x20 | 0x40 | 0x80,
    # a node silent this long is down (the heartbeat alert says so too, a little later)
    "silent_down_s": max(90.0, 3 * DEFAULT_CONFIG.heartbeat_min_s),
}
# The values the rules read.
TEMP, MEM_USED, MEM_TOTAL, THROTTLE = (
    "gpu.temp_c", "gpu.mem_used_bytes", "gpu.mem_total_bytes", "gpu.throttle_reasons",
)  # fmt: skip


def gpu_health(values: dict[str, Any]) -> str:
    """A GPU's own colour from its latest values (HEALTH_RULES)."""
    temp = values.get(TEMP)
    if temp is not None and temp >= HEALTH_RULES["temp_critical_c"]:
        return "critical"
    if temp is not None and temp >= HEALTH_RULES["temp_warning_c"]:
        return "warning"
    used, total = values.get(MEM_USED), values.get(MEM_TOTAL)
    if used is not None and total and used / total >= HEALTH_RULES["mem_warning_ratio"]:
        return "warning"
    throttle = values.get(THROTTLE)
    if throttle is not None and int(throttle) & HEALTH_RULES["throttle_warning_mask"]:
        return "warning"
    return "ok"


# Where Postgres computes gpu_health's float arithmetic exactly as Python does: an integer below
# 2**53 converts to float8 exactly (a larger one may round where Python's int does not), and
# a ratio of magnitudes within [_RATIO_MIN, _EXACT_MAX) neither overflows nor underflows
# (Postgres raises where Python gives inf or 0.0). gpu_health decides the values outside.
_EXACT_MAX, _RATIO_MIN = 2**53, 1e-15
_READ = {"temp": TEMP, "used": MEM_USED, "total": MEM_TOTAL, "throttle": THROTTLE}


def gpu_colours_sql(rows: str) -> str:
    """gpu_health in SQL: a query of the rows of `rows` (a query with a jsonb column "values",
    a GPU's latest values), each with its `colour` by gpu_health's rules, HEALTH_RULES the
    named parameters (gpu_colours_sql_params); NULL where "values" is no object, or a value
    the rules read is not a number (a JSON null, a string, a bool) or lies outside the range
    where Postgres computes as Python does: then gpu_health decides. The rows keep their
    columns, with this query's own beside them (named _gpu_*)."""
    found = ", ".join(f"r.\"values\" -> '{key}' AS _gpu_{name}_json" for name, key in _READ.items())
    numbers = " AND ".join(
        f"coalesce(jsonb_typeof(_gpu_{name}_json), 'number') = 'number'" for name in _READ
    )
    floats = ", ".join(
        f"CASE WHEN jsonb_typeof(_gpu_{name}_json) = 'number' THEN _gpu_{name}_json::float8 END"
        f" AS _gpu_{name}"
        for name in _READ
    )

    def exact(value: str, least: float) -> str:
        size = f"abs({value})"
        return f"coalesce({size} < {_EXACT_MAX} AND ({value} = 0 OR {size} >= {least}), true)"

    # Each value is read and converted once (OFFSET 0: a level Postgres computes rather than
    # inlines in every reference), and cast to a number only once it is known to be one
    # (in a CASE: Postgres may evaluate AND's operands in any order).
    return f"""
SELECT f.*, CASE WHEN _gpu_plain AND {exact("_gpu_used", _RATIO_MIN)}
    AND {exact("_gpu_total", _RATIO_MIN)} AND coalesce(abs(_gpu_throttle) < {_EXACT_MAX}, true)
    THEN CASE
        WHEN _gpu_temp >= %(temp_critical_c)s::float8 THEN 'critical'
        WHEN _gpu_temp >= %(temp_warning_c)s::float8 THEN 'warning'
        WHEN CASE WHEN _gpu_total <> 0 THEN _gpu_used / _gpu_total END
            >= %(mem_warning_ratio)s::float8 THEN 'warning'
        WHEN (trunc(_gpu_throttle)::int8 & %(throttle_warning_mask)s::int8) <> 0 THEN 'warning'
        ELSE 'ok' END
    END AS colour
FROM (
    SELECT j.*, _gpu_object AND {numbers} AS _gpu_plain, {floats}
    FROM (
        SELECT r.*, jsonb_typeof(r."values") = 'object' AS _gpu_object, {found}
        FROM ({rows}) r OFFSET 0
    ) j OFFSET 0
) f"""


def gpu_colours_sql_params() -> dict[str, Any]:
    """The parameters of gpu_colours_sql: HEALTH_RULES' thresholds."""
    keys = ("temp_critical_c", "temp_warning_c", "mem_warning_ratio", "throttle_warning_mask")
    return {key: HEALTH_RULES[key] for key in keys}


def _worse(a: str, b: str) -> str:
    return a if TILE_ORDER.index(a) >= TILE_ORDER.index(b) else b


def gpu_count(claimed: Any, highest: int) -> int:
    """How many GPUs a node has: `claimed` (node_info.gpus), or more where it reported a
    higher GPU index (`highest`: the highest index of its GPU health rows, -1 for none)."""
    claimed = claimed if type(claimed) is int else 0  # JSON: any type may be there
    return max(claimed, highest + 1)


def node_gpu_count(node: dict[str, Any]) -> int:
    """How many GPUs a node (node_health_list's shape) has: node_info.gpus, or more where it
    reported a higher GPU index. Not capped: rows stored before ingest bounded both can claim
    millions, which is why the pages draw at most MAX_GPUS tiles."""
    # "host" is not a GPU
    return gpu_count(node["gpus"], max((int(k) for k in node["health"] if k.isdigit()), default=-1))


def alert_colours_gpu(alert: dict[str, Any], gpu: int) -> bool:
    """Whether an open alert (alert_json) on a node colours this GPU's tile: the GPU it names
    alone; none for an alert about a rank whose GPU is unknown (one slow rank must not paint
    its whole node); every GPU for a node-wide alert. overview.js applies the same rule."""
    if alert["gpu"] is not None:
        return alert["gpu"] == gpu
    return alert["rank"] is None


def node_tile_states(
    *,
    node: dict[str, Any],
    own: list[str | dict[str, Any] | None],
    alerts: list[dict[str, Any]],
    now: float,
) -> list[str]:
    """The state of each drawn tile of a node (a dict with its "node" name, "state" and
    "last_seen"), given each GPU's own colour or its latest values (`own`: gpu_health's
    colour, or the values it takes, or None where the GPU has none), as node_tiles says
    it. `alerts`: alert_json dicts, of any nodes."""
    mine = _open_alerts(node, alerts)
    out = _node_state(node, mine, now)
    if out is not None:
        return [out] * len(own)
    states = ["nodata" if c is None else c if type(c) is str else gpu_health(c) for c in own]
    if mine:
        states = [_alerted(state, gpu, mine) for gpu, state in enumerate(states)]
    return states


def node_tiles(
    *, node: dict[str, Any], alerts: list[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """One tile per GPU of a node (node_health_list's shape; the first MAX_GPUS of them)
    with its state: down (node down, silent, or a heartbeat alert), cordoned (cordoned or
    draining), nodata (no GPU reading), else the worse of the GPU's own health and the
    severity of the open alerts that colour it (alert_colours_gpu)."""
    mine = _open_alerts(node, alerts)
    out = _node_state(node, mine, now)
    tiles = []
    for gpu in range(min(node_gpu_count(node), MAX_GPUS)):
        values = node["health"].get(str(gpu))
        if out is not None:
            state = out
        else:
            state = "nodata" if values is None else gpu_health(values)
            if mine:
                state = _alerted(state, gpu, mine)
        tiles.append({"gpu": gpu, "state": state, "values": values or {}})
    return tiles


def _open_alerts(node: dict[str, Any], alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["node"] == node["node"] and a["state"] in OPEN_STATES]


def _node_state(node: dict[str, Any], alerts: list[dict[str, Any]], now: float) -> str | None:
    """The state of all the node's tiles where the node decides it: down (down, silent, or
    a heartbeat alert among its open `alerts`), cordoned (cordoned or draining); else None."""
    silent = node["last_seen"] is None or now - node["last_seen"] > HEALTH_RULES["silent_down_s"]
    if node["state"] == NodeState.DOWN or silent or any(a["kind"] == "heartbeat" for a in alerts):
        return "down"
    if node["state"] in OUT_OF_PLANS:
        return "cordoned"
    return None


def _alerted(state: str, gpu: int, alerts: list[dict[str, Any]]) -> str:
    """A GPU's state made worse by the node's open alerts that colour it (a tile without a
    reading stays nodata)."""
    if state == "nodata":
        return state
    for alert in alerts:
        if alert_colours_gpu(alert, gpu):
            state = _worse(state, alert["severity"])
    return state
