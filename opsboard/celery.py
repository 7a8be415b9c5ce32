"""The Celery application: `celery -A opsboard worker` finds `app` here."""

import logging
import os

from celery import Celery
from celery.signals import task_postrun, task_prerun, task_revoked
from django.db import close_old_connections, reset_queries

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")

app = Celery("opsboard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

logger = logging.getLogger("opsboard.periodic")


@task_prerun.connect
@task_postrun.connect
def connections_return(task=None, **_: object) -> None:
    """Around each task, give the connection back to the process's pool (CONN_MAX_AGE is 0),
    as Django does around each request; one that errored or broke is discarded. The pool
    outlives the task (settings.CELERY_DB_REUSE_MAX): a task reuses a backend, it does not
    start one. Eager tasks run inside the caller's transaction and are left alone."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    close_old_connections()
    # as Django does at each request's start: under DEBUG each connection logs its queries
    # (up to 9,000), and a worker has no requests
    reset_queries()


@task_postrun.connect
def periodic_heap_trim(task=None, **_: object) -> None:
    """After a periodic task, the C heap's free memory goes back to the OS (apps.core.heap):
    a pass frees tens of MB that glibc would otherwise keep. Ingest tasks, 60 a second and
    small, are left alone."""
    from django.conf import settings

    from apps.core.heap import heap_trim

    route = settings.CELERY_TASK_ROUTES.get(getattr(task, "name", None), {})
    if route.get("queue") == settings.CELERY_PERIODIC_QUEUE:
        heap_trim()


@task_revoked.connect
def periodic_expired(sender=None, request=None, expired: bool = False, **_: object) -> None:
    """A periodic pass that expired in the queue is never dropped silently: it is logged and
    counted per task name (apps.alerts.services.periodic_skips reads the counts). The next
    pass covers the gap: evaluation reads its window as of its own time, rollups work from
    dirty marks, pruning and compaction from what is still there."""
    if not expired:
        return
    from apps.alerts.services import (
        EVALUATE_CLUSTER_TASK,
        detector_pass_skipped,
        periodic_skip_count,
    )

    name = getattr(sender, "name", None) or getattr(request, "task", None) or "?"
    logger.warning("periodic task %s expired in the queue and was skipped", name)
    args = getattr(request, "args", None) or ()
    if name == EVALUATE_CLUSTER_TASK and args:
        # counted on the cluster's own pass as well, where its overview reads it
        detector_pass_skipped(cluster_id=int(args[0]), reason="expired")
    else:
        periodic_skip_count(task=name, reason="expired")
