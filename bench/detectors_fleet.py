"""`python bench/detectors.py --clusters 64`: detection per cluster on the real stack.

Seeds a scratch database `opsboard_bench_detectors` with N clusters of `--ranks` ranks each
(256: 32 nodes × 8 GPUs), each with a running run whose last 130 steps of every rank are raw
step reports (one rank 35 % slow, so the straggler detector has work) and the last 10
minutes of the window's seven GPU metrics as sample chunks, a point every `--sample-interval`
seconds (10: the agent's default `--interval`; 1 for agents at 1 Hz). Starts 2 periodic
Celery workers (concurrency 1 each, as two hosts would run them) and sends beat's tick
(`alerts.evaluate_all`) every ALERT_EVALUATE_INTERVAL (5 s) itself: 2 ticks to warm up
(imports, first connections), then `--ticks` measured. Prints, per tick, how many clusters'
passes finished within the period and when the last one did; then what one cluster's pass
costs: its wall time (DetectorPass.duration_s, median and p95) and the CPU of the workers
and of their Postgres backends per pass.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import bench.common as common
from bench.common import LOG_DIR, ROOT, percentile, prepare_database
from bench.pages_seed import STEPS_SQL, UNLOGGED_TABLES, tables_unlogged

GPUS, STEPS, WORKERS, WARM_UP_TICKS = 8, 130, 2, 2
TELEMETRY_S = 600
# The GPU metrics of the detectors' window (apps.alerts.selectors.window.WINDOW_METRICS),
# at healthy values (bench/detectors.py's): a pass finds nothing wrong with the GPUs.
METRICS = {
    "gpu.temp_c": 63.0, "gpu.throttle_reasons": 0.0, "gpu.mem_used_bytes": 0.78 * 80 * 2**30,
    "gpu.mem_total_bytes": 80 * 2**30, "gpu.power_w": 630.0, "gpu.power_limit_w": 700.0,
    "gpu.util": 96.0,
}  # fmt: skip
# One sealed chunk per series over the last TELEMETRY_S, a point every `interval` seconds.
_CHUNKS_SQL = """
INSERT INTO telemetry_chunk (node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed,
                             offsets_ms, vals)
SELECT n.id, m.id, g, to_timestamp(%(lo)s), to_timestamp(%(lo)s + (%(points)s - 1) * %(step)s),
       %(points)s, b.base, b.base, b.base * %(points)s, true, o.offs,
       array_fill(b.base, ARRAY[%(points)s::int])
FROM unnest(%(nodes)s::int4[]) n(id) CROSS JOIN generate_series(0, 7) g
CROSS JOIN unnest(%(metrics)s::text[], %(bases)s::float8[]) b(name, base)
JOIN telemetry_metric m ON m.name = b.name
CROSS JOIN (SELECT array_agg((i * %(step)s * 1000)::int ORDER BY i) AS offs
            FROM generate_series(0, %(points)s - 1) i) o
"""


def seed(*, conninfo: str, clusters: int, ranks: int, now: float, interval: float) -> None:
    """N clusters, each with its nodes (seen now), a running run, its steps and chunks."""
    import psycopg
    from django.utils import timezone

    from apps.clusters.models import Cluster, Node
    from apps.core.times import to_datetime
    from apps.runs.models import Run
    from apps.telemetry.services import metric_ids

    began = time.perf_counter()
    metric_ids(names=METRICS)
    nodes_per_cluster = max(1, ranks // GPUS)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        tables_unlogged(conn, UNLOGGED_TABLES)  # a scratch database: no WAL for bulk tables
        for index in range(clusters):
            cluster = Cluster.objects.create(name=f"bench-{index:03d}")
            nodes = Node.objects.bulk_create(
                Node(cluster=cluster, name=f"node-{n:03d}", last_seen=timezone.now())
                for n in range(nodes_per_cluster)
            )
            run = Run.objects.create(
                cluster=cluster, name="bench-run", first_step=0, last_step=STEPS - 1,
                last_step_at=to_datetime(now - 1), world_size=ranks,
            )  # fmt: skip
            node_ids = [node.id for node in nodes]
            conn.execute(
                STEPS_SQL,
                {"lo": int(now) - STEPS, "hi": int(now), "first": int(now) - STEPS,
                 "run": run.id, "nodes": node_ids, "slow": ranks // 2, "ranks": ranks},
            )  # fmt: skip
            conn.execute(
                _CHUNKS_SQL,
                {"lo": int(now) - TELEMETRY_S, "points": int(TELEMETRY_S / interval),
                 "step": interval, "nodes": node_ids, "metrics": list(METRICS),
                 "bases": [float(v) for v in METRICS.values()]},
            )  # fmt: skip
        conn.execute("ANALYZE")
    print(
        f"seeded {clusters} clusters × {ranks} ranks ({clusters * ranks * STEPS:,} step reports,"
        f" {clusters * nodes_per_cluster * GPUS * len(METRICS):,} sample chunks of"
        f" {int(TELEMETRY_S / interval)} points)"
        f" in {time.perf_counter() - began:.0f} s",
        flush=True,
    )


def periodic_workers(env: dict[str, str]) -> list[subprocess.Popen]:
    """WORKERS periodic Celery workers of concurrency 1, each under a node name of its own."""
    from launcher.commands import server_commands

    queue = env["OPSBOARD_REDIS_PREFIX"]
    command = server_commands(
        host="127.0.0.1", port=1, ws_port=2, web_workers=1, worker_concurrency=1,
        queue=queue, beat_schedule=LOG_DIR / "beat-schedule", periodic_concurrency=1,
        log_level="WARNING",
    )["periodic"]  # fmt: skip
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    workers = []
    for index in range(WORKERS):
        named = list(command)
        named[named.index("-n") + 1] = f"periodic{index}.{queue}@%h"
        with open(LOG_DIR / f"detectors-periodic{index}.log", "ab") as log:
            workers.append(
                subprocess.Popen(
                    named,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**env, "PGAPPNAME": f"periodic{index}"},
                )  # fmt: skip
            )
    return workers


def workers_wait(app: Any, names: list[str], timeout: float = 180) -> None:
    """Until the workers `names` answer a ping (a loaded machine takes a while to start
    them; other deployments' workers on the same Redis may answer too, and do not count)."""
    deadline = time.monotonic() + timeout
    while len(app.control.ping(destination=names, timeout=1.0)) < len(names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not all of {names} answer")
    print(f"{len(names)} periodic workers ready", flush=True)


def passes_since(at: float) -> list[tuple[float, float]]:
    """(finished at, seconds taken) of every cluster's pass that finished since `at`."""
    from apps.alerts.models import DetectorPass
    from apps.core.times import to_datetime

    return [
        (ran_at.timestamp(), duration)
        for ran_at, duration in DetectorPass.objects.filter(
            ran_at__gte=to_datetime(at)
        ).values_list("ran_at", "duration_s")
    ]


def run(*, clusters: int, ranks: int, ticks: int, interval: float) -> None:
    common.BENCH_DB = f"{common.BENCH_DB}_detectors"
    env, conninfo = prepare_database()
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    import django

    django.setup()
    from celery import current_app
    from django.conf import settings
    from django.utils import timezone

    from apps.clusters.models import Node
    from bench.cpu import CpuMeter

    period = settings.ALERT_EVALUATE_INTERVAL
    seed(conninfo=conninfo, clusters=clusters, ranks=ranks, now=time.time(), interval=interval)
    workers = periodic_workers(env)
    meter = CpuMeter(
        {f"periodic{i}": worker.pid for i, worker in enumerate(workers)}, common.BENCH_DB
    )
    try:
        host, queue = socket.gethostname(), env["OPSBOARD_REDIS_PREFIX"]
        workers_wait(current_app, [f"periodic{i}.{queue}@{host}" for i in range(WORKERS)])
        durations: list[float] = []
        late_ticks = 0
        for tick in range(1 - WARM_UP_TICKS, ticks + 1):  # tick ≤ 0: warm-up
            if tick == 1:
                meter.begin()
            # the agents' batches keep the nodes seen (else heartbeat would fire on all)
            Node.objects.update(last_seen=timezone.now())
            sent_at = time.time()
            current_app.send_task("alerts.evaluate_all", expires=period)
            time.sleep(max(0.0, sent_at + period - 0.05 - time.time()))
            done = passes_since(sent_at)
            last = max((at for at, _ in done), default=sent_at) - sent_at
            label = "warm-up" if tick <= 0 else f"tick {tick}"
            print(
                f"{label:>8}: {len(done)}/{clusters} clusters' passes finished within the period,"
                f" the last {last:.2f} s after the tick",
                flush=True,
            )
            if tick > 0:
                durations += [duration for _, duration in done]
                late_ticks += len(done) < clusters
        cpu = meter.per_sample_us(max(1, len(durations)))
        from apps.alerts.selectors import periodic_skips

        print("skipped passes:", periodic_skips() or "none", flush=True)
    finally:
        for worker in workers:
            worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
    summary(durations, cpu, clusters=clusters, ticks=ticks, late_ticks=late_ticks, period=period)


def summary(
    durations: list[float], cpu: dict[str, Any], *, clusters: int, ticks: int,
    late_ticks: int, period: float,
) -> None:  # fmt: skip
    on_time = "yes" if late_ticks == 0 and durations else "NO"
    print(
        f"all {clusters} clusters within the {period:.0f} s period on {WORKERS} periodic"
        f" workers, every tick: {on_time} ({ticks - late_ticks}/{ticks} ticks)"
    )
    if durations:
        print(
            f"per cluster pass: wall median {statistics.median(durations) * 1000:.0f} ms,"
            f" p95 {percentile(durations, 95) * 1000:.0f} ms ({len(durations)} passes)"
        )
    print("CPU per cluster pass (ms):")
    for role, micros in cpu.items():
        print(f"  {role:<28} {micros / 1000:8.1f}")
    print(
        f"capacity: {WORKERS} workers × {period:.0f} s / median pass ="
        f" {WORKERS * period / statistics.median(durations):.0f} clusters a period"
        if durations
        else ""
    )


def main(*, clusters: int, ranks: int, ticks: int, interval: float) -> None:
    sys.path.insert(0, str(ROOT))
    run(clusters=clusters, ranks=ranks, ticks=ticks, interval=interval)
