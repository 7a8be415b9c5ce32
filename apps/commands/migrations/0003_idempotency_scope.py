"""Idempotency keys scoped to their actor and bound to their request (issue 24).

Commands made before: a person's key becomes that person's (issued_by), the rest stay in
the system scope (drains' steps, the policy); they carry no fingerprint, so their keys
answer as before until they expire."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('clusters', '0003_node_cordon'),
        ('commands', '0002_auto_cordon_policy'),
        ('runs', '0005_stepchunk'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='command',
            name='command_unique_idempotency_key',
        ),
        migrations.AddField(
            model_name='command',
            name='idempotency_fingerprint',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='command',
            name='idempotency_live',
            field=models.BooleanField(default=True),
        ),
        migrations.AddField(
            model_name='command',
            name='idempotency_scope',
            field=models.CharField(default='system', max_length=64),
        ),
        migrations.RunSQL(
            "UPDATE commands_command SET idempotency_scope = 'user:' || issued_by_id "
            "WHERE issued_by_id IS NOT NULL",
            migrations.RunSQL.noop,
        ),
        migrations.AddConstraint(
            model_name='command',
            constraint=models.UniqueConstraint(condition=models.Q(('idempotency_live', True)), fields=('cluster', 'idempotency_scope', 'idempotency_key'), name='command_unique_idempotency_key'),
        ),
    ]
