"""The resume plan (`GET /api/v1/runs/NAME/plan`, the resume form, a resume command's
defaults): the newest durable checkpoint the run's ranks agree on, and its healthy nodes.

A checkpoint's path becomes every rank's `OPSBOARD_RESUME_FROM`, so no single node may choose
it: a durable checkpoint of step S is used only when
- every durable event of S that names a path names the same one;
- no rank reported a failed save of S, and every rank that started a durable save of S
  completed it;
- ranks reported steps within NODES_STEPS of S (a step the run never reached is nobody's
  checkpoint), and it is not a lone node's claim: when those reports come from several
  nodes, the completions come from more than half of them.
Otherwise the plan goes on to the next older checkpoint and lists the one it passed over,
with why, under `skipped`: shown to the operator, never used.

The plan's nodes are those that served the run and are `active`; the others (down,
cordoned, draining) leave it and are listed under `nodes_skipped` with why. A down node's
ranks cannot finish a save: one of them that started a save and never completed it makes
the checkpoint skipped, the why naming its node as down. Its completed durable saves stay
as good as any rank's (a durable checkpoint is on shared storage, not on the node), so a
run can resume elsewhere from what it saved before its node went down.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import Exists, Max, OuterRef

from apps.clusters.choices import NodeDownBy, NodeState
from apps.clusters.models import Node
from apps.commands.selectors import NODES_STEPS
from apps.runs.models import Run, RunEvent, StepReport
from apps.runs.step_reads import step_reports

# How many of the newest checkpoints with a durable completion are weighed, at most.
CANDIDATES = 10


@dataclass(frozen=True)
class CheckpointEvent:
    rank: int | None
    node_id: int
    state: str  # started | completed | failed
    path: str | None


def checkpoint_verdict(
    *,
    events: list[CheckpointEvent],
    served_nodes: set[int],
    down_nodes: Callable[[], Mapping[int, str]] | None = None,
) -> str | None:
    """Why the durable checkpoint these events describe may not be used; None if it may.
    `down_nodes()` (node id → name; asked only when a why could name one) names the down
    nodes in the why."""
    paths = {event.path for event in events if event.path is not None}
    if len(paths) > 1:
        return f"its ranks name {len(paths)} different paths"
    failed = sorted({e.rank for e in events if e.state == "failed"}, key=str)
    if failed:
        return f"rank {failed[0]} failed to save it"
    completed = {e.rank for e in events if e.state == "completed"}
    unfinished = sorted({e.rank for e in events if e.state == "started"} - completed, key=str)
    if unfinished:
        why = f"rank {unfinished[0]} started saving it and has not completed"
        node_id = next(e.node_id for e in events if e.rank == unfinished[0])
        down = down_nodes() if down_nodes else {}
        if node_id in down:
            why += f" (its node {down[node_id]} is down)"
        return why
    claimants = {e.node_id for e in events if e.state == "completed"}
    if len(served_nodes) > 1 and 2 * len(claimants & served_nodes) <= len(served_nodes):
        return (
            f"completed on {len(claimants & served_nodes)} of the {len(served_nodes)} nodes "
            "that ran it: one node's claim is not enough"
        )
    return None


def _candidates(run: Run) -> dict[int, list[CheckpointEvent]]:
    """The CANDIDATES newest checkpoints with a durable completion, newest first, with every
    durable or failed checkpoint event of each: one query."""
    durable = RunEvent.objects.filter(run=run, kind="checkpoint")
    # newest by when they completed, not by step: after a restart from an older checkpoint
    # the run's steps go back, and a higher step of the old timeline is not the newest
    newest = (
        durable.filter(data__tier="durable", data__state="completed", step__isnull=False)
        .values("step")
        .annotate(latest=Max("ts"))
        .order_by("-latest")
        .values("step")[:CANDIDATES]
    )
    rows = durable.filter(step__in=newest).values_list(
        "step", "rank", "node_id", "data__tier", "data__state", "data__path", "ts"
    )
    found: dict[int, list[CheckpointEvent]] = defaultdict(list)
    latest: dict[int, float] = {}
    for step, rank, node_id, tier, state, path, ts in rows:
        if state == "failed" or tier == "durable":
            found[step].append(CheckpointEvent(rank, node_id, state, path))
        if state == "completed" and tier == "durable":
            latest[step] = max(latest.get(step, 0.0), ts.timestamp())
    return {step: found[step] for step in sorted(latest, key=latest.__getitem__, reverse=True)}


def _served_nodes(run: Run, step: int) -> set[int]:
    """The nodes whose ranks reported steps around `step`: those that took part in it."""
    reports = step_reports(
        run_id=run.pk,
        fields=("node_id",),
        step_lo=step - NODES_STEPS,
        step_hi=step + NODES_STEPS,
    )
    return {report["node_id"] for report in reports}


def plan_checkpoint(*, run: Run) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(the checkpoint the plan uses or None, the newer ones it passed over and why). Weighs
    the newest first and stops at the first usable one: one more query in the usual case."""
    skipped = []

    @functools.cache
    def down() -> dict[int, str]:  # a query only for a save some rank left unfinished
        found = Node.objects.filter(cluster_id=run.cluster_id, state=NodeState.DOWN)
        return dict(found.values_list("pk", "name"))

    for step, events in _candidates(run).items():
        path = next((e.path for e in events if e.path is not None), None)
        served = _served_nodes(run, step)
        if not served:
            why: str | None = f"no rank reported steps around step {step}"
        else:
            why = checkpoint_verdict(events=events, served_nodes=served, down_nodes=down)
        if why is None:
            return {"step": step, "path": path, "tier": "durable"}, skipped
        skipped.append({"step": step, "path": path, "why": why})
    return None, skipped


def run_plan(*, run: Run) -> dict[str, Any]:
    """The contract's plan: the newest durable checkpoint the ranks agree on (see the module
    docstring), those passed over, the nodes that served the run that are healthy (active:
    not cordoned, draining or down) and those that served it and are not, with why."""
    checkpoint, skipped = plan_checkpoint(run=run)
    nodes: list[str] = []
    nodes_skipped: list[dict[str, str]] = []
    if run.last_step is not None:
        served = StepReport.objects.filter(
            run_id=run.pk, node_id=OuterRef("pk"), step__gt=run.last_step - NODES_STEPS
        )
        rows = (
            Node.objects.filter(cluster_id=run.cluster_id)
            .filter(Exists(served))
            .order_by("name")
            .values_list("name", "state", "down_by", "down_reason", "cordon_reason")
        )
        for name, state, down_by, down_reason, cordon_reason in rows:
            if state == NodeState.ACTIVE:
                nodes.append(name)
            else:
                why = _NOT_ACTIVE.get(down_by if state == NodeState.DOWN else state, state)
                reason = down_reason if state == NodeState.DOWN else cordon_reason
                if reason:
                    why += f": {reason}"
                nodes_skipped.append({"node": name, "state": state, "why": why})
    return {
        "run": run.name,
        "checkpoint": checkpoint,
        "nodes": nodes,
        "skipped": skipped,
        "nodes_skipped": nodes_skipped,
    }


# Why a node that served the run is not in its plan (by its state; a down one by who said so)
_NOT_ACTIVE = {
    NodeDownBy.HEARTBEAT: "down: it went silent (heartbeat)",
    NodeDownBy.SCHEDULER: "down: the scheduler reports it down",
    "": "down",
    NodeState.CORDONED: "cordoned",
    NodeState.DRAINING: "draining",
    NodeState.MAINTENANCE: "in maintenance",
}
