"""The alert acknowledgements recorded by apps.alerts (its own AuditEntry table, dropped by
alerts 0004) become entries of the one audit log."""

from django.db import migrations


def copy_acknowledgements(apps, schema_editor):
    OldEntry = apps.get_model("alerts", "AuditEntry")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    old = OldEntry.objects.select_related("alert__cluster", "actor").order_by("at", "id")
    AuditEntry.objects.bulk_create(
        AuditEntry(
            at=entry.at,
            actor_kind="user",
            actor_user_id=entry.actor_id,
            actor_name=entry.actor.username if entry.actor else "",
            action="alert.acknowledge",
            cluster_id=entry.alert.cluster_id,
            cluster_name=entry.alert.cluster.name,
            target=f"alert:{entry.alert_id}",
            reason=entry.note,
            outcome="succeeded",
            detail={"migrated_from": "alerts.AuditEntry"},
        )
        for entry in old.iterator()
    )


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0001_initial"),
        ("alerts", "0003_detector_pass"),
    ]

    # no reverse: the audit log is append-only (its trigger refuses DELETE)
    operations = [migrations.RunPython(copy_acknowledgements, migrations.RunPython.noop)]
