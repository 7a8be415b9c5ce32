from celery import shared_task
from django.utils import timezone

from apps.commands import services
from apps.core.db_nice import background_db


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


@shared_task(name="commands.prune", ignore_result=True)
def prune() -> int:
    """Finished commands past COMMANDS_RETENTION_DAYS (beat, RETENTION_INTERVAL)."""
    with background_db():
        return services.commands_prune(now=timezone.now())
