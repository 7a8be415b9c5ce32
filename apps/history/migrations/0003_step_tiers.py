# Step rollups for the run page at 256 ranks: per rank, the sum of step time less collective
# wait (`busy_sum`: the heat-map, where a straggler stands out), a 10-second tier (15 minutes
# of 256 ranks in 23 k rows rather than 230 k reports) and a 10-minute tier (a day in 37 k rows
# rather than 368 k); per run, every rank summed per 10 seconds, minute and hour
# (`history_runstep_*`: throughput, stages and loss read one row a bucket, not one a rank).
# Existing raw reports are marked dirty, so the next rollup pass fills the new columns and
# tables; minutes older than the raw retention keep busy_sum NULL (shown as no data).
from django.db import migrations

# Rank and run tables share their sums and counts; they differ in key and one column each.
STEP_TABLE = """
CREATE TABLE {{table}} (
    run_id bigint NOT NULL,
    bucket timestamptz NOT NULL,
    max_step bigint NOT NULL,
    tokens_sum bigint,
    step_time_sum float8 NOT NULL,
    step_time_max float8 NOT NULL,
    data_time_sum float8,
    h2d_time_sum float8,
    compute_time_sum float8,
    comm_wait_sum float8,
    loss_sum float8,
    n integer NOT NULL,
    data_time_n integer NOT NULL,
    h2d_time_n integer NOT NULL,
    compute_time_n integer NOT NULL,
    comm_wait_n integer NOT NULL,
    loss_n integer NOT NULL,
    {extra},
    PRIMARY KEY ({key})
);
CREATE INDEX {{table}}_bucket_brin ON {{table}} USING brin (bucket);
"""
RANK_STEP_ROLLUP = STEP_TABLE.format(
    extra="rank integer NOT NULL, busy_sum float8", key="run_id, bucket, rank"
)
RUNSTEP_ROLLUP = STEP_TABLE.format(extra="ranks integer NOT NULL", key="run_id, bucket")

FORWARD = (
    "ALTER TABLE history_step_1m ADD COLUMN busy_sum float8;"
    "ALTER TABLE history_step_1h ADD COLUMN busy_sum float8;"
    + RANK_STEP_ROLLUP.format(table="history_step_10s")
    + RANK_STEP_ROLLUP.format(table="history_step_10m")
    + RUNSTEP_ROLLUP.format(table="history_runstep_10s")
    + RUNSTEP_ROLLUP.format(table="history_runstep_1m")
    + RUNSTEP_ROLLUP.format(table="history_runstep_1h")
    + "INSERT INTO history_dirty_run (run_id, t0, t1)"
    " SELECT run_id, min(ts), max(ts) FROM runs_stepreport GROUP BY run_id;"
)
BACKWARD = (
    "DROP TABLE history_step_10s, history_step_10m, history_runstep_10s, history_runstep_1m,"
    " history_runstep_1h;"
    "ALTER TABLE history_step_1m DROP COLUMN busy_sum;"
    "ALTER TABLE history_step_1h DROP COLUMN busy_sum;"
)


class Migration(migrations.Migration):
    dependencies = [("history", "0002_stepreport_run_ts")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
