"""A GPU tile's colour: its own latest values (HEALTH_RULES) and the open alerts that colour
it. static/js/overview.js applies the same rules to live deltas."""

from __future__ import annotations

from typing import Any

from apps.alerts.choices import OPEN_STATES
from apps.clusters.choices import NodeState
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


def gpu_health(values: dict[str, Any]) -> str:
    """A GPU's own colour from its latest values (HEALTH_RULES)."""
    temp = values.get("gpu.temp_c")
    if temp is not None and temp >= HEALTH_RULES["temp_critical_c"]:
        return "critical"
    if temp is not None and temp >= HEALTH_RULES["temp_warning_c"]:
        return "warning"
    used, total = values.get("gpu.mem_used_bytes"), values.get("gpu.mem_total_bytes")
    if used is not None and total and used / total >= HEALTH_RULES["mem_warning_ratio"]:
        return "warning"
    throttle = values.get("gpu.throttle_reasons")
    if throttle is not None and int(throttle) & HEALTH_RULES["throttle_warning_mask"]:
        return "warning"
    return "ok"


def _worse(a: str, b: str) -> str:
    return a if TILE_ORDER.index(a) >= TILE_ORDER.index(b) else b


def node_gpu_count(node: dict[str, Any]) -> int:
    """How many GPUs a node (node_health_list's shape) has: node_info.gpus, or more where it
    reported a higher GPU index. Not capped: rows stored before ingest bounded both can claim
    millions, which is why the pages draw at most MAX_GPUS tiles."""
    claimed = node["gpus"] if type(node["gpus"]) is int else 0  # JSON: any type may be there
    indexes = [int(key) for key in node["health"] if key.isdigit()]  # "host" is not a GPU
    return max([claimed, *(gpu + 1 for gpu in indexes)])


def alert_colours_gpu(alert: dict[str, Any], gpu: int) -> bool:
    """Whether an open alert (alert_json) on a node colours this GPU's tile: the GPU it names
    alone; none for an alert about a rank whose GPU is unknown (one slow rank must not paint
    its whole node); every GPU for a node-wide alert. overview.js applies the same rule."""
    if alert["gpu"] is not None:
        return alert["gpu"] == gpu
    return alert["rank"] is None


def node_tiles(
    *, node: dict[str, Any], alerts: list[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    """One tile per GPU of a node (node_health_list's shape; the first MAX_GPUS of them)
    with its state: down (node down, silent, or a heartbeat alert), cordoned (cordoned or
    draining), nodata (no GPU reading), else the worse of the GPU's own health and the
    severity of the open alerts that colour it (alert_colours_gpu)."""
    mine = [a for a in alerts if a["node"] == node["node"] and a["state"] in OPEN_STATES]
    silent = node["last_seen"] is None or now - node["last_seen"] > HEALTH_RULES["silent_down_s"]
    down = node["state"] == NodeState.DOWN or silent or any(a["kind"] == "heartbeat" for a in mine)
    cordoned = node["state"] in (NodeState.CORDONED, NodeState.DRAINING)
    tiles = []
    for gpu in range(min(node_gpu_count(node), MAX_GPUS)):
        values = node["health"].get(str(gpu))
        if down:
            state = "down"
        elif cordoned:
            state = "cordoned"
        elif values is None:
            state = "nodata"
        else:
            state = gpu_health(values)
            for alert in mine:
                if alert_colours_gpu(alert, gpu):
                    state = _worse(state, alert["severity"])
        tiles.append({"gpu": gpu, "state": state, "values": values or {}})
    return tiles
