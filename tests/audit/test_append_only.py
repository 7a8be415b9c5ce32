"""The audit log is append-only: Postgres itself refuses UPDATE, DELETE and TRUNCATE."""

import pytest
from django.db import DatabaseError, connection, transaction

from apps.audit.models import AuditEntry
from apps.audit.services import audit_record

pytestmark = pytest.mark.django_db


@pytest.fixture
def entry():
    return audit_record(action="role.grant", outcome="succeeded", actor_name="manage.py")


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE audit_auditentry SET outcome = 'denied' WHERE id = %s",
        "DELETE FROM audit_auditentry WHERE id = %s",
    ],
)
def test_it_refuses_update_and_delete_in_raw_sql(entry, sql):
    with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).outcome == "succeeded"


def test_it_refuses_truncate(entry):
    refused = pytest.raises(DatabaseError, match="Cannot truncate")
    with refused, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("TRUNCATE audit_auditentry")
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_it_refuses_a_delete_through_the_orm(entry):
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEntry.objects.filter(pk=entry.pk).delete()
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_it_keeps_entries_when_their_user_and_cluster_are_deleted(clusters_and_user):
    cluster, user = clusters_and_user
    kept = audit_record(action="x", outcome="allowed", actor_user=user, cluster=cluster)
    user.delete()
    cluster.delete()
    kept = AuditEntry.objects.get(pk=kept.pk)
    assert (kept.actor_name, kept.cluster_name) == ("vera", "alpha")


@pytest.fixture
def clusters_and_user(db):
    from django.contrib.auth import get_user_model

    from apps.clusters.models import Cluster

    return Cluster.objects.create(name="alpha"), get_user_model().objects.create_user("vera")
