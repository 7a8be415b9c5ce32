"""What detectors see and what they say: plain frozen dataclasses, no Django.

A service (apps/alerts) loads a window of recent data through selectors into these types,
calls the detectors with `now`, and keeps the findings as alerts. Detectors are pure: the
same window and `now` always give the same findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

Severity = Literal["warning", "critical"]


class StepRow(NamedTuple):
    """One rank's report of one training step (the contract's `steps` record).

    A named tuple, not a frozen dataclass like the rest: a window holds one per rank and
    step (33 k for 256 ranks), and a dataclass's __init__ (one object.__setattr__ a field)
    cost a cluster's pass 70 ms of its 150 ms budget where a tuple costs 8 ms. It is as
    immutable, reads the same (`row.step_time`), and `row._replace(...)` copies it."""

    node: str
    rank: int
    step: int
    ts: float
    step_time: float
    data_time: float | None = None
    h2d_time: float | None = None
    compute_time: float | None = None
    comm_wait: float | None = None
    tokens: int | None = None
    loss: float | None = None
    grad_checksum: str | None = None
    param_checksum: str | None = None
    canary_norm: float | None = None
    canary_proj: tuple[float, ...] | None = None
    shard: str | None = None
    gpu: int | None = None  # the rank's GPU index on its node, when the report named it


@dataclass(frozen=True)
class EventRow:
    """An agent event: checkpoint, restart, oom, xid, ecc, error, log."""

    ts: float
    kind: str
    node: str
    run: str | None = None
    step: int | None = None
    rank: int | None = None
    gpu: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)  # tier, state, code, count, ...


@dataclass(frozen=True)
class Series:
    """Points of one telemetry series, oldest first; gpu None for host-wide metrics."""

    node: str
    metric: str
    gpu: int | None
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class NodeSeen:
    """When the server last heard from a node, and its usual gap between batches."""

    node: str
    last_seen: float | None
    batch_interval: float | None  # median seconds between its recent batches
    state: str = "active"  # active | cordoned | draining | down


@dataclass(frozen=True)
class RunWindow:
    """A run's recent step reports (all ranks, oldest first) and events."""

    run: str
    world_size: int
    started_at: float | None
    steps: tuple[StepRow, ...]
    events: tuple[EventRow, ...]
    rank_nodes: Mapping[int, str] = field(default_factory=dict)  # rank → node
    # `steps` grouped by step number (what common.by_step would build), when the loader
    # keeps them between passes: an unchanged step is the same list from pass to pass, so
    # its per-step results carry over (common.StepResults). Never changed once handed over.
    by_step: Mapping[int, list[StepRow]] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ClusterWindow:
    """Everything the detectors of one cluster look at, at one moment."""

    cluster: str
    runs: tuple[RunWindow, ...]
    telemetry: tuple[Series, ...]
    nodes: tuple[NodeSeen, ...]
    events: tuple[EventRow, ...]  # node events (xid, ecc, oom, ...) in the window


@dataclass(frozen=True)
class Finding:
    """A condition a detector sees now. `subject` is stable while the condition lasts (it
    keys the alert: one open alert per (kind, subject)); `evidence` is plain JSON."""

    kind: str  # straggler, sdc, input_bound, hang, checkpoint_stale, checkpoint_upload,
    # oom_risk, oom, thermal, power, xid, ecc, heartbeat, fabric
    subject: str  # e.g. "run:llama/rank:13", "node:node-02/gpu:3", "node:node-05"
    severity: Severity
    summary: str  # one sentence naming the culprit, e.g. "rank 13 on node-02 computes 31% …"
    run: str | None = None
    node: str | None = None
    rank: int | None = None
    gpu: int | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    since: float | None = None  # when the condition began, as far as the window shows
