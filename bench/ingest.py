"""Ingest benchmark: concurrent HTTP senders against the running stack, measured side by side
with a raw COPY of the same rows on the same server.

    make bench            # or: python bench/ingest.py --seconds 30 --senders 6

Uses DATABASE_URL / REDIS_URL when set (a scratch database `opsboard_bench` is created on that
server), else the embedded default under ./var/bench/. Starts its own web server, Celery
worker and live publisher on 127.0.0.1, and stops them at the end. Prints:
  - samples/s accepted (202s) and committed (stored by the workers), and end to end
    (first POST until the last row is committed); committed ÷ accepted; backlog trend;
  - POST latency p50/p99; POST → websocket delta lag p50/p99;
  - raw binary COPY rate of the same samples, 1,000-row batches, a commit each; ours ÷ raw;
  - bytes on disk per stored sample, as ingested and after compaction;
  - p95 of a chart query during full ingest ÷ the same query idle.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import step_disk  # noqa: E402
from bench.common import (  # noqa: E402
    BenchStack,
    inbox_wait_empty,
    percentile,
    prepare_database,
    sample_rows,
    session_cookie,
)

GPUS, GPU_METRICS = 8, 12
HOST_METRICS = 4
SERIES_PER_NODE = GPUS * GPU_METRICS + HOST_METRICS  # 100 series: 1,000 samples = 10 s of a node
SECONDS_PER_BATCH = 10
PROBE_INTERVAL_S = 1.2


def make_bodies(sender: int, count: int, base_ts: float) -> list[bytes]:
    """`count` 1,000-sample batches for this sender's own nodes, in time order."""
    bodies = []
    for index in range(count):
        node = f"bench-{sender:02d}-{index % 16:02d}"
        start = base_ts + (index // 16) * SECONDS_PER_BATCH
        samples = []
        for second in range(SECONDS_PER_BATCH):
            ts = start + second
            for gpu in range(GPUS):
                for metric in range(GPU_METRICS):
                    value = (index * 7 + gpu * 13 + metric * 17 + second) % 100 + 0.5
                    samples.append(
                        {"ts": ts, "metric": f"gpu.m{metric}", "gpu": gpu, "value": value}
                    )
            for metric in range(HOST_METRICS):
                samples.append({"ts": ts, "metric": f"host.m{metric}", "value": 1.5e9 + second})
        batch = {
            "batch_id": f"{sender}-{index}-{uuid.uuid4().hex[:6]}",
            "node": node,
            "samples": samples,
        }
        bodies.append(gzip.compress(json.dumps(batch).encode(), compresslevel=1))
    return bodies


class Senders:
    """Concurrent posters; with `rate` (samples/s) they keep to that offered load."""

    def __init__(self, url: str, secret: str, bodies: list[list[bytes]], rate: float) -> None:
        self.url, self.secret, self.bodies = url, secret, bodies
        self.batch_interval = len(bodies) * 1000 / rate if rate else 0.0
        self.latencies: list[float] = []
        self.accepted = 0
        self.failed = 0
        self.first_post = self.last_post = 0.0
        self.lock = threading.Lock()

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._send, args=(bodies, index / len(self.bodies)))
            for index, bodies in enumerate(self.bodies)
        ]
        self.first_post = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.last_post = time.monotonic()

    def _send(self, bodies: list[bytes], phase: float) -> None:
        import httpx

        headers = {
            "Authorization": f"Bearer {self.secret}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",  # as the agent sends
        }
        with httpx.Client(base_url=self.url, timeout=60) as client:
            for index, body in enumerate(bodies):
                due = self.first_post + (index + phase) * self.batch_interval
                time.sleep(max(0.0, due - time.monotonic()))
                started = time.monotonic()
                response = client.post("/api/v1/ingest", content=body, headers=headers)
                elapsed = time.monotonic() - started
                with self.lock:
                    self.latencies.append(elapsed)
                    if response.status_code == 202:
                        self.accepted += 1
                    else:
                        self.failed += 1


class Probe:
    """Posts a one-sample batch for a probe node every 1.2 s and times its websocket delta.

    An agent posts a node's batch every second or more; the publisher sends a node at most
    once a second by design, so a faster probe would measure that hold, not the pipeline."""

    def __init__(self, stack: BenchStack, secret: str, cookie: str, cluster: str) -> None:
        self.stack, self.secret, self.cookie, self.cluster = stack, secret, cookie, cluster
        self.lags: list[float] = []
        self.stop = threading.Event()
        self.sent: dict[float, float] = {}

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import httpx
        import websockets

        url = f"ws://127.0.0.1:{self.stack.ws_port}/ws/clusters/{self.cluster}/"
        headers = {"Cookie": self.cookie, "Origin": f"http://127.0.0.1:{self.stack.port}"}
        async with websockets.connect(url, additional_headers=headers, max_size=2**24) as ws:
            receiver = asyncio.create_task(self._receive(ws))
            async with httpx.AsyncClient(base_url=self.stack.ingest_url, timeout=30) as client:
                marker = 0.0
                while not self.stop.is_set():
                    marker += 1
                    batch = {
                        "batch_id": uuid.uuid4().hex,
                        "node": "probe",
                        "samples": [{"ts": time.time(), "metric": "probe.marker", "value": marker}],
                    }
                    self.sent[marker] = time.monotonic()
                    await client.post(
                        "/api/v1/ingest",
                        json=batch,
                        headers={"Authorization": f"Bearer {self.secret}"},
                    )
                    await asyncio.sleep(PROBE_INTERVAL_S)
            await asyncio.sleep(2)
            receiver.cancel()

    async def _receive(self, ws) -> None:
        seen: set[float] = set()
        async for message in ws:
            data = json.loads(message)
            for node in data.get("nodes", ()):
                marker = node["health"].get("host", {}).get("probe.marker")
                if node["node"] == "probe" and marker in self.sent and marker not in seen:
                    seen.add(marker)
                    self.lags.append(time.monotonic() - self.sent[marker])


class ChartQuery:
    """Repeats one chart query (an hour of one series, 1-minute buckets) and times it."""

    def __init__(self, stack: BenchStack, secret: str, start: float, end: float) -> None:
        self.stack, self.secret = stack, secret
        self.params = {
            "node": "bench-00-00",
            "metric": "gpu.m0",
            "gpu": 0,
            "start": start,
            "end": end,
            "step": 60,
        }
        self.stop = threading.Event()

    def sample(self, count: int | None = None) -> list[float]:
        import httpx

        times: list[float] = []
        with httpx.Client(base_url=self.stack.url, timeout=30) as client:
            while not self.stop.is_set() and (count is None or len(times) < count):
                started = time.monotonic()
                client.get(
                    "/api/v1/series",
                    params=self.params,
                    headers={"Authorization": f"Bearer {self.secret}"},
                )
                times.append(time.monotonic() - started)
                time.sleep(0.2)
        return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=int(os.environ.get("BENCH_BATCHES", 3000)))
    parser.add_argument("--senders", type=int, default=6)
    parser.add_argument(
        "--rate", type=float, default=0, help="offered samples/s (0: as fast as the server answers)"
    )
    parser.add_argument(
        "--ingest-workers",
        type=int,
        default=3,
        help="gunicorn workers of the ingest pool, as deployed; 0: one pool for all (make run)",
    )
    parser.add_argument("--web-workers", type=int, default=2, help="the pool for pages, reads")
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument(
        "--http",
        choices=["uvicorn", "gunicorn"],
        default="gunicorn",
        help="server for the HTTP API (websockets always on uvicorn)",
    )
    args = parser.parse_args()

    env, conninfo = prepare_database()
    stack = BenchStack(
        env,
        web_workers=args.web_workers,
        concurrency=args.worker_concurrency,
        http=args.http,
        ingest_workers=args.ingest_workers,
    )
    stack.start()
    try:
        return run(args, stack, conninfo)
    finally:
        stack.stop()


def run(args, stack: BenchStack, conninfo: str) -> int:
    import psycopg

    secret = stack.manage("issue_token", "bench").strip()
    cookie = session_cookie(stack)
    per_sender = args.batches // args.senders
    base_ts = time.time() - 3 * 3600  # a finished past: compaction can seal it afterwards
    print(f"preparing {per_sender * args.senders} batches of 1,000 samples...", flush=True)
    bodies = [make_bodies(sender, per_sender, base_ts) for sender in range(args.senders)]
    total_batches = per_sender * args.senders
    span = (per_sender // 16 + 1) * SECONDS_PER_BATCH
    chart = ChartQuery(stack, secret, base_ts, base_ts + span)
    idle = chart.sample(count=1)  # warm-up

    senders = Senders(stack.ingest_url, secret, bodies, args.rate)
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
    senders.run()
    chart.stop.set()
    chart_thread.join()
    inbox_wait_empty(conninfo)
    committed_at = time.monotonic()
    cpu_us = meter.per_sample_us(total_batches * 1000)
    probe.stop.set()
    watch_stop.set()
    for thread in threads:
        thread.join()
    chart.stop.clear()
    idle = chart.sample(count=max(20, len(chart_times)))

    samples = total_batches * 1000
    post_s = senders.last_post - senders.first_post
    e2e_s = committed_at - senders.first_post
    accepted_rate = senders.accepted * 1000 / post_s
    in_window = [b for b in backlog if senders.first_post <= b[0] <= senders.last_post]
    committed_rate = (
        (in_window[-1][2] - in_window[0][2]) * 1000 / (in_window[-1][0] - in_window[0][0])
    )
    unprocessed = [b[1] - b[2] for b in in_window]
    half = len(unprocessed) // 2
    raw_rate = raw_copy_rate(conninfo, samples_count=min(samples, 1_000_000))
    limiter_us = rate_limiter_cost(env=stack.env)
    stored = disk_per_sample(conninfo, stack)
    step_stored = step_disk.run_measurement(stack.env)  # a focused load: see step_disk.py

    print()
    print(
        f"HTTP on {args.http}, senders {args.senders}, web workers {args.web_workers}"
        f" + ingest pool {args.ingest_workers or 'none (one pool)'}, "
        f"celery concurrency {args.worker_concurrency}, {total_batches} batches x 1,000 samples, "
        f"offered {'max' if not args.rate else f'{args.rate:,.0f} samples/s'}, "
        f"{senders.failed} failed posts"
    )
    print(f"accepted        {accepted_rate:12,.0f} samples/s  (202s while posting)")
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
    roles = ", ".join(f"{role} {us:.1f}" for role, us in cpu_us.items() if role != "total")
    print(
        f"CPU per sample  {cpu_us['total']:.1f} µs: {roles} (2 cores at 150,000 samples/s"
        f" allow {2e6 / 150_000:.1f})"
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


def raw_copy_rate(conninfo: str, samples_count: int) -> float:
    """Binary COPY of narrow sample rows, 1,000 rows per COPY and commit, one connection."""
    import psycopg

    rows = sample_rows(samples_count)
    with psycopg.connect(conninfo) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_raw")
        conn.execute(
            "CREATE TABLE bench_raw (ts timestamptz, node_id int4, metric_id int4,"
            " gpu int2, value float8)"
        )
        conn.commit()
        started = time.monotonic()
        for offset in range(0, len(rows), 1000):
            with (
                conn.cursor() as cursor,
                cursor.copy("COPY bench_raw FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(["timestamptz", "int4", "int4", "int2", "float8"])
                for row in rows[offset : offset + 1000]:
                    copy.write_row(row)
            conn.commit()
        elapsed = time.monotonic() - started
        conn.execute("DROP TABLE bench_raw")
        conn.commit()
    return len(rows) / elapsed


def disk_per_sample(conninfo: str, stack: BenchStack) -> dict[str, float]:
    import psycopg

    # total, then the points' own bytes: timestamps (offsets array or encoded) and values;
    # the rest is the row (header, t0/t1, ids, n/min/max/sum) and the indexes
    query = (
        "SELECT pg_total_relation_size('telemetry_chunk')::float8 / sum(n),"
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
