"""Issuing commands (permission, audit, idempotency), delivering them, acknowledgements."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.access.selectors import user_may
from apps.audit.choices import Outcome
from apps.audit.services import audit_record
from apps.clusters.models import Cluster, Node
from apps.commands.choices import (
    IDEMPOTENCY_SYSTEM,
    NODE_KINDS,
    RUN_KINDS,
    CommandKind,
    CommandState,
)
from apps.commands.models import Command, CommandTransition, MaintenanceVisit
from apps.commands.plan import run_plan
from apps.commands.selectors import commands_pending
from apps.commands.services.checkpoints import checkpoint_evaluate
from apps.commands.services.core import (
    CommandConflict,
    IdempotencyMismatch,
    command_create,
    command_transition,
    request_fingerprint,
)
from apps.commands.services.node_commands import (
    NodeBusy,
    node_admit,
    node_command_enqueue_on_commit,
)
from apps.commands.wakeups import commands_wake_on_commit
from apps.runs.models import Run


class CommandDenied(Exception):
    """The user may not operate on this cluster: 403."""


class CommandInvalid(Exception):
    """The command names no fitting target: 400 with `loc`."""

    def __init__(self, loc: str, msg: str) -> None:
        super().__init__(msg)
        self.loc, self.msg = loc, msg


def command_issue(
    *,
    user,
    cluster: Cluster,
    kind: str,
    run: Run | None = None,
    node: Node | None = None,
    args: dict | None = None,
    reason: str = "",
    idempotency_key: str,
    request=None,
    actor_kind: str = "user",
    actor_name: str = "",
    parent: Command | None = None,
) -> tuple[Command, bool]:
    """Issue a command (or find the one this idempotency key made: created False).

    `user` None is the system acting (a drain's own steps, a policy), named by actor_kind
    and actor_name; its keys live in the system scope, a user's in the scope of the user or
    of the personal token the request came with (idempotency_scope). The key is bound to
    kind, target and args: another request with it raises IdempotencyMismatch. Every
    attempt is audited: a denied one (CommandDenied), an invalid one (CommandInvalid,
    IdempotencyMismatch: outcome `invalid`) too. Node kinds are carried out here: cordon /
    uncordon end succeeded or failed (a failing scheduler hook fails the command), a drain
    cordons and checkpoints the node's runs."""
    target = f"run:{run.name}" if run is not None else f"node:{node.name}" if node else ""
    audit = {
        "actor_user": user,
        "actor_kind": actor_kind,
        "actor_name": actor_name,
        "cluster": cluster,
        "target": target,
        "reason": reason,
        "request": request,
    }
    try:
        _validate(cluster=cluster, kind=kind, run=run, node=node, reason=reason)
    except CommandInvalid as invalid:
        _audit_invalid(kind=kind, audit=audit, loc=invalid.loc, msg=invalid.msg)
        raise
    if user is not None and not user_may(user=user, cluster=cluster, action="operate"):
        audit_record(action=f"command.{kind}", outcome=Outcome.DENIED, **audit)
        raise CommandDenied(f"you may not operate on cluster {cluster.name}")
    # the key is bound to the request as asked (resume's args before the plan fills them)
    fingerprint = request_fingerprint(
        kind=kind, run_id=getattr(run, "pk", None), node_id=getattr(node, "pk", None), args=args
    )
    if kind == CommandKind.RESUME:
        args = _resume_args(run=run, args=args or {})
    scope = idempotency_scope(user=user, request=request)
    try:
        with transaction.atomic():  # a node's admission lock lasts until its command exists
            folded = _admit(node=node, kind=kind, idempotency_key=idempotency_key, scope=scope)
            command, created = folded or command_create(
                cluster_id=cluster.pk,
                kind=kind,
                idempotency_key=idempotency_key,
                idempotency_scope=scope,
                fingerprint=fingerprint,
                run_id=run.pk if run else None,
                node_id=node.pk if node else None,
                args=args,
                reason=reason,
                issued_by_id=getattr(user, "pk", None),
                parent_id=parent.pk if parent else None,
            )
    except IdempotencyMismatch as mismatch:
        _audit_invalid(kind=kind, audit=audit, loc="Idempotency-Key", msg=str(mismatch),
                       command=str(mismatch.command.pk))  # fmt: skip
        raise
    except NodeBusy as busy:
        audit_record(
            action=f"command.{kind}", outcome="denied", detail={"refused": str(busy)}, **audit
        )
        raise
    audit_record(
        action=f"command.{kind}",
        outcome=Outcome.ALLOWED,
        detail={"command": str(command.pk), "created": created},
        **audit,
    )
    if created and kind in NODE_KINDS:
        node_command_enqueue_on_commit(command=command)
    elif created:
        commands_wake_on_commit(command=command)
    return command, created


def idempotency_scope(*, user: Any, request: Any = None) -> str:
    """Whose idempotency keys these are: the personal token a request came with, else the
    user; the system's own (no user) live apart from every request's."""
    if user is None:
        return IDEMPOTENCY_SYSTEM
    token = getattr(request, "user_token", None)
    return f"token:{token.pk}" if token is not None else f"user:{user.pk}"


def command_invalid_record(
    *,
    user: Any,
    kind: str,
    loc: str,
    msg: str,
    cluster: Cluster | None = None,
    target: str = "",
    reason: str = "",
    request: Any = None,
) -> None:
    """Audit a command refused as invalid before it reached command_issue (the API's and the
    pages' own checks: no target, a target named ambiguously, a form that does not validate):
    outcome `invalid`, naming the field."""
    audit = {"actor_user": user, "cluster": cluster, "target": target, "reason": reason,
             "request": request}  # fmt: skip
    _audit_invalid(kind=kind, audit=audit, loc=loc, msg=msg)


def _audit_invalid(*, kind: str, audit: dict[str, Any], loc: str, msg: str, **detail) -> None:
    audit_record(
        action=f"command.{kind}",
        outcome=Outcome.INVALID,
        detail={"loc": loc, "msg": msg, **detail},
        **audit,
    )


def _admit(
    *, node: Node | None, kind: str, idempotency_key: str, scope: str
) -> tuple[Command, bool] | None:
    """A node command's admission (node_commands.node_admit): the live drain a new drain
    folds into, as (drain, False), or None."""
    if node is None or kind not in NODE_KINDS:
        return None
    drain = node_admit(node=node, kind=kind, idempotency_key=idempotency_key, scope=scope)
    return (drain, False) if drain is not None else None


def _validate(
    *, cluster: Cluster, kind: str, run: Run | None, node: Node | None, reason: str
) -> None:
    if kind in RUN_KINDS and run is None:
        raise CommandInvalid("run", f"a {kind} command names a run")
    if kind in NODE_KINDS and node is None:
        raise CommandInvalid("node", f"a {kind} command names a node")
    if kind not in RUN_KINDS | NODE_KINDS:
        raise CommandInvalid("kind", f"unknown kind {kind!r}")
    if node is not None and not reason.strip() and _needs_note(kind, node):
        raise CommandInvalid("reason", _NOTE_NEEDED[kind])
    if run is not None and run.cluster_id != cluster.pk:
        raise CommandInvalid("run", "the run is in another cluster")
    if node is not None and node.cluster_id != cluster.pk:
        raise CommandInvalid("node", "the node is in another cluster")


# Maintenance is on the record: why a node went, and what was done before it came back.
_NOTE_NEEDED = {
    CommandKind.MAINTENANCE: "sending a node to maintenance takes a reason",
    CommandKind.UNCORDON: "returning a node from maintenance takes a note of what was done",
}


def _needs_note(kind: str, node: Node) -> bool:
    if kind == CommandKind.MAINTENANCE:
        return True
    if kind != CommandKind.UNCORDON:
        return False
    # its stay, not its state: a node in maintenance that was cordoned again is still there
    return MaintenanceVisit.objects.filter(node=node, returned_at__isnull=True).exists()


def _resume_args(*, run: Run, args: dict[str, Any]) -> dict[str, Any]:
    """What the operator left out comes from the run's plan (its newest durable checkpoint,
    its healthy nodes)."""
    plan = run_plan(run=run)
    filled = dict(args)
    if "checkpoint" not in filled and plan["checkpoint"]:
        filled["checkpoint"] = plan["checkpoint"]["path"]
        filled.setdefault("step", plan["checkpoint"]["step"])
    filled.setdefault("nodes", plan["nodes"])
    return filled


def commands_deliver(
    *,
    cluster_id: int,
    node_name: str,
    kinds: Collection[str] | None = None,
    run: str | None = None,
) -> list[Command]:
    """The commands pending for the node that this call hands out: issued ones become
    delivered; delivered ones unacknowledged for COMMANDS_REDELIVER_AFTER_S go out again (an
    agent restarted or lost the answer). Racing polls hand each out once: a conditional
    UPDATE decides. With `kinds`, commands of other kinds are left as they are (a second
    poller on the node takes them); with `run`, so are other runs' commands (two runs may
    share a node: each one's poller takes only its own)."""
    now = timezone.now()
    stale = now - timedelta(seconds=settings.COMMANDS_REDELIVER_AFTER_S)
    handed = []
    pending = commands_pending(
        cluster_id=cluster_id, node_name=node_name, stale=stale, kinds=kinds, run=run
    )
    for command in pending:
        if command.state == CommandState.ISSUED:
            try:
                command, moved = command_transition(
                    command_id=command.pk,
                    to_state=CommandState.DELIVERED,
                    detail={"node": node_name},
                )
            except CommandConflict:  # acknowledged or expired meanwhile
                continue
        else:
            moved = _redeliver(command=command, node_name=node_name, now=now)
        if moved:
            handed.append(command)
    return handed


def _redeliver(*, command: Command, node_name: str, now) -> bool:
    """Hand a delivered command out again, if no other poll did meanwhile; its history
    records which node got it (a node-bound token may acknowledge only what its nodes got)."""
    with transaction.atomic():
        moved = Command.objects.filter(
            pk=command.pk, state=CommandState.DELIVERED, delivered_at=command.delivered_at
        ).update(delivered_at=now)
        if moved:
            CommandTransition.objects.create(
                command=command,
                from_state=CommandState.DELIVERED,
                to_state=CommandState.DELIVERED,
                at=now,
                detail={"node": node_name, "redelivered": True},
            )
    return bool(moved)


def command_ack_refused(*, command: Command, state: str, outcome: str, why: str, request) -> None:
    """Record an acknowledgement the API refused before it reached the state machine: a
    node-bound token acking what its nodes were not handed (denied), a checkpoint accepted
    without its step (invalid)."""
    audit_record(
        action="command.ack",
        outcome=outcome,
        actor_kind="agent",
        cluster=command.cluster,
        target=f"command:{command.pk}",
        detail={"state": state, "why": why},
        request=request,
    )


def command_ack(
    *,
    command: Command,
    state: str,
    message: str = "",
    step: int | None = None,
    ranks: list[int] | None = None,
    actor_name: str = "",
    request=None,
) -> Command:
    """An agent's acknowledgement. Raises CommandConflict for a move backwards. An accepted
    checkpoint naming its step is judged at once against the events already stored."""
    result: dict[str, Any] = {"message": message} if message else {}
    if step is not None:
        result["step"] = step
    if ranks is not None:
        result["ranks"] = ranks
    audit = {
        "action": "command.ack",
        "actor_kind": "agent",
        "actor_name": actor_name,
        "cluster": command.cluster,
        "target": f"command:{command.pk}",
        "detail": {"state": state, **result},
        "request": request,
    }
    try:
        command, moved = command_transition(
            command_id=command.pk, to_state=state, detail={"ack": True, **result}, result=result
        )
    except CommandConflict:
        audit_record(outcome="denied", **audit)
        raise
    audit_record(outcome="succeeded" if moved else "allowed", **audit)
    if command.kind == CommandKind.CHECKPOINT and command.state == CommandState.ACCEPTED:
        command = checkpoint_evaluate(command=command)
    return command
