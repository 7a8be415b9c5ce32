# Rollup tables (1 minute and 1 hour) of samples and step reports, and the dirty ranges that
# ingest records for them. Plain SQL like telemetry_chunk: no surrogate ids, the primary key
# is the series (or run/rank) and the bucket; layout and reasons in apps/history/services.py.
from django.db import migrations

SAMPLE_ROLLUP = """
CREATE TABLE {table} (
    bucket timestamptz NOT NULL,
    vsum float8 NOT NULL,
    vmin float8 NOT NULL,
    vmax float8 NOT NULL,
    node_id integer NOT NULL,
    metric_id integer NOT NULL,
    n integer NOT NULL,
    gpu smallint NOT NULL,
    PRIMARY KEY (node_id, metric_id, gpu, bucket)
);
CREATE INDEX {table}_bucket_brin ON {table} USING brin (bucket);
"""

STEP_ROLLUP = """
CREATE TABLE {table} (
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
    rank integer NOT NULL,
    n integer NOT NULL,
    data_time_n integer NOT NULL,
    h2d_time_n integer NOT NULL,
    compute_time_n integer NOT NULL,
    comm_wait_n integer NOT NULL,
    loss_n integer NOT NULL,
    PRIMARY KEY (run_id, bucket, rank)
);
CREATE INDEX {table}_bucket_brin ON {table} USING brin (bucket);
"""

DIRTY = """
CREATE TABLE history_dirty_series (
    t0 timestamptz NOT NULL,
    t1 timestamptz NOT NULL,
    node_id integer NOT NULL,
    metric_id integer NOT NULL,
    gpu smallint NOT NULL
);
CREATE TABLE history_dirty_run (
    t0 timestamptz NOT NULL,
    t1 timestamptz NOT NULL,
    run_id bigint NOT NULL
);
CREATE TABLE history_watermark (
    id smallint PRIMARY KEY CHECK (id = 1),
    rolled_up_at timestamptz NOT NULL
);
"""

TABLES = [
    "history_sample_1m",
    "history_sample_1h",
    "history_step_1m",
    "history_step_1h",
    "history_dirty_series",
    "history_dirty_run",
    "history_watermark",
]


class Migration(migrations.Migration):
    dependencies = [("telemetry", "0002_chunk_table"), ("runs", "0001_initial")]

    operations = [
        migrations.RunSQL(
            SAMPLE_ROLLUP.format(table="history_sample_1m")
            + SAMPLE_ROLLUP.format(table="history_sample_1h")
            + STEP_ROLLUP.format(table="history_step_1m")
            + STEP_ROLLUP.format(table="history_step_1h")
            + DIRTY,
            "DROP TABLE " + ", ".join(TABLES),
        ),
    ]
