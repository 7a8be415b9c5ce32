"""Mixed load (issue 25): agents posting at 1 Hz, agents holding the command long-poll and
operators' browsers on the pages, all at once, for minutes, through locust.

    make load                                  # 1,000 agents, 1,000 polls, 50 browsers, 10 min
    make load LOAD_ARGS="--agents 200 --longpolls 200 --browsers 10 --minutes 2"

Seeds a scratch database (`opsboard_bench_load`, on DATABASE_URL's server, else the embedded
one): the cluster and run of bench/pages_seed.py with `--seed-hours` of history (so that the
pages have charts to draw), a node-bound token per node, a viewer. Starts the stack as
deployed (bench/common.py: gunicorn for the pages, an ingest pool of its own, uvicorn for
websockets and the long-poll, the ingest and periodic Celery workers), runs
bench/locustfile.py headless against it, and prints per request kind: count, failures, p50,
p95, p99, max, req/s; then the inbox backlog when the load stopped and how long it took to
drain, and the samples and step reports stored against those the agents were told were
accepted (lost = 0). Exits 1 on any failure or loss.

A failure is any answer other than 2xx, or 429/503 with Retry-After (those get rows of their
own). The held polls' latency is their `wait` (25 s) by design: nothing is issued to them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench.common as common  # noqa: E402
import bench.pages_seed as pages_seed  # noqa: E402
from bench.common import BenchStack  # noqa: E402

common.BENCH_DB = f"{common.BENCH_DB}_load"  # its own scratch database: others drop theirs
VIEWER, VIEWER_PASSWORD = "load-viewer", "load-viewer-password-1"
DRAIN_TIMEOUT_S = 300
# every POST's answer is read (the agents' timeout is 60 s), so that what they were told was
# accepted is what must be stored; the held polls finish their `wait` and stop
STOP_TIMEOUT_S = 65
COLUMNS = ("count", "fail", "p50 ms", "p95 ms", "p99 ms", "max ms", "req/s")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000, help="agents posting at 1 Hz")
    parser.add_argument("--longpolls", type=int, default=1000, help="command long-polls held")
    parser.add_argument("--browsers", type=int, default=50, help="logged-in viewers")
    parser.add_argument("--minutes", type=float, default=10.0, help="of load")
    parser.add_argument("--spawn-rate", type=float, default=100.0, help="users started a second")
    parser.add_argument("--poll-wait", type=int, default=25, help="the polls' wait= (s)")
    parser.add_argument("--think", type=float, default=5.0, help="browsers' think time (s)")
    parser.add_argument("--seed-hours", type=float, default=1.0, help="run history seeded")
    parser.add_argument("--ranks", type=int, default=64, help="the run's ranks, 8 a node")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--ingest-workers", type=int, default=3)
    parser.add_argument("--worker-concurrency", type=int, default=2)
    common.deployment_arguments(parser)
    parser.add_argument(
        "--processes", type=int, default=1, help="locust processes (-1: one per core)"
    )
    parser.add_argument("--out", default=str(ROOT / "var" / "load"), help="config, CSVs")
    args = parser.parse_args()
    if args.processes == -1:
        args.processes = os.cpu_count() or 1
    return args


def main() -> int:
    args = arguments()
    env, conninfo = pages_seed.scratch_django(ranks=args.ranks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("accepted-*.json"):
        old.unlink()
    seeded = seed(args, conninfo)
    stack = BenchStack(
        env,
        web_workers=args.web_workers,
        concurrency=args.worker_concurrency,
        ingest_workers=args.ingest_workers,
        ingest_nice=args.ingest_nice,
        ingest_sched_idle=args.ingest_sched == "idle",
        ingest_idle_group=args.ingest_group == "idle",
    )
    try:
        stack.start()
        return run(args, stack, conninfo, seeded, out)
    finally:
        stack.stop()


def seed(args: argparse.Namespace, conninfo: str) -> dict:
    """The run with its history (bench/pages_seed.py), a node-bound token per node, a viewer."""
    from django.contrib.auth import get_user_model

    from apps.access.services import role_grant
    from apps.clusters.models import Cluster
    from apps.clusters.services import token_issue

    end = time.time() // 600 * 600
    start = end - round(args.seed_hours * 6) * 600
    pages_seed.seed(conninfo=conninfo, start=start, end=end)
    pages_seed.rollups_build(conninfo=conninfo, start=start, end=end)
    # locust's workers number their users apart (bench/locustfile.py, user_index)
    workers = args.processes
    nodes = [
        f"node-{i:02d}" for i in range(-(-max(args.agents, args.longpolls, 1) // workers) * workers)
    ]
    began = time.perf_counter()
    tokens = [
        token_issue(cluster_name=pages_seed.CLUSTER, name=f"load {node}", nodes=[node])[1]
        for node in nodes
    ]
    print(f"issued {len(tokens):,} node-bound tokens in {time.perf_counter() - began:.0f} s")
    viewer = get_user_model().objects.create_user(VIEWER, password=VIEWER_PASSWORD)
    role_grant(user=viewer, cluster=Cluster.objects.get(name=pages_seed.CLUSTER), role="viewer")
    return {"nodes": nodes, "tokens": tokens, "run_start": start}


def run(args, stack: BenchStack, conninfo: str, seeded: dict, out: Path) -> int:
    config = config_write(args, stack, seeded, out)
    before = stored(conninfo)
    meter = stack.cpu_meter()  # this process's children (locust) count as "bench client"
    meter.begin()
    backlog = Backlog(conninfo, meter)
    backlog.start()
    load_before, began = os.getloadavg()[0], time.monotonic()
    print(
        f"locust: {args.agents} agents at 1 Hz, {args.longpolls} long-polls (wait "
        f"{args.poll_wait} s), {args.browsers} browsers (think {args.think:g} s) for "
        f"{args.minutes:g} min...",
        flush=True,
    )
    locust_env = {**os.environ, "OPSBOARD_LOAD_CONFIG": str(config)}
    with open(out / "locust.log", "wb") as log:
        subprocess.run(locust_command(args, out), cwd=ROOT, env=locust_env, stdout=log, stderr=log)
    at_stop = backlog.stop()
    cpu, wall = meter.snapshot(), time.monotonic() - began
    cpu.subtract(meter.start)
    load_after, began = os.getloadavg()[0], time.monotonic()
    drained = inbox_drain(conninfo, DRAIN_TIMEOUT_S)
    drain_s = time.monotonic() - began
    if not (out / "load_stats.csv").exists():
        print((out / "locust.log").read_text()[-3000:])
        return 1
    rows = stats_read(out / "load_stats.csv")
    print()
    print(table_markdown(rows))
    print()
    print(
        f"inbox backlog: {at_stop} batches unprocessed when the load stopped (peak "
        f"{backlog.peak}), drained in {drain_s:.1f} s" + ("" if drained else " (NOT drained)")
    )
    lost = lost_print(accepted_read(out, args.processes), before, stored(conninfo))
    cores = ", ".join(f"{role} {seconds / wall:.2f}" for role, seconds in sorted(cpu.items()))
    print(
        f"CPU over the {wall:.0f} s of load, in cores: {cores}; total "
        f"{sum(cpu.values()) / wall:.2f} of {os.cpu_count()}; host load average "
        f"{load_before:.1f} before, {load_after:.1f} after"
    )
    failures = sum(row["fail"] for row in rows if row["name"] != "Aggregated")
    ok = failures == 0 and lost == (0, 0) and drained
    print(f"failures: {failures}; " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


def config_write(args, stack: BenchStack, seeded: dict, out: Path) -> Path:
    """The locustfile's config (bench/locustfile.py): where, as whom, how many of each."""
    config = {
        "url": stack.url,
        "ingest_url": stack.ingest_url,
        "cluster": pages_seed.CLUSTER,
        "run": pages_seed.RUN,
        "run_start": seeded["run_start"],
        "run_nodes": pages_seed.NODES,
        "nodes": seeded["nodes"],
        "tokens": seeded["tokens"],
        "agents": args.agents,
        "longpolls": args.longpolls,
        "browsers": args.browsers,
        "processes": args.processes,
        "poll_wait": args.poll_wait,
        "think": args.think,
        "viewer": {"username": VIEWER, "password": VIEWER_PASSWORD},
        "out_dir": str(out),
    }
    path = out / "config.json"
    path.write_text(json.dumps(config))
    return path


def locust_command(args, out: Path) -> list[str]:
    users = args.agents + args.longpolls + args.browsers
    command = [
        *(sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py")),
        *("--headless", "-u", str(users), "-r", str(args.spawn_rate)),
        *("-t", f"{round(args.minutes * 60)}s", "--csv", str(out / "load"), "--only-summary"),
        *("--stop-timeout", str(STOP_TIMEOUT_S), "--loglevel", "WARNING"),
    ]
    if args.processes != 1:
        command += ["--processes", str(args.processes)]
    return command


def lost_print(told: dict[str, int], before: tuple, after: tuple) -> tuple[int, int]:
    """Print accepted against stored; returns (samples, step reports) lost. Negative: stored
    without the agent hearing its 202 (a POST that failed on a timeout)."""
    samples, steps = after[0] - before[0], after[1] - before[1]
    lost = (told["samples"] - samples, told["steps"] - steps)
    print(
        f"accepted (202): {told['batches']:,} batches, {told['samples']:,} samples, "
        f"{told['steps']:,} step reports; stored: {samples:,} samples, {steps:,} step "
        f"reports; lost: {lost[0]} samples, {lost[1]} step reports; {told['duplicates']} "
        f"duplicates answered"
    )
    return lost


class Backlog:
    """The inbox's unprocessed batches, read every 2 s while the load runs (and the CPU
    meter read with it: a process that ends keeps its last reading)."""

    def __init__(self, conninfo: str, meter) -> None:
        self.conninfo, self.meter, self.peak, self.last = conninfo, meter, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.last = unprocessed(self.conninfo)
        self.peak = max(self.peak, self.last)
        return self.last

    def _watch(self) -> None:
        while not self._stop.wait(2):
            self.peak = max(self.peak, unprocessed(self.conninfo))
            self.meter.snapshot()


def unprocessed(conninfo: str) -> int:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        sql = "SELECT count(*) FROM ingest_inboxbatch WHERE processed_at IS NULL"
        return conn.execute(sql).fetchone()[0]


def inbox_drain(conninfo: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while unprocessed(conninfo):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def stored(conninfo: str) -> tuple[int, int]:
    """(samples, step reports) of the whole database: raw and compacted, as the periodic
    passes move them between the two while the load runs."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        return conn.execute(
            "SELECT (SELECT coalesce(sum(n), 0) FROM telemetry_chunk),"
            " (SELECT count(*) FROM runs_stepreport)"
            " + (SELECT coalesce(sum(n), 0) FROM runs_stepchunk)"
        ).fetchone()


def accepted_read(out: Path, processes: int, timeout: float = 30) -> dict[str, int]:
    """What the agents of every locust process were told was accepted (its workers may
    write theirs after the master has exited)."""
    deadline = time.monotonic() + timeout
    while len(list(out.glob("accepted-*.json"))) < processes and time.monotonic() < deadline:
        time.sleep(0.5)
    total = {"batches": 0, "samples": 0, "steps": 0, "duplicates": 0}
    for path in out.glob("accepted-*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] += value
    return total


def stats_read(path: Path) -> list[dict]:
    """locust's --csv stats: a row per request name (and the aggregate), in ms."""
    rows = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            rows.append(
                {
                    "name": row["Name"] or "Aggregated",
                    "count": int(row["Request Count"]),
                    "fail": int(row["Failure Count"]),
                    "p50 ms": row["50%"],
                    "p95 ms": row["95%"],
                    "p99 ms": row["99%"],
                    "max ms": f"{float(row['Max Response Time']):.0f}",
                    "req/s": f"{float(row['Requests/s']):.1f}",
                }
            )
    return rows


def table_markdown(rows: list[dict]) -> str:
    lines = ["| request | " + " | ".join(COLUMNS) + " |", "|---" + "|---:" * len(COLUMNS) + "|"]
    for row in rows:
        lines.append(f"| {row['name']} | " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
