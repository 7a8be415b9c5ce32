# The (node, t1) index of 0005 split in two partial ones that hold every chunk between them,
# each once, so ingest writes one entry a chunk as before: `_point` for the one-point raw
# chunks (an agent's 1 Hz batch a series: almost every recent chunk) and `_other` for every
# other chunk (raw ones of more points, and sealed ones). The span read of the detectors'
# kept window takes each kind from its own index: with one index, its branches for the rare
# kinds scanned every recent chunk of a node to keep none of the one-point ones, 2 of its 3
# scans (apps.telemetry.selectors, _ONE_POINT_RAW; the predicates are written as there).
# New indexes first, then the old one goes: a read never lacks an index. Created on the
# partitioned table, so every partition gets its own; docs/operations.md says what the
# build blocks ("Upgrading: migrations that build indexes").
from django.db import migrations

_POINT = (
    "CREATE INDEX telemetry_chunk_node_t1_point ON telemetry_chunk (node_id, t1)"
    " WHERE n = 1 AND ts_pco IS NULL;"
)
_OTHER = (
    "CREATE INDEX telemetry_chunk_node_t1_other ON telemetry_chunk (node_id, t1)"
    " WHERE n <> 1 OR ts_pco IS NOT NULL;"
)


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0005_chunk_node_t1")]

    operations = [
        migrations.RunSQL(
            [_POINT, _OTHER, "DROP INDEX telemetry_chunk_node_t1;"],
            [
                "CREATE INDEX telemetry_chunk_node_t1 ON telemetry_chunk (node_id, t1);",
                "DROP INDEX telemetry_chunk_node_t1_point;",
                "DROP INDEX telemetry_chunk_node_t1_other;",
            ],
        )
    ]
