"""The fleet's maintenance debt: a ledger per node and per GPU over the last 7, 30 or 90 days
(docs/operations.md, "The maintenance ledger").

What a ledger row counts, each from what the server already keeps:

- `findings`: the alerts that were open at some moment of the window, by kind (one alert is
  one finding however long it lasted); `critical` of them critical.
- `xid` (by code, with the catalog's meaning) and `ecc` (the errors the events counted):
  the node's `xid` and `ecc` events in the window.
- `thermal_min` and `power_min`: the minutes its `thermal` and `power` alerts were open,
  clipped to the window.
- `straggler`: how many times it was named the straggler (its `straggler` alerts).
- `maintenance` (node rows): its stays in maintenance sent in the window, `in_maintenance`
  whether it is there now, and `repeat`: its returns to service in the window followed by a
  critical finding within LEDGER_REPEAT_DAYS (a repeat offender: back and failing again).
- `restarts` and `rollbacks`: the run restarts it caused. A `restart` event is laid at the
  door of the newest critical alert of that run that was open when the job restarted, or had
  resolved within RESTART_CAUSE_S before; a restart caused by silent corruption (`sdc`) is a
  rollback (the job went back to a checkpoint from before the corruption).
- `gpu_hours_lost`: the badput split by culprit. The work its restarts lost (since the
  newest durable checkpoint before each, on every rank's GPU, as the run's reliability
  report counts it), plus the GPU-hours of the incidents whose root cause it is (their
  stragglers' and stalls' cost, as the incident's page and API give it).

A row per GPU holds what named that GPU; the node's own row holds everything of the node,
its GPUs included. The cost that ranks the fleet: repeat offences, then GPU-hours lost, then
critical findings, then restarts, then throttled minutes. Reads are scoped to the clusters
given (the caller's visible ones).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections

from apps.alerts.selectors.incidents import incident_gpu_hours_lost, incident_members
from apps.clusters.models import Cluster, Node
from apps.core.db_router import read_alias
from apps.core.times import to_datetime
from detectors.xid import xid_info

LEDGER_DAYS = (7, 30, 90)
DAYS_KEPT = f"one of {', '.join(map(str, LEDGER_DAYS))}"
RESTART_CAUSE_S = 600
FLEET_ROWS_MAX = 100

_ALERTS_SQL = """
SELECT a.node_id, a.gpu, a.kind, count(*), count(*) FILTER (WHERE a.severity = 'critical'),
       sum(date_part('epoch', LEAST(COALESCE(a.resolved_at, %(now)s), %(now)s)
                              - GREATEST(a.opened_at, %(since)s)))
FROM alerts_alert a
WHERE a.cluster_id = ANY(%(clusters)s) AND a.node_id IS NOT NULL
  AND (%(node)s::bigint IS NULL OR a.node_id = %(node)s)
  AND a.opened_at < %(now)s AND COALESCE(a.resolved_at, %(now)s) > %(since)s
GROUP BY 1, 2, 3
"""

# Counts are bounded at ingest (apps.core.bounds); a value of another JSON type counts as 1.
_EVENTS_SQL = """
SELECT e.node_id, e.gpu, e.kind,
       CASE WHEN e.kind = 'xid' AND jsonb_typeof(e.data -> 'code') = 'number'
            THEN (e.data ->> 'code')::numeric::bigint END,
       count(*),
       sum(CASE WHEN jsonb_typeof(e.data -> 'count') = 'number'
                THEN (e.data ->> 'count')::numeric ELSE 1 END)
FROM runs_runevent e
WHERE e.cluster_id = ANY(%(clusters)s) AND e.kind IN ('xid', 'ecc')
  AND (%(node)s::bigint IS NULL OR e.node_id = %(node)s)
  AND e.ts >= %(since)s AND e.ts < %(now)s
GROUP BY 1, 2, 3, 4
"""

# A restart's cause (`e`: a row with run_id and ts): the newest critical alert of its run that
# was open when the job restarted, or had resolved within %(cause)s seconds before. The ledger
# and the run's reliability report (selectors.report) lay restarts at the same doors.
RESTART_CAUSE = """
SELECT a.id, a.node_id, a.gpu, a.kind, a.summary, a.evidence FROM alerts_alert a
WHERE a.run_id = e.run_id AND a.severity = 'critical' AND a.node_id IS NOT NULL
  AND a.opened_at <= e.ts
  AND (a.resolved_at IS NULL OR a.resolved_at >= e.ts - %(cause)s * interval '1 second')
ORDER BY a.opened_at DESC, a.id DESC LIMIT 1
"""

# The work a restart lost: since the newest durable checkpoint completed before it (else the
# run's start), on every rank's GPU (the run's reliability report counts it the same way).
_RESTARTS_SQL = f"""
SELECT cause.node_id, cause.gpu, cause.kind,
       r.world_size * date_part('epoch', e.ts - COALESCE(saved.ts, r.created_at)) / 3600
FROM runs_runevent e
JOIN runs_run r ON r.id = e.run_id
CROSS JOIN LATERAL ({RESTART_CAUSE}) cause
LEFT JOIN LATERAL (
  SELECT c.ts FROM runs_runevent c
  WHERE c.run_id = e.run_id AND c.kind = 'checkpoint' AND c.ts <= e.ts
    AND c.data ->> 'tier' = 'durable' AND c.data ->> 'state' = 'completed'
  ORDER BY c.ts DESC LIMIT 1
) saved ON true
WHERE e.cluster_id = ANY(%(clusters)s) AND e.kind = 'restart' AND e.run_id IS NOT NULL
  AND (%(node)s::bigint IS NULL OR cause.node_id = %(node)s)
  AND e.ts >= %(since)s AND e.ts < %(now)s
"""

_VISITS_SQL = """
SELECT v.node_id,
       count(*) FILTER (WHERE v.sent_at >= %(since)s AND v.sent_at < %(now)s),
       count(*) FILTER (WHERE v.returned_at >= %(since)s AND v.returned_at < %(now)s
         AND EXISTS (SELECT 1 FROM alerts_alert a
                     WHERE a.node_id = v.node_id AND a.severity = 'critical'
                       AND a.opened_at > v.returned_at AND a.opened_at < %(now)s
                       AND a.opened_at <= v.returned_at + %(repeat)s * interval '1 day')),
       bool_or(v.returned_at IS NULL)
FROM commands_maintenancevisit v
WHERE v.cluster_id = ANY(%(clusters)s)
  AND (%(node)s::bigint IS NULL OR v.node_id = %(node)s)
  AND (v.returned_at IS NULL OR v.returned_at >= %(since)s)
GROUP BY 1
"""

# The incidents whose root cause is the node (or its GPU) that were open in the window: their
# GPU-hours lost (apps.alerts.selectors.incidents, the number their page and API give) are
# the node's.
_INCIDENTS_SQL = """
SELECT i.id, n.id, i.root_gpu
FROM alerts_incident i
JOIN clusters_node n ON n.cluster_id = i.cluster_id AND n.name = i.root_node
WHERE i.cluster_id = ANY(%(clusters)s) AND i.root_node <> ''
  AND (%(node)s::bigint IS NULL OR n.id = %(node)s)
  AND i.opened_at < %(now)s AND COALESCE(i.resolved_at, %(now)s) > %(since)s
"""


@dataclass
class LedgerRow:
    """One node's (gpu None) or one GPU's debt over a window."""

    node_id: int
    gpu: int | None
    findings: dict[str, int] = field(default_factory=dict)
    critical: int = 0
    xid: dict[int, int] = field(default_factory=dict)
    ecc: int = 0
    thermal_s: float = 0.0
    power_s: float = 0.0
    restarts: int = 0
    rollbacks: int = 0
    maintenance: int = 0
    repeat: int = 0
    in_maintenance: bool = False
    gpu_hours_lost: float = 0.0

    @property
    def straggler(self) -> int:
        return self.findings.get("straggler", 0)

    @property
    def cost(self) -> tuple[int, float, int, int, float, int]:
        """What ranks the fleet, costliest first when sorted in reverse."""
        throttled = self.thermal_s + self.power_s
        lost = round(self.gpu_hours_lost, 4)
        return (self.repeat, lost, self.critical, self.restarts, throttled, self.total)

    @property
    def noted(self) -> bool:
        """Whether anything is on the ledger (a node only in maintenance is)."""
        noted = self.total or self.xid or self.ecc or self.restarts or self.maintenance
        return bool(noted) or self.in_maintenance or self.gpu_hours_lost > 0

    @property
    def total(self) -> int:
        return sum(self.findings.values())

    def add(self, other: LedgerRow) -> None:
        for kind, count in other.findings.items():
            self.findings[kind] = self.findings.get(kind, 0) + count
        for code, count in other.xid.items():
            self.xid[code] = self.xid.get(code, 0) + count
        self.critical += other.critical
        self.ecc += other.ecc
        self.thermal_s += other.thermal_s
        self.power_s += other.power_s
        self.restarts += other.restarts
        self.rollbacks += other.rollbacks
        self.maintenance += other.maintenance
        self.repeat += other.repeat
        self.in_maintenance |= other.in_maintenance
        self.gpu_hours_lost += other.gpu_hours_lost

    def to_dict(self) -> dict[str, Any]:
        stays = {"maintenance": self.maintenance, "repeat": self.repeat}
        return {
            "gpu": self.gpu,
            "findings": dict(sorted(self.findings.items())),
            "critical": self.critical,
            "xid": [
                {"code": code, "count": count, "meaning": xid_info(code).meaning}
                for code, count in sorted(self.xid.items())
            ],
            "ecc_errors": self.ecc,
            "thermal_minutes": round(self.thermal_s / 60, 1),
            "power_minutes": round(self.power_s / 60, 1),
            "straggler": self.straggler,
            "restarts": self.restarts,
            "rollbacks": self.rollbacks,
            "gpu_hours_lost": round(self.gpu_hours_lost, 4),
            **(stays | {"in_maintenance": self.in_maintenance} if self.gpu is None else {}),
        }


@dataclass
class NodeLedger:
    """A node's ledger: its own row (everything of the node) and one row per GPU named."""

    node: Node
    days: int
    total: LedgerRow
    gpus: list[LedgerRow]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node.name,
            "cluster": self.node.cluster.name,
            "days": self.days,
            **{k: v for k, v in self.total.to_dict().items() if k != "gpu"},
            "gpus": [row.to_dict() for row in self.gpus],
        }


def node_ledger(*, node: Node, days: int, now: float) -> NodeLedger:
    """The node's ledger over the `days` before `now`. Four queries."""
    rows = _rows([node.cluster_id], days, now, node_id=node.id)
    return _ledger_of(node, days, rows)


def fleet_ledgers(
    *, clusters: Sequence[Cluster], days: int, now: float, limit: int = FLEET_ROWS_MAX
) -> list[NodeLedger]:
    """The costliest nodes of `clusters` over the `days` before `now`, costliest first (at
    most `limit`; nodes with nothing in the window are left out). Five queries."""
    rows = _rows([c.id for c in clusters], days, now, node_id=None)
    node_ids = {row.node_id for row in rows}
    nodes = Node.objects.using(read_alias()).select_related("cluster").in_bulk(node_ids)
    ledgers = [
        _ledger_of(nodes[node_id], days, [r for r in rows if r.node_id == node_id])
        for node_id in node_ids
        if node_id in nodes
    ]
    ledgers = [ledger for ledger in ledgers if ledger.total.noted]
    ledgers.sort(key=lambda ledger: (ledger.total.cost, ledger.node.name), reverse=True)
    return ledgers[:limit]


def fleet_gpus(ledgers: Iterable[NodeLedger], limit: int = FLEET_ROWS_MAX) -> list[tuple]:
    """The costliest GPUs of the ledgers: (node, row), costliest first."""
    found = [(ledger.node, row) for ledger in ledgers for row in ledger.gpus]
    found.sort(key=lambda pair: (pair[1].cost, pair[0].name, -(pair[1].gpu or 0)), reverse=True)
    return found[:limit]


def fleet_ledger_json(*, clusters: Sequence[Cluster], days: int, now: float) -> dict[str, Any]:
    """The fleet's ledger as the API, the fleet page and its exports all give it: the
    costliest nodes and GPUs, each with `trend`, its findings against the window before."""
    ledgers = fleet_ledgers(clusters=clusters, days=days, now=now)
    before = {
        ledger.node.id: ledger.total.total
        for ledger in fleet_ledgers(
            clusters=clusters, days=days, now=now - days * 86_400, limit=10**9
        )
    }
    return {
        "days": days,
        "nodes": [
            {**ledger.to_dict(), "trend": ledger.total.total - before.get(ledger.node.id, 0)}
            for ledger in ledgers
        ],
        "gpus": [
            {**row.to_dict(), "node": node.name, "cluster": node.cluster.name}
            for node, row in fleet_gpus(ledgers)
        ],
    }


def ledger_csv_rows(fleet: dict[str, Any]) -> list[list[Any]]:
    """The fleet ledger as CSV rows: a header, then each node's row followed by its GPUs'."""
    header = ["cluster", "node", "gpu", "findings", "critical", "xid", "ecc_errors"]
    header += ["thermal_minutes", "power_minutes", "straggler", "restarts", "rollbacks"]
    header += ["gpu_hours_lost", "maintenance", "repeat"]
    out: list[list[Any]] = [header]
    for node in fleet["nodes"]:
        for row in [node, *node["gpus"]]:
            out.append(
                [
                    node["cluster"],
                    node["node"],
                    row.get("gpu"),
                    sum(row["findings"].values()),
                    row["critical"],
                    " ".join(f"{x['code']}x{x['count']}" for x in row["xid"]),
                    row["ecc_errors"],
                    row["thermal_minutes"],
                    row["power_minutes"],
                    row["straggler"],
                    row["restarts"],
                    row["rollbacks"],
                    row["gpu_hours_lost"],
                    row.get("maintenance", ""),
                    row.get("repeat", ""),
                ]
            )
    return out


def days_valid(text: str | None, default: int = LEDGER_DAYS[0]) -> int | None:
    """`?days=` as one of LEDGER_DAYS; the default when absent, None when another value."""
    if not text:
        return default
    return int(text) if text.isdigit() and int(text) in LEDGER_DAYS else None


def _ledger_of(node: Node, days: int, rows: list[LedgerRow]) -> NodeLedger:
    total = LedgerRow(node_id=node.id, gpu=None)
    for row in rows:
        total.add(row)
    gpus = sorted((r for r in rows if r.gpu is not None), key=lambda r: r.gpu or 0)
    return NodeLedger(node=node, days=days, total=total, gpus=gpus)


def _rows(cluster_ids: list[int], days: int, now: float, *, node_id: int | None) -> list[LedgerRow]:
    """One LedgerRow per (node, gpu) with anything in the window; a node's maintenance
    stays on its own row (gpu None)."""
    params = {
        "clusters": cluster_ids,
        "node": node_id,
        "now": to_datetime(now),
        "since": to_datetime(now) - timedelta(days=days),
        "cause": RESTART_CAUSE_S,
        "repeat": settings.LEDGER_REPEAT_DAYS,
    }
    found: dict[tuple[int, int | None], LedgerRow] = {}

    def row(node: int, gpu: int | None) -> LedgerRow:
        return found.setdefault((node, gpu), LedgerRow(node_id=node, gpu=gpu))

    with connections[read_alias()].cursor() as cursor:
        cursor.execute(_ALERTS_SQL, params)
        for node, gpu, kind, count, critical, open_s in cursor.fetchall():
            entry = row(node, gpu)
            entry.findings[kind] = count
            entry.critical += critical
            if kind == "thermal":
                entry.thermal_s += open_s or 0.0
            elif kind == "power":
                entry.power_s += open_s or 0.0
        cursor.execute(_EVENTS_SQL, params)
        for node, gpu, kind, code, count, errors in cursor.fetchall():
            entry = row(node, gpu)
            if kind == "xid" and code is not None:
                entry.xid[code] = entry.xid.get(code, 0) + count
            elif kind == "ecc":
                entry.ecc += int(errors)
        cursor.execute(_RESTARTS_SQL, params)
        for node, gpu, kind, lost in cursor.fetchall():
            entry = row(node, gpu)
            entry.restarts += 1
            entry.rollbacks += kind == "sdc"
            entry.gpu_hours_lost += max(0.0, lost or 0.0)
        cursor.execute(_VISITS_SQL, params)
        for node, sent, repeat, staying in cursor.fetchall():
            entry = row(node, None)
            entry.maintenance, entry.repeat, entry.in_maintenance = sent, repeat, staying
        cursor.execute(_INCIDENTS_SQL, params)
        rooted = cursor.fetchall()
    members = incident_members(incident_ids=[incident for incident, _, _ in rooted])
    for incident, node, gpu in rooted:
        row(node, gpu).gpu_hours_lost += incident_gpu_hours_lost(members.get(incident, []))
    return list(found.values())
