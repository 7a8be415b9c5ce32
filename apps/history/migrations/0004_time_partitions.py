# The time-keyed tables become range partitions by time (apps/core/partitions.py; retention
# by dropping whole partitions, apps/history/services/retention.py). On an existing database
# nothing is copied: each table becomes its own legacy partition (apps/core/partition_convert.py).
from django.db import migrations
from django.utils import timezone

# table, partition key, partition width in days, whether `id` is an identity column
TABLES = [
    ("telemetry_chunk", "t0", 1, False),
    ("runs_stepreport", "ts", 1, True),
    ("runs_stepchunk", "window", 1, True),
    ("history_sample_1m", "bucket", 7, False),
    ("history_step_10s", "bucket", 1, False),
    ("history_runstep_10s", "bucket", 1, False),
    ("history_step_1m", "bucket", 7, False),
    ("history_runstep_1m", "bucket", 7, False),
    ("history_step_10m", "bucket", 30, False),
    ("history_sample_1h", "bucket", 30, False),
    ("history_step_1h", "bucket", 30, False),
    ("history_runstep_1h", "bucket", 30, False),
]


def partition(apps, schema_editor) -> None:
    from apps.core.partition_convert import table_partition

    now = timezone.now()
    with schema_editor.connection.cursor() as cursor:
        for table, key, width_days, _identity in TABLES:
            table_partition(cursor, table, key=key, width_days=width_days, now=now)


def unpartition(apps, schema_editor) -> None:
    from apps.core.partition_convert import table_unpartition

    with schema_editor.connection.cursor() as cursor:
        for table, _key, _width, identity in TABLES:
            table_unpartition(cursor, table, identity=identity)


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0003_step_tiers"),
        ("telemetry", "0003_chunk_encoded"),
        ("runs", "0006_run_timeline"),
    ]

    operations = [migrations.RunPython(partition, unpartition)]
