"""Retention passes delete in bounded batches, a transaction each, and are all on beat's
schedule, on the periodic queue."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import connection

from apps.core.prune import expired_delete
from opsboard.celery import app

RETENTION_TASKS = {
    "run-events-prune": "runs.events_prune",
    "alerts-prune": "alerts.prune",
    "commands-prune": "commands.prune",
    "logins-prune": "access.logins_prune",
}


def test_beat_runs_every_retention_task_on_the_periodic_queue():
    app.loader.import_default_modules()  # autodiscovery: the tasks are registered
    for entry, task in RETENTION_TASKS.items():
        scheduled = settings.CELERY_BEAT_SCHEDULE[entry]
        assert scheduled["task"] == task
        assert scheduled["schedule"] == settings.RETENTION_INTERVAL
        assert settings.CELERY_TASK_ROUTES[task] == {"queue": settings.CELERY_PERIODIC_QUEUE}
        assert task in app.tasks
    # the audit log is never pruned by the running services
    assert not any(
        "audit" in scheduled["task"] for scheduled in settings.CELERY_BEAT_SCHEDULE.values()
    )


@pytest.mark.django_db
def test_a_pass_stops_after_its_batches_and_the_next_goes_on(settings):
    settings.RETENTION_BATCH = 2
    settings.RETENTION_MAX_BATCHES = 2
    with connection.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE ret_rows (n int)")
        cursor.execute("INSERT INTO ret_rows SELECT generate_series(1, 7)")
    expired = {"table": "ret_rows", "expired": "n <= %(cutoff)s", "params": {"cutoff": 6}}
    assert expired_delete(**expired) == 4  # two batches of two: the pass ends there
    assert expired_delete(**expired) == 2  # the next pass takes the rest, and stops short
    with connection.cursor() as cursor:
        cursor.execute("SELECT array_agg(n) FROM ret_rows")
        assert cursor.fetchone()[0] == [7]
