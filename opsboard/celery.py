"""The Celery application: `celery -A opsboard worker` finds `app` here."""

import logging
import os

from celery import Celery
from celery.signals import task_revoked

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")

app = Celery("opsboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("opsboard.periodic")


@task_revoked.connect
def periodic_expired(sender=None, request=None, expired: bool = False, **_: object) -> None:
    """A periodic pass that expired in the queue is never dropped silently: it is logged and
    counted per task name (apps.alerts.services.periodic_skips reads the counts). The next
    pass covers the gap: evaluation reads its window as of its own time, rollups work from
    dirty marks, pruning and compaction from what is still there."""
    if not expired:
        return
    from apps.alerts.services import periodic_skip_count

    name = getattr(sender, "name", None) or getattr(request, "task", None) or "?"
    logger.warning("periodic task %s expired in the queue and was skipped", name)
    periodic_skip_count(task=name, reason="expired")
