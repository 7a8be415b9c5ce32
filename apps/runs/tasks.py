from celery import shared_task
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.runs.compaction import steps_compact


@shared_task(name="runs.steps_compact", ignore_result=True)
def compact_steps() -> int:
    with background_db():
        return steps_compact(now=timezone.now())
