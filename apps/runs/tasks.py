from celery import shared_task
from django.utils import timezone

from apps.runs.compaction import steps_compact


@shared_task(name="runs.steps_compact", ignore_result=True)
def compact_steps() -> int:
    return steps_compact(now=timezone.now())
