"""/readyz: 200 when the database and the broker answer and every migration is applied,
503 naming what is not ready."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from launcher.procs import free_port

pytestmark = [pytest.mark.django_db]


def test_it_is_ready_with_the_database_the_broker_and_the_migrations():
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "checks": {"database": "ok", "broker": "ok", "migrations": "ok"},
    }


def test_it_names_an_unreachable_broker():
    with override_settings(CELERY_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0"):
        response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["ready"] is False and body["not_ready"] == ["broker"]
    assert body["checks"]["broker"].startswith("unreachable")
    assert body["checks"]["database"] == "ok"


def test_it_names_a_migration_not_applied():
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from apps.metrics import views

    recorder = MigrationRecorder(connection)
    # Forget (inside the test's transaction, rolled back after) that the newest migration of
    # one app was applied: the plan then lists it.
    applied = recorder.migration_qs.filter(app="commands").order_by("-id").first()
    views._migrated = False
    try:
        applied.delete()
        response = Client().get("/readyz")
    finally:
        views._migrated = False
    assert response.status_code == 503
    body = response.json()
    assert body["not_ready"] == ["migrations"]
    assert body["checks"]["migrations"].startswith("1 not applied, first commands.")
