"""Remote-write benchmark: the same samples posted to POST /api/v1/write as a Prometheus
sends them and to POST /api/v1/ingest as the agent does, side by side on one stack.

    python bench/remote_write.py --batches 1200 --rounds 2

Uses DATABASE_URL / REDIS_URL when set (a scratch database), else the embedded default.
Each round posts `--batches` requests to each endpoint in turn (ingest first, then remote
write; the order swaps every round), each request one node's 10 s of 100 series (1,000
samples), and waits until the workers have stored them. Remote-write requests are encoded as
Prometheus 2 does: every sample a series entry of its own, its labels repeated (job,
instance, gpu), snappy-compressed. Prints, per endpoint: samples/s end to end (first POST to
last commit), POST latency p50/p99, CPU µs per sample by role, and remote write ÷ ingest.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BenchStack, inbox_wait_empty, percentile, prepare_database  # noqa: E402
from bench.load import (  # noqa: E402
    GPU_METRICS,
    GPUS,
    HOST_METRICS,
    SECONDS_PER_BATCH,
    SERIES_PER_NODE,
    Senders,
    make_bodies,
)

NODES_PER_SENDER = 16
REMOTE_WRITE_HEADERS = (
    "Content-Type: application/x-protobuf\r\n"
    "Content-Encoding: snappy\r\n"
    "X-Prometheus-Remote-Write-Version: 0.1.0\r\n"
)


def remote_write_bodies(sender: int, count: int, base_ts: float, round_: int) -> list[bytes]:
    """`count` requests of one node's 10 s × 100 series each, as make_bodies's batches."""
    from apps.ingest.prompb import write_request_encode

    bodies = []
    for index in range(count):
        instance = f"rw{round_}-{sender:02d}-{index % NODES_PER_SENDER:02d}:9400"
        start_ms = int((base_ts + (index // NODES_PER_SENDER) * SECONDS_PER_BATCH) * 1000)
        series = []
        for second in range(SECONDS_PER_BATCH):
            ms = start_ms + second * 1000
            for gpu in range(GPUS):
                for metric in range(GPU_METRICS):
                    value = (index * 7 + gpu * 13 + metric * 17 + second) % 100 + 0.5
                    labels = {
                        "__name__": f"gpu_m{metric}",
                        "job": "bench",
                        "instance": instance,
                        "gpu": str(gpu),
                    }
                    series.append((labels, [(ms, value)]))
            for metric in range(HOST_METRICS):
                labels = {"__name__": f"host_m{metric}", "job": "bench", "instance": instance}
                series.append((labels, [(ms, 1.5e9 + second)]))
        bodies.append(write_request_encode(series))
    return bodies


def measure(stack: BenchStack, conninfo: str, senders: Senders, samples: int) -> dict:
    meter = stack.cpu_meter()
    meter.begin()
    senders.run()
    inbox_wait_empty(conninfo)
    done = time.monotonic()
    return {
        "rate": samples / (done - senders.first_post),
        "p50": percentile(senders.latencies, 50) * 1000,
        "p99": percentile(senders.latencies, 99) * 1000,
        "cpu": meter.per_sample_us(samples),
        "failed": senders.failed,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=1200, help="requests per endpoint a round")
    parser.add_argument("--senders", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    env, conninfo = prepare_database()
    stack = BenchStack(env, web_workers=2, concurrency=2, ingest_workers=3)
    try:
        stack.start()
        return run(args, stack, conninfo)
    finally:
        stack.stop()


def run(args, stack: BenchStack, conninfo: str) -> int:
    import django

    django.setup()
    secret = stack.manage("issue_token", "bench").strip()
    per_sender = args.batches // args.senders
    samples = per_sender * args.senders * SECONDS_PER_BATCH * SERIES_PER_NODE
    results: dict[str, list[dict]] = {"ingest": [], "remote write": []}
    for round_ in range(args.rounds):
        base_ts = time.time() - 3 * 3600 + round_ * 600
        print(f"round {round_ + 1}: preparing {per_sender * args.senders} requests each...")
        json_bodies = [
            make_bodies(args.senders * round_ + s, per_sender, base_ts) for s in range(args.senders)
        ]
        write_bodies = [
            remote_write_bodies(s, per_sender, base_ts, round_) for s in range(args.senders)
        ]
        order = ["ingest", "remote write"]
        for endpoint in order if round_ % 2 == 0 else order[::-1]:
            if endpoint == "ingest":
                senders = Senders(stack.ingest_url, secret, json_bodies, 0)
            else:
                senders = Senders(
                    stack.ingest_url,
                    secret,
                    write_bodies,
                    0,
                    path="/api/v1/write",
                    content=REMOTE_WRITE_HEADERS,
                )
            result = measure(stack, conninfo, senders, samples)
            results[endpoint].append(result)
            print(f"  {endpoint:13} {result['rate']:10,.0f} samples/s end to end")
    print()
    print(
        f"{args.rounds} rounds x {per_sender * args.senders} requests of "
        f"{SECONDS_PER_BATCH * SERIES_PER_NODE:,} samples per endpoint, {args.senders} senders"
    )
    for endpoint, runs in results.items():
        rates = [r["rate"] for r in runs]
        cpu = {role: statistics.fmean(r["cpu"][role] for r in runs) for role in runs[0]["cpu"]}
        roles = ", ".join(f"{role} {us:.2f}" for role, us in cpu.items() if role != "total")
        print(
            f"{endpoint:13} {statistics.median(rates):10,.0f} samples/s median "
            f"({', '.join(f'{r:,.0f}' for r in rates)}); POST p50 "
            f"{statistics.median(r['p50'] for r in runs):.1f} ms, p99 "
            f"{statistics.median(r['p99'] for r in runs):.1f} ms; failed "
            f"{sum(r['failed'] for r in runs)}"
        )
        print(f"{'':13} CPU per sample {cpu['total']:.2f} µs: {roles}")
    ratio = statistics.median(r["rate"] for r in results["remote write"]) / statistics.median(
        r["rate"] for r in results["ingest"]
    )
    print(f"remote write / ingest  {ratio:.2f} (end to end samples/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
