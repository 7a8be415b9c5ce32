"""The maintenance ledger read back (docs/contract.md, "Reading back"): one node's, and the
fleet's costliest nodes and GPUs. The fleet page and its exports read the same selector."""

import time
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from pydantic import field_validator

from apps.access.auth import reader_auth
from apps.access.selectors import (
    clusters_readable,
    node_only,
    nodes_visible_named,
    request_cluster_filter,
)
from apps.core.db_router import replica_reads
from apps.core.errors import Errors, FieldError
from apps.core.params import CLUSTER_MAX_LENGTH
from apps.dashboard.selectors.ledger import DAYS_KEPT, LEDGER_DAYS, fleet_ledger_json, node_ledger
from apps.dashboard.selectors.report import run_report
from apps.runs.selectors import run_get

router = Router(tags=["reading back"])


class LedgerQuery(Schema):
    days: int = Field(default=LEDGER_DAYS[0], description="the window: 7, 30 or 90 days")
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )

    @field_validator("days")
    @classmethod
    def days_kept(cls, value: int) -> int:
        if value not in LEDGER_DAYS:
            raise ValueError(DAYS_KEPT)
        return value


class ClusterQuery(Schema):
    cluster: str | None = Field(
        default=None, max_length=CLUSTER_MAX_LENGTH, description="for a logged-in user"
    )


class XidCount(Schema):
    code: int
    count: int
    meaning: str


class LedgerRowOut(Schema):
    findings: dict[str, int]
    critical: int
    xid: list[XidCount]
    ecc_errors: int
    thermal_minutes: float
    power_minutes: float
    straggler: int
    restarts: int
    rollbacks: int
    gpu_hours_lost: float = Field(
        description="its restarts' lost work and its root-caused incidents' GPU-hours"
    )


class GpuLedgerOut(LedgerRowOut):
    gpu: int


class NodeLedgerOut(LedgerRowOut):
    maintenance: int = Field(description="stays in maintenance it was sent to in the window")
    repeat: int = Field(
        description="returns to service in the window followed by a critical finding within "
        "LEDGER_REPEAT_DAYS: a repeat offender"
    )
    in_maintenance: bool
    node: str
    cluster: str
    days: int
    gpus: list[GpuLedgerOut]


class FleetNodeOut(NodeLedgerOut):
    trend: int = Field(description="its findings less those of the window before")


class FleetGpuOut(GpuLedgerOut):
    node: str
    cluster: str


class FleetLedgerOut(Schema):
    days: int
    nodes: list[FleetNodeOut]
    gpus: list[FleetGpuOut]


@router.get(
    "/nodes/{name}/ledger",
    auth=reader_auth,
    response={200: NodeLedgerOut, 400: Errors, 401: Errors, 404: Errors},
)
@replica_reads
def node_ledger_read(request: HttpRequest, name: str, query: Query[LedgerQuery]):
    """The node's maintenance debt over the last `days`: findings by kind, XID (with the
    catalog's meaning) and ECC counts, thermal and power-throttle minutes, times it was the
    straggler, the restarts and rollbacks it caused; the same per GPU."""
    nodes = nodes_visible_named(request, name, query.cluster).select_related("cluster")
    node = node_only(list(nodes[:2]))
    return node_ledger(node=node, days=query.days, now=time.time()).to_dict()


@router.get(
    "/runs/{name}/report",
    auth=reader_auth,
    response={200: dict[str, Any], 400: Errors, 401: Errors, 404: Errors},
)
@replica_reads
def run_report_read(request: HttpRequest, name: str, query: Query[ClusterQuery]):
    """The run's reliability report (docs/operations.md): goodput and badput, interruptions
    by root cause with the GPU-hours each lost since its last durable checkpoint, its
    incidents by root cause with the GPU-hours they lost, checkpoint cadence against
    Young/Daly's optimum, and the nodes that cost it most."""
    run = run_get(name=name, **request_cluster_filter(request, query.cluster))
    if run is None:  # as GET /api/v1/runs/NAME answers
        raise FieldError(404, "name", "no such run")
    return run_report(run=run)


@router.get("/ledger", auth=reader_auth, response={200: FleetLedgerOut, 400: Errors, 401: Errors})
@replica_reads
def fleet_ledger_read(request: HttpRequest, query: Query[LedgerQuery]):
    """The costliest nodes and GPUs of the clusters the reader may see (at most 100 each),
    costliest first: repeat offences, critical findings, restarts caused, throttled minutes."""
    clusters = list(clusters_readable(request, query.cluster))
    return fleet_ledger_json(clusters=clusters, days=query.days, now=time.time())
