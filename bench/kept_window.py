"""A live detector pass from Postgres, cold beside kept (issue 27): one run of N ranks seeded
by server-side SQL (bench/pages_seed.py), then new steps arrive a few at a time and each
pass is timed both ways on the same database at the same `now`.

    python bench/kept_window.py --ranks 1024            # the default
    python bench/kept_window.py --ranks 16384 --reps 3
    python bench/kept_window.py --ranks 16384 --reps 3 --all-gpu-metrics   # 7 a GPU, not 4
    python bench/kept_window.py --ranks 16384 --ticks-per-post 1   # a POST a tick, not 10

Prints, per way (median of the reps; wall, this process's CPU and its Postgres backends' CPU
read from /proc when Postgres runs on this host, in 10 ms ticks): loading the run's step
window (cold: `steps_load`, the last ALERT_STEP_WINDOW steps of every rank; kept:
`steps_kept`, only the steps the change log names since the last pass), loading the
telemetry (cold: every window metric of every node, ALERT_TELEMETRY_WINDOW_S; kept:
`telemetry_kept`, only each node's span the sample change log names), `detect_all` (cold
memo, or the kept per-step results), and their ratio; each pass checks that the kept window
equals the cold one. Parallel workers' CPU is not counted (the kept reads use none).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.common as common  # noqa: E402
import bench.pages_seed as pages_seed  # noqa: E402

common.BENCH_DB = f"{common.BENCH_DB}_kept"  # its own scratch database: others drop theirs
SEED_STEPS = 600  # the window (120 steps) below; one sealed 10-minute chunk of telemetry


def timed(call: Callable[[], Any]) -> tuple[float, float, float, Any]:
    """(wall ms, this process's CPU ms, its Postgres backends' CPU ms, result), with the
    cyclic collector off as a periodic pass runs (apps.core.heap.gc_paused)."""
    from apps.core.heap import gc_paused

    with gc_paused():
        wall, cpu, server = time.perf_counter(), time.process_time(), backends_cpu()
        result = call()
        return (
            (time.perf_counter() - wall) * 1e3,
            (time.process_time() - cpu) * 1e3,
            backends_cpu() - server,
            result,
        )


_BACKENDS: list[int] = []  # this process's Postgres backends (same host): their pids


def backends_cpu() -> float:
    """CPU ms of this process's Postgres backends so far (/proc, in clock ticks: 10 ms)."""
    tick = 1e3 / os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _BACKENDS:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) * tick  # utime, stime
    return total


def backends_find() -> None:
    from django.db import connections

    from apps.core.db_router import read_alias

    for alias in sorted({"default", read_alias()}):
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        if Path(f"/proc/{pid}/stat").exists() and pid not in _BACKENDS:
            _BACKENDS.append(pid)


# Each node's GPU series as the agent posts them (opsboard_agent.agent: `ticks` 1 Hz ticks a
# batch, a raw chunk of that many points a series): node number i posts at the seconds s with
# (s + i) % ticks = 0 the points since its last post, none before `start` (the seeded
# window's end); the nodes' posts are staggered as their agents' start times are. A chunk's
# point is at t0 and vmin is its value when it has one, as ingest writes it.
_SAMPLES_SQL = """
WITH posted AS (
INSERT INTO telemetry_chunk (node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed,
                             offsets_ms, vals)
SELECT n.id, m.id, g, to_timestamp(p.t0), to_timestamp(s), a.n, a.vmin, a.vmax, a.vsum, false,
       a.offs, a.vals
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) s
CROSS JOIN unnest(%(nodes)s::int4[]) WITH ORDINALITY n(id, i)
CROSS JOIN LATERAL (SELECT greatest(s - %(ticks)s + 1, %(start)s::bigint) AS t0) p
CROSS JOIN generate_series(0, 7) g
CROSS JOIN telemetry_metric m
CROSS JOIN LATERAL (
    SELECT count(*)::int4 AS n, min(x.v) AS vmin, max(x.v) AS vmax, sum(x.v) AS vsum,
           array_agg(((t - p.t0) * 1000)::int4 ORDER BY t) AS offs,
           array_agg(x.v ORDER BY t) AS vals
    FROM generate_series(p.t0, s) t
    CROSS JOIN LATERAL (SELECT CASE m.name WHEN 'gpu.mem_total_bytes' THEN 8.0e10
        WHEN 'gpu.power_limit_w' THEN 700 WHEN 'gpu.throttle_reasons' THEN 0
        ELSE 60 + (t %% 7 + g)::float8 END AS v) x) a
WHERE m.name = ANY(%(metrics)s) AND (s + n.i) %% %(ticks)s = 0
RETURNING node_id, t0, t1)
INSERT INTO telemetry_samplechange (node_id, t0, t1)
SELECT node_id, extract(epoch FROM min(t0)), extract(epoch FROM max(t1))
FROM posted GROUP BY node_id
"""


def data_arrives(
    *,
    conninfo: str,
    run_id: int,
    nodes: list[int],
    first: int,
    lo: int,
    hi: int,
    start: int | None = None,
    ticks: int = 1,
) -> None:
    """Step reports of every rank for the seconds [lo, hi), and the samples the nodes post
    in them (`ticks` a POST, none before `start`, default lo), stored and logged as changed
    in one transaction, as ingest does; the run's last step moves on."""
    import psycopg

    params = {"lo": lo, "hi": hi, "first": first, "run": run_id, "nodes": nodes}
    params |= {"slow": pages_seed.SLOW_RANK, "ranks": pages_seed.RANKS}
    params |= {"start": lo if start is None else start, "ticks": ticks}
    with psycopg.connect(conninfo) as conn:
        conn.execute(pages_seed.STEPS_SQL, params)
        conn.execute(
            "UPDATE runs_run SET last_step = %s, last_step_at = to_timestamp(%s) WHERE id = %s",
            [hi - 1 - first, hi - 1, run_id],
        )
        conn.execute(
            "INSERT INTO runs_stepchange (run_id, s0, s1) VALUES (%s, %s, %s)",
            [run_id, lo - first, hi - 1 - first],
        )
        conn.execute(_SAMPLES_SQL, params | {"metrics": list(pages_seed.METRICS)})


# Sealed history before the seeded window: each series' seeded chunk, copied back a chunk's
# width at a time (two points each: what is read is the rows, not their points).
_HISTORY_SQL = """
INSERT INTO telemetry_chunk (node_id, metric_id, gpu, t0, t1, n, vmin, vmax, vsum, sealed,
                             offsets_ms, vals)
SELECT c.node_id, c.metric_id, c.gpu, c.t0 - make_interval(secs => k * 600),
       c.t0 - make_interval(secs => k * 600 - 599), 2, c.vmin, c.vmin, 2 * c.vmin, true,
       ARRAY[0, 599000], ARRAY[c.vmin, c.vmin]
FROM telemetry_chunk c CROSS JOIN generate_series(1, %(chunks)s) k
WHERE c.n = %(points)s
"""


def history(*, conninfo: str, hours: float) -> None:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(_HISTORY_SQL, {"chunks": int(hours * 6), "points": SEED_STEPS})
        conn.execute("ANALYZE telemetry_chunk")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=1024, help="ranks, 8 a node (1,024)")
    parser.add_argument("--reps", type=int, default=5, help="passes each way (5)")
    parser.add_argument("--new-steps", type=int, default=5, help="steps between passes (5)")
    parser.add_argument("--history-hours", type=float, default=0.0,
                        help="hours of sealed telemetry before the window (0)")  # fmt: skip
    parser.add_argument("--all-gpu-metrics", action="store_true",
                        help="all 7 GPU window metrics, not 4 (as NVML agents)")  # fmt: skip
    parser.add_argument("--ticks-per-post", type=int, default=10,
                        help="1 Hz ticks an agent posts at once (10: its default "
                        "--batch-seconds; 1: a POST a tick)")  # fmt: skip
    args = parser.parse_args()
    if args.all_gpu_metrics:
        pages_seed.METRICS = pages_seed.METRICS + pages_seed.MORE_METRICS
    _, conninfo = pages_seed.scratch_django(ranks=args.ranks)
    end = float(int(time.time()) - args.reps * args.new_steps)
    began = time.perf_counter()
    ids = pages_seed.seed(conninfo=conninfo, start=end - SEED_STEPS, end=end)
    print(f"seeded {args.ranks:,} ranks × {SEED_STEPS} steps in "
          f"{time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    if args.history_hours:
        began = time.perf_counter()
        history(conninfo=conninfo, hours=args.history_hours)
        print(f"{args.history_hours:g} h of sealed history in "
              f"{time.perf_counter() - began:.0f} s", flush=True)  # fmt: skip
    passes(args=args, ids=ids, conninfo=conninfo, end=int(end))


def passes(*, args: argparse.Namespace, ids: dict[str, Any], conninfo: str, end: int) -> None:
    from django.conf import settings
    from django.db import connection

    from apps.alerts.selectors import window as window_module
    from apps.alerts.selectors.kept import KeptWindow, steps_kept
    from apps.alerts.selectors.kept_telemetry import live_telemetry_end, telemetry_kept
    from apps.alerts.selectors.steps import steps_load
    from apps.clusters.models import Cluster, Node
    from apps.runs.models import Run
    from detectors import detect_all

    cluster = Cluster.objects.get(name=pages_seed.CLUSTER)
    names = dict(Node.objects.filter(cluster=cluster).values_list("id", "name"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, name FROM telemetry_metric WHERE name = ANY(%s)",
                       [list(window_module.WINDOW_METRICS)])  # fmt: skip
        metrics = dict(cursor.fetchall())
    kept = KeptWindow()
    now = float(end)

    def run() -> list[Run]:
        return [Run.objects.get(pk=ids["run"])]

    backends_find()  # on this host only: elsewhere Postgres's CPU reads as 0
    # the first pass reads whole
    detect_all(window_module.cluster_window(cluster=cluster, now=now, kept=kept), now,
               kept=kept.results)  # fmt: skip
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for rep in range(args.reps):
        lo = end + rep * args.new_steps
        data_arrives(conninfo=conninfo, run_id=ids["run"], nodes=ids["nodes"],
                     first=end - SEED_STEPS, lo=lo, hi=lo + args.new_steps, start=end,
                     ticks=args.ticks_per_post)  # fmt: skip
        now = float(lo + args.new_steps)
        edge = live_telemetry_end(now)
        timings = {
            "steps cold": timed(lambda: steps_load(run(), names=names, until=None)),
            "steps kept": timed(lambda: steps_kept(run(), names=names, kept=kept)),
            "telemetry cold": timed(
                lambda: window_module._telemetry(names=names, now=now, end=edge)  # noqa: B023
            ),
            "telemetry kept": timed(
                lambda: telemetry_kept(
                    names=names,
                    metrics=metrics,
                    now=now,  # noqa: B023
                    kept=kept.telemetry,
                )  # fmt: skip
            ),
        }
        cold_window = window_module.cluster_window(cluster=cluster, now=now)
        window = window_module.cluster_window(cluster=cluster, now=now, kept=kept)
        assert window.telemetry == cold_window.telemetry, "the kept telemetry differs"
        assert sorted(window.runs[0].steps) == sorted(cold_window.runs[0].steps)
        timings["detect_all cold"] = timed(lambda: detect_all(cold_window, now))  # noqa: B023
        timings["detect_all kept"] = timed(
            lambda: detect_all(window, now, kept=kept.results)  # noqa: B023
        )
        for key, (wall, cpu, server, _) in timings.items():
            rows.setdefault(key, []).append((wall, cpu, server))
    report(rows, args=args, window_steps=settings.ALERT_STEP_WINDOW)


def report(rows: dict[str, list[tuple[float, float, float]]], *, args: Any,
           window_steps: int) -> None:  # fmt: skip
    med = {key: tuple(statistics.median(v[i] for v in values) for i in (0, 1, 2))
           for key, values in rows.items()}  # fmt: skip
    print(f"\n{args.ranks:,} ranks, {len(pages_seed.METRICS)} GPU metrics, window {window_steps} "
          f"steps, {args.new_steps} new steps a pass, {args.ticks_per_post} ticks a POST, "
          f"median of {args.reps} (ms; Postgres: its backends' CPU)")  # fmt: skip
    print(f"{'':24}{'wall':>10}{'CPU':>10}{'Postgres':>10}{'CPU+PG':>10}")
    for key, (wall, cpu, server) in med.items():
        print(f"{key:24}{wall:10.1f}{cpu:10.1f}{server:10.1f}{cpu + server:10.1f}")
    cold = [med[k] for k in ("steps cold", "telemetry cold", "detect_all cold")]
    kept = [med[k] for k in ("steps kept", "telemetry kept", "detect_all kept")]
    for label, parts in (("pass cold", cold), ("pass kept", kept)):
        wall, cpu, server = (sum(p[i] for p in parts) for i in (0, 1, 2))
        print(f"{label:24}{wall:10.1f}{cpu:10.1f}{server:10.1f}{cpu + server:10.1f}")
    ratio = sum(p[0] for p in kept) / max(1e-9, sum(p[0] for p in cold))
    steps_ratio = med["steps kept"][0] / max(1e-9, med["steps cold"][0])
    telemetry_ratio = med["telemetry kept"][0] / max(1e-9, med["telemetry cold"][0])
    print(f"kept ÷ cold: steps {steps_ratio:.3f}, telemetry {telemetry_ratio:.3f}, "
          f"whole pass (wall) {ratio:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
