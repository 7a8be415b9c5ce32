from celery import shared_task

from apps.commands import services


@shared_task(name="commands.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Expire overdue commands and judge accepted checkpoints (beat, COMMANDS_SWEEP_INTERVAL;
    routed to the periodic queue)."""
    return services.commands_sweep()


@shared_task(name="commands.node_carry_out", ignore_result=True)
def node_carry_out(command_id: str) -> None:
    """Carry out a node command (cordon, uncordon, drain): the scheduler hook and the node's
    state, off the request path (routed to the periodic queue; the sweep resends lost ones)."""
    services.node_command_carry_out(command_id=command_id)
