"""The command state machine: idempotent creation and conditional transitions."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.commands.choices import ALLOWED_PREVIOUS, STATE_TIMESTAMP, TERMINAL_STATES
from apps.commands.models import Command, CommandTransition
from apps.commands.services.broadcast import command_broadcast_on_commit


class CommandConflict(Exception):
    """A move the state machine refuses (backwards, or out of a terminal state): 409."""

    def __init__(self, command: Command, to_state: str) -> None:
        super().__init__(f"command is {command.state}: it cannot become {to_state}")
        self.command, self.to_state = command, to_state


def command_create(
    *,
    cluster_id: int,
    kind: str,
    idempotency_key: str,
    run_id: int | None = None,
    node_id: int | None = None,
    args: dict | None = None,
    reason: str = "",
    issued_by_id: int | None = None,
    parent_id: uuid.UUID | None = None,
    now: datetime | None = None,
) -> tuple[Command, bool]:
    """The cluster's command with this idempotency key: the existing one (created False) or a
    new issued one (created True). Two requests racing with one key make one command: the
    unique constraint decides, and the loser reads the winner's row."""
    existing = Command.objects.filter(cluster_id=cluster_id, idempotency_key=idempotency_key)
    found = existing.first()
    if found is not None:
        return found, False
    now = now or timezone.now()
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
                issued_by_id=issued_by_id,
                parent_id=parent_id,
                issued_at=now,
                expires_at=now + timedelta(seconds=settings.COMMANDS_EXPIRE_AFTER_S),
            )
            CommandTransition.objects.create(
                command=command, from_state="", to_state=command.state, at=now
            )
    except IntegrityError:
        found = existing.first()
        if found is None:
            raise
        return found, False
    command_broadcast_on_commit(command_id=command.pk)
    return command, True


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
        from apps.commands.services.reactions import command_finished

        command_finished(command=command)
    # after command_finished: a drain's node is settled before the page hears of it
    command_broadcast_on_commit(command_id=command.pk)
    return command, True
