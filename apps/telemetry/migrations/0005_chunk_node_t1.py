# Each node's chunks by their end, for the spans the detectors' kept window reads each pass:
# the chunks of a node that end at or after a span's start are the few recent ones. The
# series index (node, metric, gpu, t0) cannot find them: a chunk may start up to a day
# before its end (MAX_CHUNK_SPAN), and with the GPU between node and t0 a read walks every
# chunk of that day, sealed or not (1,024 ranks with a day of history: 88 → 44 ms a pass;
# docs/performance.md, "A day of history"). Created on the partitioned table, so every
# partition (apps/core/partitions.py makes them ahead) gets its own.
from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0004_sample_changes")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX telemetry_chunk_node_t1 ON telemetry_chunk (node_id, t1);",
            "DROP INDEX telemetry_chunk_node_t1;",
        )
    ]
