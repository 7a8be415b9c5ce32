from celery import shared_task
from django.utils import timezone

from apps.telemetry.services import chunks_compact


@shared_task(name="telemetry.chunks_compact", ignore_result=True)
def compact_chunks() -> int:
    return chunks_compact(now=timezone.now())
