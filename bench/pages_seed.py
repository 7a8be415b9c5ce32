"""Seeding for bench/pages.py: a 256-rank run on 32 nodes × 8 GPUs (`--ranks` sets NODES and
RANKS), by server-side SQL, and its rollups built by the production code path."""

from __future__ import annotations

import time
from typing import Any

CLUSTER, RUN = "bench", "bench-run"
NODES, GPUS, RANKS = 32, 8, 256
METRICS = ("gpu.util", "gpu.mem_used_bytes", "gpu.temp_c", "gpu.power_w")
# The detectors' other GPU window metrics (apps.alerts.selectors.window.WINDOW_METRICS), at
# healthy constants: bench/kept_window.py --all-gpu-metrics seeds them too, as an NVML
# agent sends them.
MORE_METRICS = ("gpu.mem_total_bytes", "gpu.power_limit_w", "gpu.throttle_reasons")
SLOW_RANK = 137

# 16 value patterns per metric, 600 points each: chunks copy one (no per-point work here).
_PATTERNS_SQL = """
CREATE TEMP TABLE bench_pattern AS
SELECT m.id AS metric_id, p AS pattern, array_agg(v ORDER BY i) AS vals, min(v) AS vmin,
       max(v) AS vmax, sum(v) AS vsum
FROM telemetry_metric m CROSS JOIN generate_series(0, 15) p CROSS JOIN generate_series(0, 599) i
CROSS JOIN LATERAL (SELECT round((CASE m.name
    WHEN 'gpu.util' THEN 85 + 12 * sin(i / 30.0 + p)
    WHEN 'gpu.mem_used_bytes' THEN 6.0e10 + 1.0e9 * sin(i / 90.0 + p)
    WHEN 'gpu.temp_c' THEN 70 + 5 * sin(i / 120.0 + p)
    WHEN 'gpu.mem_total_bytes' THEN 8.0e10
    WHEN 'gpu.power_limit_w' THEN 700
    WHEN 'gpu.throttle_reasons' THEN 0
    ELSE 550 + 80 * sin(i / 45.0 + p) END)::numeric, 2)::float8 AS v) x
WHERE m.name = ANY(%(metrics)s)
GROUP BY m.id, p
"""
# Sealed 10-minute chunks, as compaction leaves them, window by window (BRIN-friendly order).
_CHUNKS_SQL = """
INSERT INTO telemetry_chunk (node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed,
                             offsets_ms, vals)
SELECT n.id, p.metric_id, g, to_timestamp(w), to_timestamp(w + 599), 600, p.vmin, p.vmax,
       p.vsum, true, o.offs, p.vals
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 600, 600) w
CROSS JOIN unnest(%(nodes)s::int4[]) n(id) CROSS JOIN generate_series(0, 7) g
CROSS JOIN (SELECT array_agg(i * 1000 ORDER BY i) AS offs FROM generate_series(0, 599) i) o
JOIN bench_pattern p ON p.pattern = (n.id * 8 + g + w / 600) %% 16
"""
# One report per rank per second, naming its GPU (as the reporter does: LOCAL_RANK); rank
# SLOW_RANK is 35 % slower, the others wait for it.
STEPS_SQL = """
INSERT INTO runs_stepreport (run_id, node_id, ts, rank, step, step_time, data_time, h2d_time,
                             compute_time, comm_wait, tokens, loss, gpu)
SELECT %(run)s, (%(nodes)s::int8[])[r / 8 + 1], to_timestamp(s), r, s - %(first)s, st, 0.05,
       0.01, CASE WHEN r = %(slow)s THEN st - 0.06 ELSE 0.6 END,
       CASE WHEN r = %(slow)s THEN 0.0 ELSE st - 0.66 END, 4096,
       2.0 + 8.0 / (10 + (s - %(first)s) / 600.0), r %% 8
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) s
CROSS JOIN generate_series(0, %(ranks)s - 1) r
CROSS JOIN LATERAL (SELECT 1.35 + 0.02 * sin(s / 60.0) AS st) x
"""
SLICE_S = 6 * 3600
ROLLUP_TABLES = (
    "history_sample_1m", "history_sample_1h", "history_step_10s", "history_step_1m",
    "history_step_10m", "history_step_1h", "history_runstep_10s", "history_runstep_1m",
    "history_runstep_1h",
)  # fmt: skip
UNLOGGED_TABLES = (
    "telemetry_chunk", "runs_stepreport", *ROLLUP_TABLES, "history_dirty_series",
    "history_dirty_run",
)  # fmt: skip


def scratch_django(*, ranks: int) -> tuple[dict[str, str], str]:
    """A fresh scratch database for a seed of `ranks` ranks (8 a node), Django set up on
    it; returns prepare_database's (environment for the stack, libpq conninfo)."""
    import os

    import django

    from bench.common import prepare_database

    global NODES, RANKS, SLOW_RANK
    NODES, RANKS = max(1, ranks // GPUS), ranks
    SLOW_RANK %= ranks
    env, conninfo = prepare_database()
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    django.setup()
    return env, conninfo


def tables_unlogged(conn: Any, tables: tuple[str, ...]) -> None:
    """Each table, or each partition of a partitioned one, UNLOGGED (a partitioned table has
    no storage of its own: setting it there changes nothing)."""
    for table in tables:
        leaves = conn.execute(
            "SELECT relid::text FROM pg_partition_tree(%s) WHERE isleaf", [table]
        ).fetchall()
        for (leaf,) in leaves:
            conn.execute(f"ALTER TABLE {leaf} SET UNLOGGED")


def seed(*, conninfo: str, start: float, end: float) -> dict[str, Any]:
    """Cluster, nodes, latest health, run; then chunks and step reports by server-side SQL."""
    import psycopg
    from django.utils import timezone

    from apps.clusters.models import Cluster, Node
    from apps.core.times import to_datetime
    from apps.runs.models import Run
    from apps.telemetry.models import NodeHealth
    from apps.telemetry.services import metric_ids

    cluster = Cluster.objects.create(name=CLUSTER)
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"node-{i:02d}", last_seen=timezone.now()) for i in range(NODES)
    )
    NodeHealth.objects.bulk_create(
        NodeHealth(node=node, gpu=gpu, ts=timezone.now(), values={"gpu.util": 90.0})
        for node in nodes
        for gpu in range(-1, GPUS)
    )
    metric_ids(names=METRICS)
    run = Run.objects.create(
        cluster=cluster, name=RUN, first_step=0, last_step=int(end - start) - 1,
        last_step_at=to_datetime(end - 1), world_size=RANKS,
    )  # fmt: skip
    Run.objects.filter(pk=run.pk).update(created_at=to_datetime(start))
    ids = {"nodes": [node.id for node in nodes], "run": run.id}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # a scratch database: no WAL for the bulk tables (seeding speed is not what we time)
        tables_unlogged(conn, UNLOGGED_TABLES)
        conn.execute(_PATTERNS_SQL, {"metrics": list(METRICS)})
        # secondary indexes of the step reports are built once after loading, not row by row
        index_defs = [
            row[0]
            for row in conn.execute(
                "SELECT indexdef FROM pg_indexes WHERE tablename = 'runs_stepreport'"
                " AND indexname <> 'runs_stepreport_pkey'"
            )
        ]
        # a partitioned table's index reads ON ONLY: made again, it must cover the partitions
        index_defs = [d.replace(" ON ONLY ", " ON ", 1) for d in index_defs]
        for name in [d.split()[2] for d in index_defs]:
            conn.execute(f"DROP INDEX {name}")
        for what, sql in (("sample chunks", _CHUNKS_SQL), ("step reports", STEPS_SQL)):
            began, count = time.perf_counter(), 0
            for lo in range(int(start), int(end), SLICE_S):
                params = {"lo": lo, "hi": min(lo + SLICE_S, int(end)), "first": int(start)}
                params |= {"run": run.id, "nodes": ids["nodes"], "slow": SLOW_RANK, "ranks": RANKS}
                count += conn.execute(sql, params).rowcount
            print(f"seeded {count:,} {what} in {time.perf_counter() - began:.0f} s", flush=True)
        began = time.perf_counter()
        conn.execute("SET maintenance_work_mem = '512MB'")
        for index_def in index_defs:
            conn.execute(index_def)
        print(f"indexed step reports in {time.perf_counter() - began:.0f} s", flush=True)
        conn.execute("ANALYZE")
    return ids


def rollups_build(*, conninfo: str, start: float, end: float, fresh: bool = False) -> None:
    """The rollups, by the production code path: dirty ranges per window, then refresh
    (`fresh`: emptied first)."""
    from datetime import timedelta

    import psycopg

    from apps.core.times import to_datetime
    from apps.history.services import rollups_rebuild

    if fresh:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("TRUNCATE " + ", ".join(ROLLUP_TABLES))
    began = time.perf_counter()
    result = rollups_rebuild(
        start=to_datetime(start), end=to_datetime(end + 60), window=timedelta(hours=6)
    )
    print(
        f"rolled up {result.claimed:,} dirty ranges in {time.perf_counter() - began:.0f} s",
        flush=True,
    )
    completions_build(conninfo=conninfo)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        for table in ("telemetry_chunk", "runs_stepreport", *ROLLUP_TABLES, "runs_stepcompletion"):
            rows, size = conn.execute(
                f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}"
            ).fetchone()
            print(f"  {table:<20} {rows:>12,} rows {size / 2**20:>9,.0f} MiB", flush=True)


def completions_build(*, conninfo: str) -> None:
    """The step completions (apps.runs.completions) of every seeded step, by the production
    refresh: the seed's COPY marked none, so every run's steps are marked first."""
    import psycopg

    from apps.runs.completions import completions_refresh

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("TRUNCATE runs_stepcompletion, runs_completiondirty")
        conn.execute(
            "INSERT INTO runs_completiondirty (run_id, s0, s1)"
            " SELECT run_id, min(step), max(step) FROM runs_stepreport GROUP BY run_id"
        )
    began = time.perf_counter()
    completions_refresh()
    print(f"step completions computed in {time.perf_counter() - began:.0f} s", flush=True)


FLEET = "fleet"
FLEET_BLOCK = "rack r00"
# The fleet's latest health: 8 GPUs and the host per node; half the nodes say their rack.
_FLEET_HEALTH_SQL = """
INSERT INTO telemetry_nodehealth (node_id, gpu, ts, values)
SELECT n.id, g, now(), jsonb_build_object('gpu.util', 90.0, 'gpu.temp_c', 55 + (n.id + g) %% 20)
FROM unnest(%(nodes)s::int8[]) n(id) CROSS JOIN generate_series(-1, 7) g
"""


def fleet_seed(*, nodes: int) -> None:
    """A second cluster, FLEET, of `nodes` nodes × 8 GPUs with their latest health (the
    overview of a fleet: issue 27's 4,096 nodes); the first half in racks of 32."""
    from django.db import connection
    from django.utils import timezone

    from apps.clusters.models import Cluster, Node

    cluster = Cluster.objects.create(name=FLEET)
    created = Node.objects.bulk_create(
        Node(cluster=cluster, name=f"node-{i:04d}", last_seen=timezone.now(),
             info={"gpus": GPUS, **({"rack": f"r{i // 32:02d}"} if i < nodes // 2 else {})})
        for i in range(nodes)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(_FLEET_HEALTH_SQL, {"nodes": [node.id for node in created]})
        # as autovacuum would soon (it is off on some servers, CI's among them): planned with
        # statistics from before these rows, the overview's joins loop once per node
        cursor.execute("ANALYZE clusters_node, telemetry_nodehealth")
    print(f"seeded a fleet of {nodes:,} nodes", flush=True)
