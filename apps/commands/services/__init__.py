"""Services of the commands app (one state machine: apps.commands.services.core)."""

from apps.commands.services.carry_out import node_command_carry_out
from apps.commands.services.checkpoints import checkpoint_evaluate
from apps.commands.services.core import (
    CommandConflict,
    IdempotencyMismatch,
    command_advance,
    command_create,
    command_transition,
)
from apps.commands.services.issue import (
    CommandDenied,
    CommandInvalid,
    command_ack,
    command_ack_refused,
    command_invalid_record,
    command_issue,
    commands_deliver,
    idempotency_scope,
)
from apps.commands.services.node_commands import (
    NodeBusy,
    node_commands_resend,
)
from apps.commands.services.nodes import HookFailed, hook_argv, node_cordon, node_uncordon
from apps.commands.services.policy import critical_finding, policy_apply
from apps.commands.services.reactions import commands_sweep
from apps.commands.services.retention import commands_prune
from apps.commands.services.scheduler_states import (
    scheduler_states_poll,
    scheduler_states_poll_all,
)

__all__ = [
    "CommandConflict",
    "CommandDenied",
    "CommandInvalid",
    "HookFailed",
    "IdempotencyMismatch",
    "NodeBusy",
    "checkpoint_evaluate",
    "command_ack",
    "command_ack_refused",
    "command_advance",
    "command_create",
    "command_invalid_record",
    "command_issue",
    "command_transition",
    "commands_deliver",
    "commands_prune",
    "commands_sweep",
    "critical_finding",
    "idempotency_scope",
    "hook_argv",
    "node_command_carry_out",
    "node_commands_resend",
    "node_cordon",
    "node_uncordon",
    "policy_apply",
    "scheduler_states_poll",
    "scheduler_states_poll_all",
]
