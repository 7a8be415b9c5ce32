"""The command state machine: idempotent creation and conditional transitions."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.dispatch import Signal
from django.utils import timezone

from apps.commands.choices import (
    ALLOWED_PREVIOUS,
    IDEMPOTENCY_SYSTEM,
    STATE_TIMESTAMP,
    TERMINAL_STATES,
)
from apps.commands.models import Command, CommandTransition
from apps.commands.services.broadcast import command_broadcast_on_commit

# Sent (with `command`) when command_transition moved a command to a terminal state, before
# the page hears of it. Its receiver, reactions.on_command_ended (connected in apps.py),
# steps drains on and follows run states; the reactions sit above this module and call into
# it, so it announces rather than imports them.
command_ended = Signal()


class CommandConflict(Exception):
    """A move the state machine refuses (backwards, or out of a terminal state): 409."""

    def __init__(self, command: Command, to_state: str) -> None:
        super().__init__(f"command is {command.state}: it cannot become {to_state}")
        self.command, self.to_state = command, to_state


class IdempotencyMismatch(Exception):
    """The idempotency key already names a command made for another request (another kind,
    target or args): 422, as the IETF Idempotency-Key draft recommends."""

    def __init__(self, command: Command) -> None:
        super().__init__(
            "this Idempotency-Key was sent with another request (kind, target or args): "
            "use a new key"
        )
        self.command = command


def request_fingerprint(
    *, kind: str, run_id: int | None, node_id: int | None, args: dict | None
) -> str:
    """What a key is bound to: a digest of the command's kind, target and args as asked."""
    asked = {"kind": str(kind), "run": run_id, "node": node_id, "args": args or {}}
    return hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()


def command_create(
    *,
    cluster_id: int,
    kind: str,
    idempotency_key: str,
    idempotency_scope: str = IDEMPOTENCY_SYSTEM,
    fingerprint: str = "",
    run_id: int | None = None,
    node_id: int | None = None,
    args: dict | None = None,
    reason: str = "",
    issued_by_id: int | None = None,
    parent_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> tuple[Command, bool]:
    """The command this key names in the cluster and scope: the existing one (created False)
    or a new issued one (created True). Two requests racing with one key make one command:
    the unique constraint decides, and the loser reads the winner's row.

    `fingerprint` (request_fingerprint; computed from kind, target and args when empty) binds
    the key: a live key sent with another fingerprint raises IdempotencyMismatch. A key of a
    user or token scope lives COMMANDS_IDEMPOTENCY_TTL_S after its command was issued; then
    it is retired (a conditional UPDATE) and names a new command. System keys never expire."""
    now = now or timezone.now()
    fingerprint = fingerprint or request_fingerprint(
        kind=kind, run_id=run_id, node_id=node_id, args=args
    )
    live = Command.objects.filter(
        cluster_id=cluster_id,
        idempotency_scope=idempotency_scope,
        idempotency_key=idempotency_key,
        idempotency_live=True,
    )
    found = live.first()
    if found is not None and not _key_expired(found, now):
        return _same_request(found, fingerprint), False
    if found is not None:
        # racing reusers both retire it (the second finds nothing left): the insert decides
        live.filter(pk=found.pk).update(idempotency_live=False)
    try:
        with transaction.atomic():
            command = Command.objects.create(
                cluster_id=cluster_id,
                kind=kind,
                run_id=run_id,
                node_id=node_id,
                args=args or {},
                reason=reason,
                idempotency_key=idempotency_key,
                idempotency_scope=idempotency_scope,
                idempotency_fingerprint=fingerprint,
                issued_by_id=issued_by_id,
                parent_id=parent_id,
                issued_at=now,
                expires_at=now + timedelta(seconds=settings.COMMANDS_EXPIRE_AFTER_S),
            )
            CommandTransition.objects.create(
                command=command, from_state="", to_state=command.state, at=now
            )
    except IntegrityError:
        found = live.first()
        if found is None:
            raise
        return _same_request(found, fingerprint), False
    command_broadcast_on_commit(command_id=command.pk)
    return command, True


def _key_expired(command: Command, now: datetime) -> bool:
    if command.idempotency_scope == IDEMPOTENCY_SYSTEM:
        return False
    ttl = timedelta(seconds=settings.COMMANDS_IDEMPOTENCY_TTL_S)
    return command.issued_at + ttl <= now


def _same_request(command: Command, fingerprint: str) -> Command:
    # commands made before keys were bound have no fingerprint: they answer as before
    if command.idempotency_fingerprint and command.idempotency_fingerprint != fingerprint:
        raise IdempotencyMismatch(command)
    return command


def command_advance(
    *, command_id: uuid.UUID | str, to_state: str, detail: dict | None = None
) -> Command:
    """Move the command to `to_state` and return it. Repeating its current state is a no-op;
    a move the state machine does not allow raises CommandConflict. Guarantees: each real
    transition is one conditional UPDATE that won (WHERE state = the state it was read in)
    and leaves one CommandTransition row, so racing callers move a command at most once."""
    return command_transition(command_id=command_id, to_state=to_state, detail=detail)[0]


def command_transition(
    *,
    command_id: uuid.UUID | str,
    to_state: str,
    detail: dict | None = None,
    result: dict | None = None,
) -> tuple[Command, bool]:
    """command_advance, also saying whether this call made the move (False: a no-op repeat),
    and merging `result` into the command's result when it does."""
    allowed = ALLOWED_PREVIOUS[to_state]
    while True:
        command = Command.objects.get(pk=command_id)
        if command.state == to_state:
            return command, False
        if command.state not in allowed:
            raise CommandConflict(command, to_state)
        now = timezone.now()
        changes: dict[str, Any] = {"state": to_state, STATE_TIMESTAMP[to_state]: now}
        if result:
            changes["result"] = {**command.result, **result}
        with transaction.atomic():
            won = Command.objects.filter(pk=command.pk, state=command.state).update(**changes)
            if won:
                CommandTransition.objects.create(
                    command=command,
                    from_state=command.state,
                    to_state=to_state,
                    at=now,
                    detail=detail or {},
                )
        if won:
            break
        # another caller moved it first: judge the move again against its new state
    command = Command.objects.get(pk=command.pk)
    if to_state in TERMINAL_STATES:
        command_ended.send(sender=Command, command=command)
    # after command_ended's reactions: a drain's node is settled before the page hears of it
    command_broadcast_on_commit(command_id=command.pk)
    return command, True


def command_move(command: Command, state: str, detail: dict[str, Any]) -> Command:
    """command_transition recording `detail` as the move's detail and result; a command
    someone else finished first (expiry) is returned as they left it."""
    try:
        return command_transition(
            command_id=command.pk, to_state=state, detail=detail, result=detail
        )[0]
    except CommandConflict as conflict:  # someone else finished it first: keep theirs
        return conflict.command
