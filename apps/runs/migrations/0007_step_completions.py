# Step completions per run (apps/runs/completions.py): one row per completion of a step
# number with its medians over the ranks, so that goodput reads a row a step rather than a
# report a rank; and the marks ingest leaves for the refresh. The completions of every run's
# newest steps still raw are computed by the first refresh: each run's retained raw steps are
# marked (the last MARK_STEPS numbers, an old timeline's included: goodput reads the last
# ALERT_STEP_WINDOW).
from django.db import migrations

MARK_STEPS = 1000

FORWARD = f"""
CREATE TABLE runs_stepcompletion (
    run_id bigint NOT NULL,
    step bigint NOT NULL,
    t0 timestamptz NOT NULL,
    t1 timestamptz NOT NULL,
    n integer NOT NULL,
    end_ts float8 NOT NULL,
    step_time float8 NOT NULL,
    data float8 NOT NULL,
    first_start float8 NOT NULL,
    tokens bigint
);
CREATE INDEX runs_stepcompletion_run_step ON runs_stepcompletion (run_id, step);
CREATE INDEX runs_stepcompletion_t1_brin ON runs_stepcompletion USING brin (t1);
CREATE TABLE runs_completiondirty (
    run_id bigint NOT NULL,
    s0 bigint NOT NULL,
    s1 bigint NOT NULL
);
CREATE INDEX runs_completiondirty_run ON runs_completiondirty (run_id, s1);
INSERT INTO runs_completiondirty (run_id, s0, s1)
SELECT id, greatest(top - {MARK_STEPS}, 0), top FROM (
    SELECT id, (SELECT max(step) FROM runs_stepreport s WHERE s.run_id = r.id) AS top
    FROM runs_run r
) r WHERE top IS NOT NULL;
"""
BACKWARD = "DROP TABLE runs_stepcompletion, runs_completiondirty;"


class Migration(migrations.Migration):
    dependencies = [("runs", "0006_run_timeline")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
