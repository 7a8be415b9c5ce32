import time
from dataclasses import asdict

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from apps.alerts import services
from apps.core.db_nice import background_db


@shared_task(name="alerts.evaluate_all", ignore_result=True)
def evaluate_all() -> int:
    """Beat's tick (ALERT_EVALUATE_INTERVAL): one evaluate_cluster per active cluster."""
    return services.alerts_evaluate_all(now=time.time())


@shared_task(name=services.EVALUATE_CLUSTER_TASK, ignore_result=True)
def evaluate_cluster(cluster_id: int) -> bool:
    """One cluster's pass, under its own lock (skipped while its previous pass runs)."""
    return services.alerts_evaluate_cluster(cluster_id=cluster_id, now=time.time())


@shared_task(name="alerts.prune", ignore_result=True)
def prune() -> dict[str, int]:
    """Resolved alerts and webhook deliveries past their retention (beat, RETENTION_INTERVAL)."""
    with background_db():
        return asdict(services.alerts_prune(now=timezone.now()))


@shared_task(
    name=services.WEBHOOK_DELIVER_TASK,
    ignore_result=True,
    acks_late=True,
    autoretry_for=(services.WebhookFailed,),
    max_retries=settings.ALERT_WEBHOOK_ATTEMPTS - 1,
    # exponential backoff: up to BACKOFF s, then 2×, 4×, ... (with jitter)
    retry_backoff=settings.ALERT_WEBHOOK_BACKOFF_S,
    retry_backoff_max=600,
)
def webhook_deliver(delivery_id: int) -> bool:
    return services.webhook_deliver(delivery_id=delivery_id)


@shared_task(name="alerts.alertmanager_resend", ignore_result=True)
def alertmanager_resend() -> int:
    return services.alertmanager_resend()


@shared_task(name="alerts.age", ignore_result=True)
def age() -> int:
    """Beat's tick (ALERT_AGEING_INTERVAL): warnings past their cluster's age escalate once."""
    return services.alerts_age()
