from celery import shared_task
from django.conf import settings
from django.utils import timezone

from apps.core.db_nice import background_db
from apps.ingest import services
from apps.ingest.services import prune


@shared_task(
    name=services.BATCH_PROCESS_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    # transient only (Django's and psycopg's own, raised by the COPY path): a permanent
    # failure quarantines its batch inside inbox_drain and never reaches here
    autoretry_for=services.TRANSIENT_ERRORS,
    retry_backoff=True,
    retry_backoff_max=30,
    max_retries=None,
)
def batch_process(inbox_id: int | None = None) -> int:
    """Drain the inbox, inbox row `inbox_id` first when given (tasks from the sweep, or
    queued by an older version, name one)."""
    return services.inbox_drain_pending(first_id=inbox_id).batches


@shared_task(name="ingest.inbox_sweep", ignore_result=True)
def inbox_sweep() -> int:
    return services.inbox_sweep(older_than_s=settings.INGEST_SWEEP_AGE)


@shared_task(name="ingest.inbox_prune", ignore_result=True)
def inbox_prune() -> int:
    with background_db():
        return prune.inbox_prune(now=timezone.now())
