# The sample store: per-series chunks (layout and reasons in apps/telemetry/services.py).
from django.db import migrations

CREATE = """
CREATE TABLE telemetry_chunk (
    t0 timestamptz NOT NULL,
    t1 timestamptz NOT NULL,
    vmin float8 NOT NULL,
    vmax float8 NOT NULL,
    vsum float8 NOT NULL,
    node_id integer NOT NULL,
    metric_id integer NOT NULL,
    n integer NOT NULL,
    gpu smallint NOT NULL,
    sealed boolean NOT NULL DEFAULT false,
    offsets_ms integer[] NOT NULL,
    vals float8[] NOT NULL
) WITH (fillfactor = 100);
CREATE INDEX telemetry_chunk_series ON telemetry_chunk (node_id, metric_id, gpu, t0);
CREATE INDEX telemetry_chunk_t0_brin ON telemetry_chunk USING brin (t0);
"""

# lz4 where the server has it: faster than pglz for the JSON payloads of the inbox.
LZ4 = """
DO $$ BEGIN
    ALTER TABLE ingest_inboxbatch ALTER COLUMN payload SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0001_initial"), ("ingest", "0001_initial")]

    operations = [
        migrations.RunSQL(CREATE, "DROP TABLE telemetry_chunk"),
        migrations.RunSQL(LZ4, migrations.RunSQL.noop),
    ]
