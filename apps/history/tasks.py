from celery import shared_task
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.history.services import history_prune, partitions_maintain, rollups_refresh


@shared_task(name="history.rollups_refresh", ignore_result=True)
def refresh_rollups() -> int:
    with background_db():
        return rollups_refresh().claimed


@shared_task(name="history.prune", ignore_result=True)
def prune_history() -> dict[str, int]:
    with background_db():
        return history_prune(now=timezone.now())


@shared_task(name="history.partitions_maintain", ignore_result=True)
def maintain_partitions() -> dict[str, list[str]]:
    with background_db():
        return partitions_maintain(now=timezone.now())
