from dataclasses import asdict

from celery import shared_task
from django.utils import timezone

from apps.access.retention import logins_prune
from apps.core.db_nice import background_db


@shared_task(name="access.logins_prune", ignore_result=True)
def prune_logins() -> dict[str, int]:
    """Expired sessions and old login records (beat, RETENTION_INTERVAL)."""
    with background_db():
        return asdict(logins_prune(now=timezone.now()))
