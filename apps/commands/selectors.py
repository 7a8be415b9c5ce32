from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from apps.clusters.models import Cluster, Node
from apps.commands.choices import DELIVERED_KINDS, CommandState
from apps.commands.models import Command, CommandTransition
from apps.runs.choices import RunState
from apps.runs.models import Run, RunEvent, StepReport
from apps.runs.selectors import step_reports

# A node serves a run when it reported one of the run's last NODES_STEPS steps (as
# apps.runs.selectors does for the run summary).
NODES_STEPS = 10


def _served(*, run_ref: str, last_step_ref: str, **node: Any) -> Exists:
    return Exists(
        StepReport.objects.filter(
            run_id=OuterRef(run_ref), step__gt=OuterRef(last_step_ref) - NODES_STEPS, **node
        )
    )


def _deliverable(*, stale: datetime, kinds: Collection[str] | None = None) -> QuerySet[Command]:
    """Live commands an agent may receive now: issued ones, and delivered ones last handed
    out before `stale`, of the delivered kinds (only `kinds` of them, when given)."""
    wanted = DELIVERED_KINDS if kinds is None else DELIVERED_KINDS & frozenset(kinds)
    return (
        Command.objects.filter(kind__in=wanted)
        .filter(expires_at__gt=timezone.now())
        .filter(
            Q(state=CommandState.ISSUED) | Q(state=CommandState.DELIVERED, delivered_at__lt=stale)
        )
    )


def commands_pending(
    *,
    cluster_id: int,
    node_name: str,
    stale: datetime,
    kinds: Collection[str] | None = None,
    run: str | None = None,
) -> list[Command]:
    """The live commands an agent polling as `node_name` should get, oldest first: those
    addressed to the node, and those of a run it serves that name no node. Issued ones, and
    delivered ones last handed out before `stale`; only `kinds` when given, and only those
    of the run named `run` when given (a poller serving one run of a shared node)."""
    served = _served(
        run_ref="run_id",
        last_step_ref="run__last_step",
        node__name=node_name,
        node__cluster_id=cluster_id,
    )
    deliverable = _deliverable(stale=stale, kinds=kinds)
    if run is not None:
        deliverable = deliverable.filter(run__name=run)
    return list(
        deliverable.filter(cluster_id=cluster_id)
        .filter(Q(node__name=node_name) | Q(node__isnull=True, run__isnull=False) & served)
        .select_related("run", "node")
        .order_by("issued_at")
    )


def command_handed_to(*, command: Command) -> set[str]:
    """The nodes a command was meant for or handed to: its own node, and every node whose
    poll received it (first delivery and redeliveries, from its history)."""
    handed = set(
        CommandTransition.objects.filter(
            command_id=command.pk, to_state=CommandState.DELIVERED, detail__has_key="node"
        ).values_list("detail__node", flat=True)
    )
    if command.node_id is not None:
        handed.add(command.node.name)
    return handed


def run_serving_node_names(*, run_id: int) -> list[str]:
    """The nodes that reported one of the run's last NODES_STEPS steps: those a run command
    naming no node may reach."""
    run = Run.objects.filter(pk=run_id).values_list("cluster_id", "last_step").first()
    if run is None or run[1] is None:
        return []
    reports = StepReport.objects.filter(
        run_id=run_id, node_id=OuterRef("pk"), step__gt=run[1] - NODES_STEPS
    )
    return list(
        Node.objects.filter(cluster_id=run[0])
        .filter(Exists(reports))
        .values_list("name", flat=True)
    )


def commands_deliverable_targets(*, stale: datetime) -> list[tuple[int, str, str]]:
    """(cluster id, node name, kind) for each command an agent could receive now, a run
    command naming no node once per node serving its run: whom a long-poll's safety net
    wakes."""
    targets: list[tuple[int, str, str]] = []
    rows = _deliverable(stale=stale).values_list("cluster_id", "node__name", "run_id", "kind")
    for cluster_id, node_name, run_id, kind in rows:
        if node_name is not None:
            targets.append((cluster_id, node_name, kind))
        elif run_id is not None:
            names = run_serving_node_names(run_id=run_id)
            targets.extend((cluster_id, name, kind) for name in names)
    return targets


def node_runs(*, node: Node) -> list[Run]:
    """The running runs the node serves."""
    served = _served(run_ref="pk", last_step_ref="last_step", node_id=node.pk)
    return list(
        Run.objects.filter(cluster_id=node.cluster_id, state=RunState.RUNNING)
        .filter(served)
        .order_by("name")
    )


@dataclass
class CheckpointRanks:
    """Who reported what for one checkpoint step (rank None: an event without a rank)."""

    started: set[int | None] = field(default_factory=set)
    durable: set[int | None] = field(default_factory=set)
    failed: set[int | None] = field(default_factory=set)
    # Ranks active around the step (a report among the NODES_STEPS steps up to it) with
    # neither a checkpoint event of the step nor a later step stored: whether they save is
    # not known yet (their reports and events may still be on the way).
    unsettled: set[int | None] = field(default_factory=set)


def checkpoint_ranks(*, run_id: int, step: int) -> CheckpointRanks:
    seen = CheckpointRanks()
    events = RunEvent.objects.filter(run_id=run_id, kind="checkpoint", step=step)
    for rank, tier, state in events.values_list("rank", "data__tier", "data__state"):
        if state == "failed":
            seen.failed.add(rank)
        elif tier == "durable" and state == "started":
            seen.started.add(rank)
        elif tier == "durable" and state == "completed":
            seen.durable.add(rank)
    # raw and compacted alike: a checkpoint's step may be older than the raw window
    reports = step_reports(
        run_id=run_id,
        fields=("step", "rank"),
        step_lo=step - NODES_STEPS,
        step_hi=step + NODES_STEPS,
    )
    ranks = {r["rank"] for r in reports if r["step"] <= step}
    with_event = set(events.values_list("rank", flat=True))
    moved_on = {r["rank"] for r in reports if r["step"] > step}
    seen.unsettled = ranks - with_event - moved_on
    return seen


def command_get(*, command_id: Any, clusters: QuerySet[Cluster] | None = None) -> Command | None:
    """The command, if it is in one of `clusters` (None: any)."""
    commands = Command.objects.select_related("cluster", "run", "node", "issued_by")
    if clusters is not None:
        commands = commands.filter(cluster__in=clusters)
    return commands.filter(pk=command_id).first()


def command_list(
    *,
    clusters: QuerySet[Cluster],
    run: str | None = None,
    node: str | None = None,
    state: str | None = None,
    limit: int = 200,
) -> list[Command]:
    """The commands of these clusters, newest first."""
    commands = Command.objects.filter(cluster__in=clusters)
    if run:
        commands = commands.filter(run__name=run)
    if node:
        commands = commands.filter(node__name=node)
    if state:
        commands = commands.filter(state=state)
    return list(
        commands.select_related("cluster", "run", "node", "issued_by")
        .prefetch_related("transitions")
        .order_by(F("issued_at").desc())[:limit]
    )


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


def command_json(command: Command) -> dict[str, Any]:
    """The API's view of a command, with its history of transitions."""
    return {
        "id": str(command.pk),
        "kind": command.kind,
        "cluster": command.cluster.name,
        "run": command.run.name if command.run else None,
        "node": command.node.name if command.node else None,
        "args": command.args,
        "reason": command.reason,
        "state": command.state,
        "issued_by": command.issued_by.username if command.issued_by else None,
        "issued_at": command.issued_at.timestamp(),
        "expires_at": command.expires_at.timestamp(),
        "delivered_at": _ts(command.delivered_at),
        "accepted_at": _ts(command.accepted_at),
        "finished_at": _ts(command.finished_at),
        "result": command.result,
        "parent": str(command.parent_id) if command.parent_id else None,
        "history": [
            {
                "from_state": t.from_state or None,
                "to_state": t.to_state,
                "at": t.at.timestamp(),
                "detail": t.detail,
            }
            for t in command.transitions.all()
        ],
    }
