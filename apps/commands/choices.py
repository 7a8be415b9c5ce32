from django.db import models


class CommandKind(models.TextChoices):
    CHECKPOINT = "checkpoint"
    STOP = "stop"
    RESUME = "resume"
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"  # of a node in maintenance: returns it to service (a note needed)
    MAINTENANCE = "maintenance"  # cordon for repair, through the cordon hook


class CommandState(models.TextChoices):
    ISSUED = "issued"
    DELIVERED = "delivered"
    ACCEPTED = "accepted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    EXPIRED = "expired"


RUN_KINDS = frozenset({CommandKind.CHECKPOINT, CommandKind.STOP, CommandKind.RESUME})
NODE_KINDS = frozenset(
    {CommandKind.DRAIN, CommandKind.CORDON, CommandKind.UNCORDON, CommandKind.MAINTENANCE}
)
# Carried out in order by the node's carry-out (apps.commands.services.carry_out).
CARRIED_OUT_KINDS = (
    CommandKind.CORDON,
    CommandKind.UNCORDON,
    CommandKind.DRAIN,
    CommandKind.MAINTENANCE,
)
# What agents receive by long-poll. Node kinds are carried out by the server itself (the
# node's state, the scheduler hook; drain's checkpoint and stop are commands of their own).
DELIVERED_KINDS = RUN_KINDS

TERMINAL_STATES = frozenset({CommandState.SUCCEEDED, CommandState.FAILED, CommandState.EXPIRED})
LIVE_STATES = (CommandState.ISSUED, CommandState.DELIVERED, CommandState.ACCEPTED)

# The one state machine: each state and the states it may be reached from. Forward only
# (skipping forward allowed: an agent may accept a command whose delivery answer was lost);
# a terminal state is never left.
ALLOWED_PREVIOUS: dict[str, frozenset[str]] = {
    CommandState.ISSUED: frozenset(),
    CommandState.DELIVERED: frozenset({CommandState.ISSUED}),
    CommandState.ACCEPTED: frozenset({CommandState.ISSUED, CommandState.DELIVERED}),
    CommandState.SUCCEEDED: frozenset(LIVE_STATES),
    CommandState.FAILED: frozenset(LIVE_STATES),
    CommandState.EXPIRED: frozenset(LIVE_STATES),
}

# The timestamp column each state sets.
STATE_TIMESTAMP = {
    CommandState.DELIVERED: "delivered_at",
    CommandState.ACCEPTED: "accepted_at",
    CommandState.SUCCEEDED: "finished_at",
    CommandState.FAILED: "finished_at",
    CommandState.EXPIRED: "finished_at",
}

# Node names a scheduler hook may receive: a host name, never an option ("-x") or a path.
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"

# Kinds that ask for a reason and the target's name typed again (pages and admin alike).
CONFIRMED_KINDS = frozenset({CommandKind.STOP, CommandKind.DRAIN})
REASON_MAX_LENGTH = 2000  # commands_command.reason, audit's reason

# The idempotency scope of the commands the system issues (a drain's own steps, the policy).
# Requests' keys are scoped to their user or token ("user:<id>", "token:<id>"), so a request
# can never name a system key, whatever the key's text.
IDEMPOTENCY_SYSTEM = "system"
