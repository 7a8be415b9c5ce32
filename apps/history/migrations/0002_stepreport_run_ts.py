# Step reports by (run, ts): the rollup pass recomputes a run's dirty minutes and the step
# selectors read a run's newest reports; without it both scan every run's reports (the
# (run_id, step) index cannot bound ts, the BRIN on ts cannot bound run_id). Raw SQL here
# because runs_stepreport belongs to the runs app; built CONCURRENTLY: ingest keeps writing.
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("history", "0001_initial"), ("runs", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS history_stepreport_run_ts"
            " ON runs_stepreport (run_id, ts)",
            "DROP INDEX CONCURRENTLY IF EXISTS history_stepreport_run_ts",
        ),
    ]
