"""`manage.py audit_prune`: as the audit table's owner it deletes the entries past
AUDIT_RETENTION_DAYS, only those, and records itself in the log; as the runtime role
(docs/security.md) the same command is refused by Postgres and deletes nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from apps.audit.models import AuditEntry

NOW = datetime.now(UTC)


def entries(target: str, *ages_days: float) -> list[int]:
    """One entry per age, all naming `target` (the log is shared by every test)."""
    return [
        AuditEntry.objects.create(
            at=NOW - timedelta(days=days), actor_kind="user", actor_name="t",
            action="role.test", target=target, outcome="allowed",
        ).pk
        for days in ages_days
    ]  # fmt: skip


def left(ids: list[int]) -> set[int]:
    return set(AuditEntry.objects.filter(pk__in=ids).values_list("pk", flat=True))


@contextmanager
def database_as(role: str) -> Iterator[str]:
    """A database alias of the test database that connects as `role` (made by hand, not from
    settings.DATABASES: Django's test case lets such connections through)."""
    alias = f"as_{role}"
    default = connections["default"]
    connections[alias] = default.__class__({**default.settings_dict, "USER": role}, alias)
    try:
        yield alias
    finally:
        wrapper = connections[alias]
        wrapper.close()
        wrapper.close_pool()  # the settings' psycopg pool: its connections too
        del connections[alias]


@pytest.mark.django_db
def test_as_the_owner_it_deletes_only_old_entries_and_records_itself(settings, capsys):
    settings.AUDIT_RETENTION_DAYS = 400
    target = f"prune:{uuid.uuid4().hex}"
    old = entries(target, 401, 900)
    young = entries(target, 399, 0)

    began = datetime.now(UTC)
    call_command("audit_prune")
    ended = datetime.now(UTC)

    assert left(old) == set()
    assert left(young) == set(young)
    record = AuditEntry.objects.filter(action="audit.prune").latest("id")
    assert (record.actor_kind, record.actor_name, record.outcome) == (
        "system", "audit_prune", "succeeded",
    )  # fmt: skip
    assert record.detail["deleted"] >= len(old)  # and any other test's leftovers that old
    assert record.detail["more"] is False
    cutoff = datetime.fromisoformat(record.detail["cutoff"])
    # the command's now, 400 days back (NOW is when this module was imported, which a
    # slow suite may have done many minutes before); a second for the database's clock
    slack = timedelta(seconds=1)
    retention = timedelta(days=400)
    assert began - retention - slack <= cutoff <= ended - retention + slack
    assert f"recorded as entry {record.pk}" in capsys.readouterr().out


@pytest.mark.django_db
def test_it_works_in_bounded_batches_in_one_transaction(settings):
    target = f"prune:{uuid.uuid4().hex}"
    old = entries(target, 1000, 1001, 1002)
    call_command("audit_prune", days=999, batch=1, max_batches=2)
    record = AuditEntry.objects.filter(action="audit.prune").latest("id")
    assert record.detail["deleted"] == 2 and record.detail["more"] is True
    assert left(old) == {old[0]}  # the oldest go first; the newest of them at the next run
    call_command("audit_prune", days=999, batch=1, max_batches=2)
    assert left(old) == set()


@pytest.mark.django_db
def test_zero_keeps_the_log_forever(settings, capsys):
    settings.AUDIT_RETENTION_DAYS = 0
    old = entries(f"prune:{uuid.uuid4().hex}", 5000)
    call_command("audit_prune")
    assert left(old) == set(old)
    assert "kept forever" in capsys.readouterr().out


def test_as_the_runtime_role_it_is_refused_and_deletes_nothing(runtime_role, settings):
    settings.AUDIT_RETENTION_DAYS = 400
    target = f"prune:{uuid.uuid4().hex}"
    old = entries(target, 401, 900)
    before = AuditEntry.objects.filter(action="audit.prune").count()
    with database_as(runtime_role) as alias, pytest.raises(CommandError) as refused:
        call_command("audit_prune", database=alias)
    assert "permission denied for table audit_auditentry" in str(refused.value)
    assert left(old) == set(old)
    assert AuditEntry.objects.filter(action="audit.prune").count() == before
