from celery import shared_task
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.telemetry.services import chunks_compact


@shared_task(name="telemetry.chunks_compact", ignore_result=True)
def compact_chunks() -> int:
    with background_db():
        return chunks_compact(now=timezone.now())
