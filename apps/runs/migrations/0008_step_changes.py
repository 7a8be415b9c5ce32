# The step change log (apps/runs/changes.py): which steps of which run got reports, keyed by
# the writing transaction's id, so that the detectors' window kept by a periodic worker reads
# only the steps that changed since its last pass; and the horizon below which the log was
# pruned (a reader older than it loads its window whole).
from django.db import migrations

FORWARD = """
CREATE TABLE runs_stepchange (
    xid bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
    at timestamptz NOT NULL DEFAULT clock_timestamp(),
    run_id bigint NOT NULL,
    s0 bigint NOT NULL,
    s1 bigint NOT NULL
);
CREATE INDEX runs_stepchange_xid ON runs_stepchange (xid);
CREATE INDEX runs_stepchange_at ON runs_stepchange (at);
CREATE TABLE runs_stepchangehorizon (
    id smallint PRIMARY KEY CHECK (id = 1),
    xid bigint NOT NULL
);
INSERT INTO runs_stepchangehorizon (id, xid) VALUES (1, 0);
"""
BACKWARD = "DROP TABLE runs_stepchange, runs_stepchangehorizon;"


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_step_completions")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
