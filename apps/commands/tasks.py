from celery import shared_task

from apps.commands import services


@shared_task(name="commands.sweep", ignore_result=True)
def sweep() -> dict[str, int]:
    """Expire overdue commands and judge accepted checkpoints (beat, COMMANDS_SWEEP_INTERVAL;
    routed to the periodic queue)."""
    return services.commands_sweep()
