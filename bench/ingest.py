"""Ingest benchmark: concurrent HTTP senders against the running stack, measured side by side
with a raw COPY of the same rows on the same server.

    make bench            # or: python bench/ingest.py --seconds 30 --senders 6

Uses DATABASE_URL / REDIS_URL when set (a scratch database `opsboard_bench` is created on that
server), else the embedded default under ./var/bench/. Starts its own web server, Celery
worker and live publisher on 127.0.0.1, and stops them at the end. Prints:
  - samples/s accepted (202s) and committed (stored by the workers), and end to end
    (first POST until the last row is committed); committed ÷ accepted; backlog trend;
  - rolled up: first POST until the rollup passes hold every sample; CPU per sample by
    role, to the last commit and with the rollups' catch-up included;
  - POST latency p50/p99; POST → websocket delta lag p50/p99;
  - raw binary COPY rate of the same samples, 1,000-row batches, a commit each; ours ÷ raw;
  - bytes on disk per stored sample, as ingested and after compaction;
  - p95 of a chart query during full ingest ÷ the same query idle.

`--frontier` sends the mix of a 16,384-rank run instead, paced (bench/ingest_frontier.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import ingest_frontier, step_disk  # noqa: E402
from bench.common import (  # noqa: E402
    BenchStack,
    deployment_arguments,
    inbox_wait_empty,
    percentile,
    prepare_database,
    rollups_wait_current,
    sample_rows,
    session_cookie,
)
from bench.load import (  # noqa: E402
    SECONDS_PER_BATCH,
    SERIES_PER_NODE,
    ChartQuery,
    Probe,
    Senders,
    make_bodies,
)


def ingest_group(stack: BenchStack) -> str:
    return "an idle cpu cgroup" if stack.group is not None else "no cgroup of its own"


def ingest_sched(args: argparse.Namespace) -> str:
    """The scheduling class the ingest processes ran under (idle needs Linux and chrt)."""
    from launcher.commands import sched_idle_available

    return "idle" if args.ingest_sched == "idle" and sched_idle_available() else "normal"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=int(os.environ.get("BENCH_BATCHES", 3000)))
    parser.add_argument("--senders", type=int, default=None, help="6; --frontier: 16")
    parser.add_argument(
        "--seconds-per-batch",
        type=int,
        default=SECONDS_PER_BATCH,
        help="seconds of a 100-series node per batch (10: 1,000 samples; 1: an agent at 1 Hz)",
    )
    parser.add_argument(
        "--rate", type=float, default=0, help="offered samples/s (0: as fast as the server answers)"
    )
    parser.add_argument(
        "--ingest-workers",
        type=int,
        default=3,
        help="gunicorn workers of the ingest pool, as deployed; 0: one pool for all (make run)",
    )
    parser.add_argument(
        "--rates-only",
        action="store_true",
        help="print the rates and CPU per sample only: no raw COPY, disk or step-disk pass",
    )
    parser.add_argument("--web-workers", type=int, default=2, help="the pool for pages, reads")
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument(
        "--http",
        choices=["uvicorn", "gunicorn"],
        default="gunicorn",
        help="server for the HTTP API (websockets always on uvicorn)",
    )
    deployment_arguments(parser)
    ingest_frontier.frontier_arguments(parser)
    args = parser.parse_args()
    args.senders = args.senders or (16 if args.frontier else 6)

    env, conninfo = prepare_database()
    stack = BenchStack(
        env,
        web_workers=args.web_workers,
        concurrency=args.worker_concurrency,
        http=args.http,
        ingest_workers=args.ingest_workers,
        ingest_nice=args.ingest_nice,
        ingest_sched_idle=args.ingest_sched == "idle",
        ingest_idle_group=args.ingest_group == "idle",
    )
    try:
        stack.start()  # inside: a start that times out still stops what it started
        if args.frontier:
            return ingest_frontier.run(args, stack, conninfo)
        return run(args, stack, conninfo)
    finally:
        stack.stop()


def wal_lsn(conninfo: str) -> str:
    """The server's current WAL position."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return str(conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0])


def wal_since(conninfo: str, before: str) -> int:
    """WAL bytes the server wrote since `before` (a `wal_lsn`)."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [before]
        ).fetchone()
        return int(row[0])


def run(args, stack: BenchStack, conninfo: str) -> int:
    import psycopg

    secret = stack.manage("issue_token", "bench").strip()
    cookie = session_cookie(stack)
    per_sender = args.batches // args.senders
    base_ts = time.time() - 3 * 3600  # a finished past: compaction can seal it afterwards
    seconds = args.seconds_per_batch
    per_batch = seconds * SERIES_PER_NODE  # samples in one batch
    print(f"preparing {per_sender * args.senders} batches of {per_batch:,} samples...", flush=True)
    bodies = [make_bodies(sender, per_sender, base_ts, seconds) for sender in range(args.senders)]
    total_batches = per_sender * args.senders
    span = (per_sender // 16 + 1) * seconds
    chart = ChartQuery(stack, secret, base_ts, base_ts + span)
    idle = chart.sample(count=1)  # warm-up

    senders = Senders(stack.ingest_url, secret, bodies, args.rate, per_batch)
    probe = Probe(stack, secret, cookie, "bench")
    backlog: list[tuple[float, int, int]] = []  # (t, accepted rows, processed rows)
    watch_stop = threading.Event()

    def watch() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            while not watch_stop.is_set():
                row = conn.execute(
                    "SELECT count(*), count(processed_at) FROM ingest_inboxbatch"
                ).fetchone()
                backlog.append((time.monotonic(), row[0], row[1]))
                meter.snapshot()  # a process that ends between readings keeps its last
                time.sleep(0.5)

    meter = stack.cpu_meter()
    meter.begin()
    threads = [threading.Thread(target=probe.run), threading.Thread(target=watch)]
    chart_times: list[float] = []
    chart_thread = threading.Thread(target=lambda: chart_times.extend(chart.sample()))
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    chart_thread.start()
    wal_before = wal_lsn(conninfo)
    senders.run()
    chart.stop.set()
    chart_thread.join()
    inbox_wait_empty(conninfo)
    committed_at = time.monotonic()
    cpu_us = meter.per_sample_us(total_batches * per_batch)
    probe.stop.set()
    watch_stop.set()
    for thread in threads:
        thread.join()
    # the rollups of these samples are work of the same load: CPU counted until they are done
    rollups_wait_current(conninfo)
    rolled_at = time.monotonic()
    wal_bytes = wal_since(conninfo, wal_before)
    cpu_rolled_us = meter.per_sample_us(total_batches * per_batch)
    chart.stop.clear()
    idle = chart.sample(count=max(20, len(chart_times)))

    samples = total_batches * per_batch
    post_s = senders.last_post - senders.first_post
    e2e_s = committed_at - senders.first_post
    accepted_rate = senders.accepted * per_batch / post_s
    in_window = [b for b in backlog if senders.first_post <= b[0] <= senders.last_post]
    committed_rate = (
        (in_window[-1][2] - in_window[0][2]) * per_batch / (in_window[-1][0] - in_window[0][0])
    )
    unprocessed = [b[1] - b[2] for b in in_window]
    half = len(unprocessed) // 2
    wal_line = (
        f"WAL             {wal_bytes / total_batches:,.0f} B a POST, "
        f"{wal_bytes / samples:.1f} B a sample ({wal_bytes / 2**20:,.1f} MiB: the inbox, the "
        f"stored rows and their rollups; the whole server's, so other sessions' writes too)"
    )
    if args.rates_only:  # a loaded host: the rate and CPU lines, minutes sooner
        print(f"\ncelery concurrency {args.worker_concurrency}, {samples:,} samples")
        print(wal_line)
        print(f"end to end      {samples / e2e_s:12,.0f} samples/s  (first POST to last commit)")
        for label, spent in (("to the last commit", cpu_us), ("rollups included", cpu_rolled_us)):
            roles = ", ".join(f"{role} {us:.2f}" for role, us in spent.items())
            print(f"CPU per sample  {label}: {roles}")
        return 0
    raw_rate = raw_copy_rate(conninfo, samples_count=min(samples, 1_000_000))
    limiter_us = rate_limiter_cost(env=stack.env)
    stored = disk_per_sample(conninfo, stack)
    step_stored = step_disk.run_measurement(stack.env)  # a focused load: see step_disk.py

    print()
    print(
        f"HTTP on {args.http}, senders {args.senders}, web workers {args.web_workers}"
        f" + ingest pool {args.ingest_workers or 'none (one pool)'}, "
        f"celery concurrency {args.worker_concurrency}, ingest nice {args.ingest_nice}"
        f" and sched {ingest_sched(args)} in {ingest_group(stack)}, "
        f"{total_batches} batches x {per_batch:,} samples, "
        f"offered {'max' if not args.rate else f'{args.rate:,.0f} samples/s'}, "
        f"{senders.failed} failed posts"
    )
    print(f"accepted        {accepted_rate:12,.0f} samples/s  (202s while posting)")
    print(wal_line)
    print(f"committed       {committed_rate:12,.0f} samples/s  (stored while posting)")
    print(f"end to end      {samples / e2e_s:12,.0f} samples/s  (first POST to last commit)")
    print(
        f"committed / accepted  {committed_rate / accepted_rate:.2f}; inbox backlog "
        f"first half mean {statistics.fmean(unprocessed[:half] or [0]):.0f} rows, "
        f"second half mean {statistics.fmean(unprocessed[half:] or [0]):.0f} rows, "
        f"max {max(unprocessed or [0])}"
    )
    print(
        f"POST latency    p50 {percentile(senders.latencies, 50) * 1000:.1f} ms, "
        f"p99 {percentile(senders.latencies, 99) * 1000:.1f} ms"
    )
    print(
        f"live lag        p50 {percentile(probe.lags, 50) * 1000:.0f} ms, "
        f"p99 {percentile(probe.lags, 99) * 1000:.0f} ms  ({len(probe.lags)} probes)"
    )
    print(
        f"rate limiter    {limiter_us:.0f} µs per check in-process ({LIMITER_CALLS:,} calls, "
        f"one Redis round trip each) = {limiter_us / 1e4 / percentile(senders.latencies, 50):.1f}% "
        f"of the POST p50; the stack above ran with it on (default limit)"
    )
    print(f"raw COPY        {raw_rate:12,.0f} samples/s  (binary, 1,000-row batches, commit each)")
    print(f"ours / raw      {samples / e2e_s / raw_rate:.2f} (end to end)")
    print(
        f"rolled up       {samples / (rolled_at - senders.first_post):12,.0f} samples/s  (first"
        f" POST until no dirty range is left: the rollups hold every sample"
        f" {rolled_at - committed_at:.1f} s after the last commit)"
    )
    for label, spent in (("to the last commit", cpu_us), ("rollups included", cpu_rolled_us)):
        roles = ", ".join(f"{role} {us:.1f}" for role, us in spent.items() if role != "total")
        print(
            f"CPU per sample  {spent['total']:.1f} µs {label}: {roles} (2 cores at 150,000"
            f" samples/s allow {2e6 / 150_000:.1f})"
        )
    print(
        f"disk per sample {stored['ingested']:.1f} B as ingested, {stored['compacted']:.1f} B "
        f"after compaction (table + TOAST + indexes: timestamps {stored['timestamps']:.2f} B, "
        f"values {stored['values']:.2f} B, row + index {stored['rest']:.2f} B)"
    )
    print(
        f"disk per step report {step_stored['ingested']:.1f} B as ingested, "
        f"{step_stored['compacted']:.1f} B after compaction (table + TOAST + indexes; "
        f"{step_stored['reports']:,.0f} reports of 64 ranks x 2,000 steps via steps_store)"
    )
    print(
        f"chart query p95 {percentile(chart_times, 95) * 1000:.1f} ms under ingest, "
        f"{percentile(idle, 95) * 1000:.1f} ms idle, ratio "
        f"{percentile(chart_times, 95) / percentile(idle, 95):.2f}"
    )
    return 0


LIMITER_CALLS = 10_000


def rate_limiter_cost(*, env: dict[str, str]) -> float:
    """Microseconds per call of the ingest view's rate check (apps.ingest.ratelimit), the
    real function on the stack's Redis at the default limit: what each POST pays for it."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            REDIS_URL=env["REDIS_URL"],
            REDIS_PREFIX=f"bench-limiter-{uuid.uuid4().hex[:6]}",
            INGEST_RATE_PER_TOKEN=2000.0,
            INGEST_RATE_BURST=4000,
        )
    from apps.ingest.ratelimit import ingest_rate_take

    ingest_rate_take(token_id=1)  # loads the script once
    started = time.perf_counter()
    for call in range(LIMITER_CALLS):
        ingest_rate_take(token_id=call % 100)  # 100 tokens, each far below its limit
    return (time.perf_counter() - started) / LIMITER_CALLS * 1e6


# the samples' stored columns, as the raw COPY floor writes them
SAMPLE_COLUMNS = (
    ("ts", "timestamptz"), ("node_id", "int4"), ("metric_id", "int4"), ("gpu", "int2"),
    ("value", "float8"),
)  # fmt: skip


def raw_copy_rate(conninfo: str, samples_count: int) -> float:
    """Binary COPY of narrow sample rows, 1,000 rows per COPY and commit, one connection."""
    return step_disk.raw_copy_rate(conninfo, sample_rows(samples_count), SAMPLE_COLUMNS)


def disk_per_sample(conninfo: str, stack: BenchStack) -> dict[str, float]:
    import psycopg

    from apps.core.partitions import relation_bytes_sql

    # total, then the points' own bytes: timestamps (offsets array or encoded) and values;
    # the rest is the row (header, t0/t1, ids, n/min/max/sum) and the indexes
    query = (
        f"SELECT {relation_bytes_sql('telemetry_chunk', holding_rows=True)}::float8 / sum(n),"
        " sum(pg_column_size(offsets_ms) + coalesce(pg_column_size(ts_pco), 0))::float8"
        "  / sum(n),"
        " sum(pg_column_size(vals) + coalesce(pg_column_size(vals_pco), 0))::float8 / sum(n)"
        " FROM telemetry_chunk HAVING sum(n) > 0"
    )
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM FULL telemetry_chunk")
        ingested = conn.execute(query).fetchone()[0]
    stack.manage("compact_chunks", "--lookback-windows", "40")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM FULL telemetry_chunk")  # give back the space of merged rows
        compacted, timestamps, values = conn.execute(query).fetchone()
    return {
        "ingested": ingested,
        "compacted": compacted,
        "timestamps": timestamps,
        "values": values,
        "rest": compacted - timestamps - values,
    }


if __name__ == "__main__":
    sys.exit(main())
