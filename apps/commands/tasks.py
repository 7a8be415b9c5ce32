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


@shared_task(name="commands.scheduler_states_poll_all", ignore_result=True)
def scheduler_states_poll_all() -> int:
    """Send one state-hook poll per cluster that has one (beat, COMMANDS_STATE_HOOK_INTERVAL;
    routed to the periodic queue)."""
    return services.scheduler_states_poll_all()


@shared_task(name="commands.scheduler_states_poll", ignore_result=True)
def scheduler_states_poll(cluster_id: int) -> None:
    """Run a cluster's scheduler state hook and mark its down nodes (periodic queue)."""
    services.scheduler_states_poll(cluster_id=cluster_id)
