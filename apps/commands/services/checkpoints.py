"""Judging an accepted checkpoint command against the checkpoint events stored: called by
the ack (issue.command_ack) and by the sweep (reactions.commands_sweep), below both."""

from __future__ import annotations

from apps.commands.choices import CommandState
from apps.commands.models import Command
from apps.commands.selectors import checkpoint_ranks
from apps.commands.services.core import command_move


def checkpoint_evaluate(*, command: Command) -> Command:
    """An accepted checkpoint command whose step is known (ack `step`, else `args.step`):
    failed on a failed checkpoint event of that step; succeeded once every rank that saves
    reported the durable checkpoint of that step completed. The ranks that save are those
    the ack or the args name (`ranks`), else every rank that reported starting it."""
    step = command.result.get("step", command.args.get("step"))
    if command.state != CommandState.ACCEPTED or step is None or command.run_id is None:
        return command
    seen = checkpoint_ranks(run_id=command.run_id, step=int(step))
    if seen.failed:
        return command_move(
            command, CommandState.FAILED, {"failed_ranks": sorted(seen.failed, key=str)}
        )
    named = command.result.get("ranks") or command.args.get("ranks")
    expected = set(named or seen.started)
    # With no ranks named, a rank whose part is not known yet could still be saving: its
    # events may be queued behind the ones already stored. Success then waits until every
    # rank at the step has reported a checkpoint event of it or a later step.
    unknown = set() if named else seen.unsettled
    if seen.durable and expected <= seen.durable and not unknown:
        return command_move(command, CommandState.SUCCEEDED, {"durable_step": int(step)})
    return command
