import pgtrigger
from django.db import models

from apps.audit.choices import ActorKind, Outcome


class AuditEntry(models.Model):
    """One attempted action, allowed or denied. Append-only: Postgres triggers refuse UPDATE,
    DELETE and TRUNCATE (the owner of the table can still disable them: the application runs
    as a role that does not own it, docs/security.md). Actor and cluster are plain columns,
    not foreign keys, so deleting a user or a cluster never cascades into (or is blocked by)
    the log."""

    at = models.DateTimeField(db_index=True)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_user_id = models.IntegerField(null=True, blank=True, db_index=True)
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True)
    cluster_id = models.IntegerField(null=True, blank=True, db_index=True)
    cluster_name = models.CharField(max_length=64, blank=True)
    target = models.CharField(max_length=255, blank=True, db_index=True)
    reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    detail = models.JSONField(default=dict, blank=True)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    class Meta:
        verbose_name_plural = "audit entries"
        ordering = ["-at", "-id"]
        triggers = [
            pgtrigger.Protect(
                name="audit_append_only", operation=pgtrigger.Update | pgtrigger.Delete
            ),
            # TRUNCATE fires no row trigger; pgtrigger's Protect only knows row triggers and
            # statement triggers with transition tables, which TRUNCATE has none of
            pgtrigger.Trigger(
                name="audit_no_truncate",
                operation=pgtrigger.Truncate,
                level=pgtrigger.Statement,
                when=pgtrigger.Before,
                func="RAISE EXCEPTION 'pgtrigger: Cannot truncate % table', TG_TABLE_NAME;",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {self.outcome}"
