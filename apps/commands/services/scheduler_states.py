"""The scheduler's word on its nodes: each cluster's state hook (`ClusterHooks.state_argv`,
such as `sinfo -h -N -o "%N %T %E"`) prints one "NODE STATE [REASON]" line per node; a node
the scheduler reports down becomes `down` (by the scheduler, with its reason), and back
`active` when it reports it up again (docs/actions.md, "The scheduler's node states").

Run by the beat task `commands.scheduler_states_poll_all`, which sends one
`commands.scheduler_states_poll` (cluster id) per cluster with a state hook, on the periodic
queue. The hook runs like the other hooks (hook machinery: no shell, its timeout, the whole
process group killed on timeout). Output that does not parse, or a hook that fails, changes
nothing: it is logged, and audited when the failure starts and when it ends.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.audit.choices import ActorKind, Outcome
from apps.audit.services import audit_record
from apps.clusters.choices import NodeDownBy, NodeState
from apps.clusters.models import Node
from apps.clusters.services import node_mark_down, node_mark_up
from apps.commands.choices import NODE_NAME_PATTERN
from apps.commands.models import ClusterHooks
from apps.commands.services.node_commands import CARRY_OUT_LOCK
from apps.commands.services.nodes import HookResult, argv_run
from apps.core.tasks import task_enqueue
from apps.live.services import live_mark_dirty

logger = logging.getLogger(__name__)

SCHEDULER_STATES_POLL_TASK = "commands.scheduler_states_poll"
# The advisory lock (first key; the second is the cluster's id) that keeps one state hook
# of a cluster running at a time: a poll that finds it taken returns.
STATES_LOCK = 0x0B0C

# Scheduler states that mean "no job can run there" (lower case; Slurm's long names as
# `sinfo %T` prints them, flags joined by "+", such as "idle+drain"): down, failed or
# failing, drained or draining (a drain Opsboard did not ask for: a node Opsboard drained is
# cordoned or draining here, and keeps that state), not responding; Kubernetes' NotReady.
DOWN_STATES = frozenset(
    {"down", "fail", "failing", "drain", "drained", "draining", "not_responding",
     "no_respond", "notready"}
)  # fmt: skip
# Slurm's state suffixes: "*" is "not responding" (down whatever the state); the others
# ("~" powered off, "#" powering up, "$" maintenance, "@" reboot pending, "!" / "%" powering
# down, "-" planned) say nothing about the node's health.
NOT_RESPONDING = "*"
_STATE = re.compile(r"^[A-Za-z_][A-Za-z0-9_+]*[*~#$@!%^-]*$")
_NODE = re.compile(NODE_NAME_PATTERN)
MAX_LINES = 100_000
# The reason as stored and shown: control characters become spaces; Slurm's word for "no
# reason" is "none".
REASON_MAX_LENGTH = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
NO_REASON = frozenset({"", "none", "(null)"})


class StatesUnparseable(ValueError):
    """The hook's output is not "NODE STATE [REASON]" lines: nothing is changed."""


@dataclass(frozen=True)
class SchedulerReport:
    """What the scheduler says of one node: down or not, and why (its words, or "")."""

    down: bool
    reason: str = ""


def scheduler_states_parse(output: str) -> dict[str, SchedulerReport]:
    """Node name → the scheduler's report, from "NODE STATE [REASON]" lines (blank lines
    ignored; the reason is the rest of the line). A node listed more than once (sinfo -N
    lists it per partition) is down if any line says so, for the first reason given.
    Raises StatesUnparseable naming the first bad line."""
    reports: dict[str, SchedulerReport] = {}
    lines = output.splitlines()
    if len(lines) > MAX_LINES:
        raise StatesUnparseable(f"{len(lines)} lines, more than {MAX_LINES}")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split(None, 2)
        if len(fields) < 2 or not _NODE.match(fields[0]) or not _STATE.match(fields[1]):
            raise StatesUnparseable(f'line {number} is not "NODE STATE": {line[:200]!r}')
        name, state = fields[:2]
        reason = _reason(fields[2] if len(fields) == 3 else "")
        earlier = reports.get(name, SchedulerReport(down=False))
        down = earlier.down or scheduler_state_is_down(state)
        reports[name] = SchedulerReport(down=down, reason=earlier.reason or reason)
    return reports


def _reason(text: str) -> str:
    text = _CONTROL.sub(" ", text).strip()
    return "" if text.lower() in NO_REASON else text[:REASON_MAX_LENGTH]


def scheduler_state_is_down(state: str) -> bool:
    """Whether a scheduler state (one "STATE" field) says no job can run on the node."""
    if NOT_RESPONDING in state:
        return True
    flags = state.rstrip("*~#$@!%^-").lower().split("+")
    return any(flag in DOWN_STATES for flag in flags)


def scheduler_states_poll_all() -> int:
    """Beat's part: send one poll per cluster that has a state hook. Returns how many."""
    clusters = ClusterHooks.objects.exclude(state_argv=[]).values_list("cluster_id", flat=True)
    sent = 0
    for cluster_id in clusters:
        try:
            task_enqueue(SCHEDULER_STATES_POLL_TASK, cluster_id)
        except Exception:  # the broker's errors are many; the next pass sends it again
            logger.warning("state hook poll of cluster %s not enqueued", cluster_id)
            continue
        sent += 1
    return sent


def scheduler_states_poll(*, cluster_id: int) -> dict[str, Any]:
    """Run the cluster's state hook and apply it: `active` nodes the scheduler reports down
    become `down` (by the scheduler); nodes it marked down that it reports up are `active`.
    Cordoned and draining nodes keep their state, nodes it does not list are left as they
    are, and a node whose commands are being carried out (its hook running) waits for the
    next poll. One poll per cluster at a time (a second returns "busy"). Returns a summary:
    {"down": [names], "up": [names]} or {"error": why} or {"skipped": why}."""
    hooks = ClusterHooks.objects.select_related("cluster").filter(cluster_id=cluster_id).first()
    if hooks is None or not hooks.state_argv:
        return {"skipped": "no state hook"}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [STATES_LOCK, cluster_id])
        if not cursor.fetchone()[0]:
            return {"skipped": "busy"}
    try:
        return _poll(hooks)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [STATES_LOCK, cluster_id])


def _poll(hooks: ClusterHooks) -> dict[str, Any]:
    # the states before the hook ran: a node whose state changed while it ran (an uncordon
    # carried out meanwhile) is left to the next poll, which reads the scheduler after it
    before = dict(Node.objects.filter(cluster_id=hooks.cluster_id).values_list("name", "state"))
    if isinstance(hooks.state_argv, list):
        argv = [str(item) for item in hooks.state_argv]
        result = argv_run(argv=argv, timeout_s=hooks.timeout_s)
    else:  # written past the admin's clean()
        argv = []
        result = HookResult(argv=argv, exit_code=None, error="state_argv is not a JSON list")
    error = result.error or ("" if result.ok else f"exited with {result.exit_code}")
    reported: dict[str, SchedulerReport] = {}
    if not error:
        try:
            reported = scheduler_states_parse(result.stdout)
        except StatesUnparseable as unparseable:
            error = f"unparseable output: {unparseable}"
    _outcome_record(hooks, result, error)
    if error:
        return {"error": error}
    changed: dict[str, list[str]] = {"down": [], "up": []}
    nodes = Node.objects.filter(cluster_id=hooks.cluster_id, name__in=list(reported))
    for node in nodes.select_related("cluster"):
        if node.state != before.get(node.name):
            continue
        move = _node_apply(node=node, report=reported[node.name], argv=argv, result=result)
        if move:
            changed[move].append(node.name)
    return changed


def _node_apply(
    *, node: Node, report: SchedulerReport, argv: list[str], result: HookResult
) -> str | None:
    down, by_scheduler = report.down, node.down_by == NodeDownBy.SCHEDULER
    if down and node.state == NodeState.DOWN and by_scheduler:
        _reason_update(node, report.reason)
        return None
    if down and node.state != NodeState.ACTIVE:
        return None
    if not down and not (node.state == NodeState.DOWN and node.down_by == NodeDownBy.SCHEDULER):
        return None
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [CARRY_OUT_LOCK, node.pk])
            if not cursor.fetchone()[0]:
                return None  # a cordon, uncordon or drain of it is being carried out
        if down:
            moved = node_mark_down(node_id=node.pk, by=NodeDownBy.SCHEDULER, reason=report.reason)
        else:
            moved = node_mark_up(node_id=node.pk, by=NodeDownBy.SCHEDULER)
        if not moved:
            return None
        said = "the scheduler reports it " + ("down" if down else "up")
        audit_record(
            action="node.down" if down else "node.up",
            outcome=Outcome.SUCCEEDED,
            actor_kind=ActorKind.SCHEDULER,
            actor_name=_actor_name(argv),
            cluster=node.cluster,
            target=f"node:{node.name}",
            reason=f"{said}: {report.reason}" if down and report.reason else said,
            detail={"hook": argv, "lines": _lines_of(result.stdout, node.name)},
        )
        _live_refresh(node)
    return "down" if down else "up"


def _reason_update(node: Node, reason: str) -> None:
    """A node the scheduler keeps down under a new reason (a person edited it in Slurm):
    the reason shown follows; the node's state is unchanged, so nothing is audited."""
    if reason == node.down_reason:
        return
    changed = Node.objects.filter(
        pk=node.pk, state=NodeState.DOWN, down_by=NodeDownBy.SCHEDULER
    ).update(down_reason=reason)
    if changed:
        _live_refresh(node)


def _live_refresh(node: Node) -> None:
    key = {(node.cluster_id, node.pk)}
    transaction.on_commit(lambda: live_mark_dirty(nodes=key), robust=True)


def _outcome_record(hooks: ClusterHooks, result: HookResult, error: str) -> None:
    """Note the run on the hooks row; audit a failure when it starts and when it ends."""
    previous = hooks.state_error
    ClusterHooks.objects.filter(pk=hooks.pk).update(
        state_checked_at=timezone.now(), state_error=error
    )
    if error:
        logger.warning("state hook of cluster %s changed nothing: %s", hooks.cluster, error)
    if bool(error) == bool(previous):
        return
    audit_record(
        action="node.state_hook",
        outcome=Outcome.FAILED if error else Outcome.SUCCEEDED,
        actor_kind=ActorKind.SYSTEM,
        actor_name=_actor_name(result.argv),
        cluster=hooks.cluster,
        target=f"cluster:{hooks.cluster.name}",
        reason=error or f"works again (it failed: {previous})",
        detail={"hook": result.to_dict()},
    )


def _actor_name(argv: list[str]) -> str:
    # the program, past `env NAME=VALUE ...` in front of it (apps.commands.presets)
    program = next(
        (a for a in argv if os.path.basename(a) != "env" and "=" not in a), argv[0] if argv else "-"
    )
    return f"scheduler state hook ({os.path.basename(program)})"[:150]


def _lines_of(output: str, name: str) -> list[str]:
    return [line for line in output.splitlines() if line.split()[:1] == [name]][:10]
