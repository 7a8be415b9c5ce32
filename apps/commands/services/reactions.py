"""What follows from a command's progress: drains step on, checkpoints are judged, commands
expire. Called from the state machine, the ack, and the periodic sweep (never from ingest)."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef
from django.utils import timezone

from apps.audit.choices import ActorKind, AuditAction, Outcome
from apps.audit.services import audit_record
from apps.clusters.choices import NodeState
from apps.clusters.models import Node
from apps.commands.choices import LIVE_STATES, CommandKind, CommandState
from apps.commands.models import Command
from apps.commands.selectors import node_runs
from apps.commands.services.checkpoints import checkpoint_evaluate
from apps.commands.services.core import CommandConflict, command_move, command_transition
from apps.commands.services.issue import command_issue
from apps.commands.services.node_commands import node_commands_resend
from apps.commands.services.nodes import HookFailed, node_cordon, node_drain_settle
from apps.runs.choices import RunState
from apps.runs.models import Run
from apps.runs.services import RUN_RESUME_AFTER_S, run_mark_running, run_mark_stopped

SYSTEM = {"user": None, "actor_kind": "policy", "actor_name": "drain"}
EXPIRY_ACTOR = "expiry sweep"


def drain_start(*, command: Command, node: Node, actor: dict[str, Any]) -> Command:
    """Cordon the node as `draining` (drain hook first), then ask each run on it for a
    checkpoint; each stop follows its checkpoint's success (command_finished). With no run
    on the node the drain is done at once."""
    try:
        hook = node_cordon(
            node=node, reason=command.reason, state=NodeState.DRAINING, hook="drain", **actor
        )
    except HookFailed as failed:
        hook_failed = {"hook": failed.result.to_dict()}
        return command_move(command, CommandState.FAILED, hook_failed)
    runs = node_runs(node=node)
    hook_result = {"hook": hook.to_dict() if hook else None, "runs": [run.name for run in runs]}
    command = command_move(command, CommandState.ACCEPTED, hook_result)
    # the drain's deadline is its phases': the checkpoint's, then the stop's
    phases = timedelta(
        seconds=settings.COMMANDS_DRAIN_CHECKPOINT_S + settings.COMMANDS_DRAIN_STOP_S
    )
    Command.objects.filter(pk=command.pk, state__in=LIVE_STATES).update(
        expires_at=timezone.now() + phases
    )
    for run in runs:
        _child(command, CommandKind.CHECKPOINT, run)
    if not runs:
        command = command_move(command, CommandState.SUCCEEDED, {"runs": []})
    return command


def command_finished(*, command: Command) -> None:
    """A command reached a terminal state: set its run's state (stop, resume), step its
    drain on, or settle a finished drain."""
    if command.state == CommandState.SUCCEEDED:
        run_state_follow(command=command)
    if command.kind == CommandKind.DRAIN:
        node_drain_settle(node_id=command.node_id)
        return
    if command.parent_id is not None:
        drain_step(drain=Command.objects.get(pk=command.parent_id))


def on_command_ended(sender: Any, *, command: Command, **kwargs: Any) -> None:
    """core.command_ended receiver (apps.py): command_finished."""
    command_finished(command=command)


def drain_step(*, drain: Command) -> Command:
    """Take an accepted drain as far as its children allow, judged from their states alone
    (so the sweep may call it again for a reaction that never ran): a succeeded checkpoint
    gets its stop, a failed or expired checkpoint or stop fails the drain, and the drain
    succeeds once every run's stop succeeded. A drain no longer accepted is left as it is: a
    checkpoint that succeeds after its drain ended sends no stop."""
    if drain.state != CommandState.ACCEPTED:
        return drain
    children = list(drain.children.select_related("run").order_by("issued_at"))
    stopping = {child.run_id for child in children if child.kind == CommandKind.STOP}
    for child in children:
        if child.state in (CommandState.FAILED, CommandState.EXPIRED):
            detail = {child.kind: str(child.pk), "run": child.run.name}
            return command_move(drain, CommandState.FAILED, detail)
        if (
            child.kind == CommandKind.CHECKPOINT
            and child.state == CommandState.SUCCEEDED
            and child.run_id not in stopping
        ):
            _child(drain, CommandKind.STOP, child.run, node_id=drain.node_id)
    if _all_stopped(drain):
        return command_move(
            drain, CommandState.SUCCEEDED, {"stopped": drain.result.get("runs", [])}
        )
    return drain


def run_state_follow(*, command: Command) -> bool:
    """A succeeded stop makes its run `stopped` once no other stop of the run is still live
    (a run stopped node by node, as a drain's stops or per-node stops are, is stopped when
    the last supervisor acked); a succeeded resume makes it `running` again. Returns whether
    the run changed."""
    if command.run_id is None:
        return False
    if command.kind == CommandKind.STOP:
        stops = Command.objects.filter(run_id=command.run_id, kind=CommandKind.STOP)
        if stops.filter(state__in=LIVE_STATES).exists():
            return False
        # a run_end from the job going down counts as the stop's from the first stop of
        # this round (the stops that overlapped this one) on
        since = stops.filter(
            state=CommandState.SUCCEEDED, finished_at__gte=command.issued_at
        ).aggregate(first=Min("issued_at"))["first"]
        return run_mark_stopped(
            run_id=command.run_id, since=since or command.issued_at, at=command.finished_at
        )
    if command.kind == CommandKind.RESUME:
        return run_mark_running(run_id=command.run_id)
    return False


def runs_state_replay(*, now: datetime) -> int:
    """Runs that do not follow their newest stop or resume that succeeded within the last
    COMMANDS_RUN_REPLAY_S: the command's end committed and the run's update after it did
    not (a process or Postgres died between the two, and the agent's repeated ack is a
    no-op that reacts to nothing). Judged from the run as it is: a run that stepped more
    than RUN_RESUME_AFTER_S after its stop came back by itself (ingest made it running), and
    one that ended after its resume ended for real; both are left alone. Returns how many
    runs changed."""
    recent = (
        Command.objects.filter(
            kind__in=[CommandKind.STOP, CommandKind.RESUME],
            state=CommandState.SUCCEEDED,
            finished_at__gte=now - timedelta(seconds=settings.COMMANDS_RUN_REPLAY_S),
            run__isnull=False,
        )
        .order_by("run_id", "-finished_at")
        .distinct("run_id")
        .select_related("run")
    )
    changed = 0
    for command in recent:
        if _run_follows(command.run, command):
            continue
        changed += run_state_follow(command=command)
    return changed


def _run_follows(run: Run, command: Command) -> bool:
    """Whether `run` is as its stop or resume `command` left it, or moved on since."""
    finished = command.finished_at
    if finished is None:  # never so for a succeeded command
        return True
    if command.kind == CommandKind.STOP:
        came_back = run.last_step_at is not None and run.last_step_at > finished + timedelta(
            seconds=RUN_RESUME_AFTER_S
        )
        # a run that ended before the stop was issued keeps its end (run_mark_stopped)
        ended_before = run.ended_at is not None and run.ended_at < command.issued_at
        return run.state == RunState.STOPPED or came_back or ended_before
    ended_since = run.ended_at is not None and run.ended_at > finished
    return run.state == RunState.RUNNING or ended_since


def _all_stopped(drain: Command) -> bool:
    runs = set(drain.result.get("runs", []))
    stopped = set(
        drain.children.filter(kind=CommandKind.STOP, state=CommandState.SUCCEEDED).values_list(
            "run__name", flat=True
        )
    )
    return runs <= stopped


def _child(drain: Command, kind: str, run: Run, node_id: int | None = None) -> Command:
    """A drain's own checkpoint or stop: one per run (its idempotency key says so), due
    within its phase's deadline; the drain lives at least as long as its newest phase."""
    node = Node.objects.get(pk=node_id) if node_id else None
    child, created = command_issue(
        cluster=drain.cluster,
        kind=kind,
        run=run,
        node=node,
        reason=drain.reason,
        args={"drain": str(drain.pk), **({"node": node.name} if node else {})},
        idempotency_key=f"drain:{drain.pk}:{kind}:{run.pk}",
        parent=drain,
        **SYSTEM,
    )
    if created:
        deadline = child.issued_at + timedelta(seconds=_phase_s(kind))
        Command.objects.filter(pk=child.pk, state__in=LIVE_STATES).update(expires_at=deadline)
        Command.objects.filter(pk=drain.pk, state__in=LIVE_STATES, expires_at__lt=deadline).update(
            expires_at=deadline
        )
    return child


def _phase_s(kind: str) -> float:
    if kind == CommandKind.CHECKPOINT:
        return settings.COMMANDS_DRAIN_CHECKPOINT_S
    return settings.COMMANDS_DRAIN_STOP_S


def command_expire(*, command_id: uuid.UUID | str) -> bool:
    """Expire a live command; whether this call did (False: it was expired already). The
    expiry is audited (`command.expire` by the system) in the same transaction. Raises
    CommandConflict when the command finished meanwhile."""
    with transaction.atomic():
        command, moved = command_transition(command_id=command_id, to_state=CommandState.EXPIRED)
        if moved:
            audit_record(
                action=AuditAction.COMMAND_EXPIRE,
                outcome=Outcome.SUCCEEDED,
                actor_kind=ActorKind.SYSTEM,
                actor_name=EXPIRY_ACTOR,
                cluster=command.cluster,
                target=f"command:{command.pk}",
                detail={"kind": command.kind, "expires_at": command.expires_at.timestamp()},
            )
    return moved


def commands_sweep() -> dict[str, int]:
    """Beat's pass: expire the live commands past expires_at, judge accepted checkpoints,
    send node commands whose task was lost again, and re-run the reactions of accepted
    drains and of recent stops and resumes (a crash between a command's commit and its
    reaction loses nothing)."""
    now = timezone.now()
    expired = judged = 0
    late = Command.objects.filter(
        state__in=[CommandState.ISSUED, CommandState.DELIVERED, CommandState.ACCEPTED],
        expires_at__lte=now,
    ).values_list("pk", flat=True)
    for pk in list(late):
        with contextlib.suppress(CommandConflict):  # finished meanwhile
            expired += command_expire(command_id=pk)
    accepted = Command.objects.filter(kind=CommandKind.CHECKPOINT, state=CommandState.ACCEPTED)
    for command in accepted:
        judged += checkpoint_evaluate(command=command).state != CommandState.ACCEPTED
    stepped = 0
    for drain in Command.objects.filter(kind=CommandKind.DRAIN, state=CommandState.ACCEPTED):
        stepped += drain_step(drain=drain).state != CommandState.ACCEPTED
    settled = drains_settle()
    resent = node_commands_resend()
    return {
        "expired": expired,
        "judged": judged,
        "drains": stepped,
        "settled": settled,
        "resent": resent,
        "runs": runs_state_replay(now=now),
    }


def drains_settle() -> int:
    """Nodes still draining though no drain of theirs is live (the drain's end committed,
    its settling did not) end cordoned, as command_finished would have left them."""
    live = Command.objects.filter(
        node_id=OuterRef("pk"), kind=CommandKind.DRAIN, state__in=LIVE_STATES
    )
    stuck = Node.objects.filter(state=NodeState.DRAINING).filter(~Exists(live))
    return stuck.update(state=NodeState.CORDONED)
