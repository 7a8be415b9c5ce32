"""Retention of commands and their transitions (docs/operations.md, Retention).

A command goes COMMANDS_RETENTION_DAYS after it finished (succeeded, failed or expired: a
terminal state is never left), with its transitions, in one statement a batch. A live
command (issued, delivered, accepted) is never deleted, however old. A drain's checkpoint
and stop commands name it as their parent: they go with it, once the drain and every one of
them finished before the cutoff (a drain is never deleted from under a live step, nor a
step from under a live drain). Commands are one level deep (a drain's steps have no steps).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from apps.commands.choices import TERMINAL_STATES
from apps.core.prune import batches_delete

_TERMINAL = ", ".join(sorted(f"'{state.value}'" for state in TERMINAL_STATES))
# Transitions and a drain's steps reference the command (Django's CASCADE is not the
# database's): all in one statement.
EXPIRED_SQL = f"""
WITH doomed AS (
  SELECT c.id FROM commands_command c
  WHERE c.parent_id IS NULL AND c.state IN ({_TERMINAL}) AND c.finished_at < %(cutoff)s
    AND NOT EXISTS (
      SELECT 1 FROM commands_command k WHERE k.parent_id = c.id
        AND (k.state NOT IN ({_TERMINAL}) OR NOT k.finished_at < %(cutoff)s)
    )
  LIMIT %(batch)s
), family AS (
  SELECT id FROM doomed
  UNION ALL SELECT k.id FROM commands_command k JOIN doomed ON k.parent_id = doomed.id
), transitions AS (
  DELETE FROM commands_commandtransition t USING family WHERE t.command_id = family.id
), steps AS (
  DELETE FROM commands_command k USING doomed WHERE k.parent_id = doomed.id
)
DELETE FROM commands_command c USING doomed WHERE c.id = doomed.id
"""


def commands_prune(*, now: datetime) -> int:
    """Delete the commands finished more than COMMANDS_RETENTION_DAYS ago (0: kept forever)
    with their transitions and steps, in bounded batches; returns the top-level commands
    deleted (a drain's steps are not counted)."""
    days = settings.COMMANDS_RETENTION_DAYS
    if not days:
        return 0
    return batches_delete(
        sql=EXPIRED_SQL, params={"cutoff": now - timedelta(days=days)}, what="finished commands"
    )
