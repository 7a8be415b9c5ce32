# The sample change log (apps/telemetry/changes.py): which span of which node got samples,
# keyed by the writing transaction's id, so that the detectors' window kept by a periodic
# worker reads only the telemetry that changed since its last pass; and the horizon below
# which the log was pruned (a reader older than it loads its window whole).
from django.db import migrations

FORWARD = """
CREATE TABLE telemetry_samplechange (
    xid bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    node_id integer NOT NULL,
    t0 double precision NOT NULL,
    t1 double precision NOT NULL
);
CREATE INDEX telemetry_samplechange_xid ON telemetry_samplechange (xid);
CREATE INDEX telemetry_samplechange_at ON telemetry_samplechange (at);
CREATE TABLE telemetry_samplechangehorizon (
    id smallint PRIMARY KEY CHECK (id = 1),
    xid bigint NOT NULL
);
INSERT INTO telemetry_samplechangehorizon (id, xid) VALUES (1, 0);
"""
BACKWARD = "DROP TABLE telemetry_samplechange, telemetry_samplechangehorizon;"


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0003_chunk_encoded")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
