from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError
from django.utils import timezone
from psycopg import errors

from apps.audit.services import audit_prune


class Command(BaseCommand):
    help = (
        "Delete audit entries older than AUDIT_RETENTION_DAYS (0: keep them forever) and "
        "record the prune in the log. Run it as the audit table's owner (DATABASE_URL of the "
        "migration role, docs/security.md), from cron: the running services cannot."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--days", type=float, default=None, help="override AUDIT_RETENTION_DAYS"
        )
        parser.add_argument("--batch", type=int, default=None, help="entries a statement")
        parser.add_argument(
            "--max-batches", type=int, default=100, help="statements at most (one transaction)"
        )
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS)

    def handle(self, *args, days, batch, max_batches, database, **options):
        days = settings.AUDIT_RETENTION_DAYS if days is None else days
        if days <= 0:
            self.stdout.write("AUDIT_RETENTION_DAYS is 0: the audit log is kept forever")
            return
        if (batch is not None and batch <= 0) or max_batches <= 0:
            raise CommandError("--batch and --max-batches must be positive")
        cutoff = timezone.now() - timedelta(days=days)
        try:
            entry = audit_prune(
                cutoff=cutoff,
                batch=batch or settings.AUDIT_PRUNE_BATCH,
                max_batches=max_batches,
                using=database,
            )
        except DatabaseError as error:
            if isinstance(error.__cause__, errors.InsufficientPrivilege):
                raise CommandError(
                    f"{error.__cause__}: run audit_prune as the audit table's owner "
                    "(the migration role's DATABASE_URL, docs/security.md); nothing was deleted"
                ) from error
            raise
        more = " (older entries remain: run it again)" if entry.detail["more"] else ""
        self.stdout.write(
            f"deleted {entry.detail['deleted']} audit entries older than {cutoff.isoformat()}"
            f"{more}; recorded as entry {entry.pk}"
        )
