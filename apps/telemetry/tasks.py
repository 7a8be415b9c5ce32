from celery import shared_task
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.telemetry.changes import sample_changes_prune
from apps.telemetry.services import chunks_compact


@shared_task(name="telemetry.chunks_compact", ignore_result=True)
def compact_chunks() -> int:
    """Sealed chunks of the windows past, and the sample change log pruned (beat, 60 s)."""
    with background_db():
        sample_changes_prune()
        return chunks_compact(now=timezone.now())
