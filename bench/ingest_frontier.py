"""Ingest at frontier size (issue 27): the mix of a 16,384-rank run, paced, against the stack
bench/ingest.py starts; whether this machine keeps up, or how many of it the mix needs.

    python bench/ingest.py --frontier --seconds 60 [--post-by rank|node]

The mix, 2,048 nodes × 8 GPUs by default (--ranks, --gpus-per-node):
  - each rank's training reporter posts once a second, as opsboard_agent.reporter does: its
    Shipper flushes every second (flush_interval=1.0) into a batch of its own (the node's
    name, the run, the rank's step report and the two samples of its own every flush adds),
    which that rank's Sender posts: a POST a rank a second at a step a second. `--post-by
    node` puts a node's ranks in one batch instead (the contract allows any of a node's
    records in its batch; no agent does it today): docs/scaling.md's "ranks' steps riding
    one batch a node";
  - each node agent posts its tick every --telemetry-interval s: 106 samples (12 GPU metrics
    × 8, 7 host, 3 of its own) and its node_info; a body from 2 KiB gzipped, as the Sender;
  - each node has a node-bound token (`issue_token --node`) that its agent and its ranks'
    reporters use: a node's credentials act only for that node.

Pacing: each kind's posts are spread evenly over their period and sent at their due time by
--senders threads. Posts the senders pass over while more than MAX_LATE_S behind are not
sent (a real one would wait in its agent's spool) and are counted; the fleet's spools (due −
accepted) are the backlog a fleet would hold. CPU per step report is the whole stack's over
the run (the bench client apart), the mix's samples included: what an offered report costs.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

from bench import step_disk
from bench.common import ROOT, inbox_wait_empty, percentile
from bench.frontier_mix import AGENT, CLUSTER, REPORTER, REPORTER_METRICS, Mix, encode, node_name
from bench.load import post_raw

MAX_LATE_S = 1.0
CLIENT_ROLES = ("bench client", "postgres (bench client)")
INGEST_ROLES = ("ingest", "worker", "postgres (ingest)", "postgres (worker)")


class Pacer:
    """Sends the mix's schedule from `senders` threads, each post at its due time, with its
    node's token."""

    def __init__(self, mix: Mix, url: str, secrets: list[str], seconds: float, senders: int):
        self.mix, self.seconds, self.senders = mix, seconds, senders
        self.address = urlsplit(url)
        self.entries = mix.schedule()
        self.offsets = [entry[0] for entry in self.entries]
        self.reporters_before = [0]  # reporter posts among a period's first k entries
        for _, kind, _ in self.entries:
            self.reporters_before.append(self.reporters_before[-1] + (kind == REPORTER))
        self.heads = [
            (f"POST /api/v1/ingest HTTP/1.1\r\nHost: {self.address.netloc}\r\n"
             f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
             "Connection: close\r\n").encode()
            for secret in secrets
        ]  # fmt: skip
        self.instance = f"{int(time.time())}-bench"
        self.lock, self.rng = threading.Lock(), random.Random(27)
        self.cursor = self.skipped = 0
        self.sent: Counter[int] = Counter()
        self.accepted: Counter[int] = Counter()
        self.statuses: Counter[int] = Counter()
        self.latencies: list[float] = []
        self.start = self.end = self.wall0 = 0.0

    def due_count(self, t: float) -> tuple[int, int]:
        """(posts, reporter posts) due before `t` s from the start."""
        if t <= 0:
            return 0, 0
        period, within = divmod(t, self.mix.interval)
        position = bisect.bisect_left(self.offsets, within)
        return (
            int(period) * len(self.entries) + position,
            int(period) * self.reporters_before[-1] + self.reporters_before[position],
        )

    def run(self) -> None:
        threads = [threading.Thread(target=self._send) for _ in range(self.senders)]
        self.wall0, self.start = time.time(), time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.end = time.monotonic()

    def entry(self, index: int) -> tuple[float, int, int, int]:
        """The schedule's `index`th post: (due s, kind, rank or node, second of the run)."""
        period, position = divmod(index, len(self.entries))
        offset, kind, who = self.entries[position]
        return (
            period * self.mix.interval + offset,
            kind,
            who,
            period * self.mix.interval + int(offset),
        )

    def request(self, due: float, kind: int, who: int, second: int) -> bytes:
        """A post's whole HTTP request: its node's token, the body as the agent sends it."""
        mix, ts = self.mix, self.wall0 + due
        if kind == REPORTER:
            batch = mix.reporter_batch(who, second, ts, self.instance)
        else:
            batch = mix.telemetry_batch(who, second // mix.interval, ts, self.instance)
        body, gzipped = encode(batch)
        return (
            self.heads[mix.node_of(kind, who)]
            + (b"Content-Encoding: gzip\r\n" if gzipped else b"")
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )

    def _take(self) -> tuple[float, int, int, int] | None:
        """The next post to send; None at the end. Behind by more than MAX_LATE_S, the
        senders go on from a post drawn at random among those due within it: the first due
        after a moment would favour the posts after long gaps (an agent's tick between two
        ranks' flushes gets half a gap) and send half the ticks of the mix."""
        with self.lock:
            now = time.monotonic() - self.start
            late, _ = self.due_count(now - MAX_LATE_S)
            if self.cursor < late:
                jump = self.rng.randrange(late, max(late + 1, self.due_count(now)[0]))
                self.skipped += jump - self.cursor
                self.cursor = jump
            entry = self.entry(self.cursor)
            if entry[0] >= self.seconds:
                return None
            self.cursor += 1
        return entry

    def _send(self) -> None:
        host, port = self.address.hostname, self.address.port
        while (entry := self._take()) is not None:
            time.sleep(max(0.0, self.start + entry[0] - time.monotonic()))
            request = self.request(*entry)
            started = time.monotonic()
            try:
                status = post_raw(host, port, request)
            except OSError:  # refused or timed out: counted, and the thread goes on
                status = 0
            with self.lock:
                self.latencies.append(time.monotonic() - started)
                self.sent[entry[1]] += 1
                self.statuses[status] += 1
                self.accepted[entry[1]] += status == 202


def seed(mix: Mix, env: dict[str, str]) -> list[str]:
    """In the stack's database: the cluster, its nodes (registered as their agents' first
    batch would be) and a node-bound token per node. The secrets, by node."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.ingest_frontier", "seed", str(mix.nodes), str(mix.gpus)],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _seed_here(nodes: int, gpus: int) -> list[str]:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "opsboard.settings")
    django.setup()
    from django.utils import timezone

    from apps.clusters.models import Cluster
    from apps.clusters.services import nodes_touch, token_issue

    secrets = [token_issue(cluster_name=CLUSTER, nodes=[node_name(n)])[1] for n in range(nodes)]
    cluster = Cluster.objects.get(name=CLUSTER)
    names = {(cluster.id, node_name(n)) for n in range(nodes)}
    nodes_touch(seen={key: (timezone.now(), {"gpus": gpus}) for key in names}, agents=names)
    return secrets


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t, value), per second."""
    if len(points) < 2:
        return 0.0
    return statistics.linear_regression([p[0] for p in points], [p[1] for p in points]).slope


def verdict(
    *, offered: float, committed: float, us_per_report: float, cores: int, fleet_slope: float
) -> tuple[str, float, float]:
    """("keeps up" or "needs N× this machine", the rate factor offered ÷ committed, the CPU
    factor: the cores the offered reports need at the CPU per report, ÷ `cores`). N is the
    CPU factor where it says more than one machine (it holds on dedicated cores; the rate
    depends on what else the host runs), else the rate factor."""
    rate_factor = offered / committed if committed else float("inf")
    cpu_factor = offered * us_per_report / 1e6 / cores
    if committed >= 0.99 * offered and fleet_slope <= 0.01 * offered and cpu_factor <= 1:
        return "keeps up", rate_factor, cpu_factor
    factor = cpu_factor if cpu_factor > 1 else rate_factor
    return f"needs {factor:.1f}× this machine", rate_factor, cpu_factor


INBOX_SQL = (  # waiting rows, then committed ones: reporters' and agents'
    "SELECT count(*) FILTER (WHERE processed_at IS NULL),"
    " count(*) FILTER (WHERE processed_at IS NOT NULL AND batch_id NOT LIKE '%-agent/%'),"
    " count(*) FILTER (WHERE processed_at IS NOT NULL AND batch_id LIKE '%-agent/%')"
    " FROM ingest_inboxbatch"
)
LAG_SQL = (  # processed_at is the drain transaction's now(): its start, before the commit
    "SELECT percentile_disc(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY lag), max(lag),"
    " count(*) FROM (SELECT extract(epoch FROM processed_at - received_at)::float8 AS lag"
    " FROM ingest_inboxbatch WHERE processed_at IS NOT NULL) lags"
)


def run(args, stack, conninfo: str) -> int:
    """The frontier mode of bench/ingest.py, on a started stack."""
    import psycopg

    mix = Mix(args.ranks, args.gpus_per_node, args.telemetry_interval, args.post_by)
    print(f"seeding {mix.nodes:,} nodes and a node-bound token each...", flush=True)
    pacer = Pacer(mix, stack.ingest_url, seed(mix, stack.env), args.seconds, args.senders)
    watched: list[tuple[float, ...]] = []  # (t, waiting, reporter rows, agent rows, due, acc.)
    stop = threading.Event()
    meter = stack.cpu_meter()

    def watch() -> None:
        with psycopg.connect(conninfo, autocommit=True, application_name=CLIENT_ROLES[0]) as c:
            while not stop.is_set():
                row = c.execute(INBOX_SQL).fetchone()
                now = time.monotonic()
                due = pacer.due_count(now - pacer.start)[1] if pacer.start else 0
                watched.append((now, *row, due, pacer.accepted[REPORTER]))
                meter.snapshot()  # a process that ends between readings keeps its last
                time.sleep(0.5)

    meter.begin()
    watcher = threading.Thread(target=watch)
    watcher.start()
    pacer.run()
    inbox_wait_empty(conninfo)
    committed_at = time.monotonic()
    stop.set()
    watcher.join()  # the meter is read by one thread at a time
    with psycopg.connect(conninfo, autocommit=True, application_name=CLIENT_ROLES[0]) as conn:
        _, reporter_rows, _ = conn.execute(INBOX_SQL).fetchone()
        lags, worst, batches = conn.execute(LAG_SQL).fetchone()
    p50, p95, p99 = lags or (0.0, 0.0, 0.0)
    reports = reporter_rows * mix.steps_per_post
    cpu = meter.per_sample_us(max(reports, 1))
    raw_rate = step_disk.raw_copy_rate(conninfo, mix.step_rows(min(max(reports, 50_000), 300_000)))

    k, post_s, offered = mix.steps_per_post, pacer.end - pacer.start, mix.offered()
    cores = os.cpu_count() or 1
    window = [w for w in watched if pacer.start <= w[0] <= pacer.end] or watched
    dt = (window[-1][0] - window[0][0]) or 1.0
    per_post = (len(REPORTER_METRICS), mix.tick_samples)  # samples in a reporter's, a tick
    rows = (window[-1][2] - window[0][2], window[-1][3] - window[0][3])
    committed = (rows[0] * k / dt, (rows[0] * per_post[0] + rows[1] * per_post[1]) / dt)
    acc = pacer.accepted
    accepted = (acc[REPORTER] * k / post_s, sum(acc[i] * per_post[i] for i in (0, 1)) / post_s)
    inbox = [(w[0], float(w[1])) for w in window]
    fleet_slope = slope([(w[0], float(w[4] - w[5]) * k) for w in window])
    stack_us = sum(us for role, us in cpu.items() if role not in (*CLIENT_ROLES, "total"))
    said, rate_factor, cpu_factor = verdict(
        offered=offered["reports"], committed=committed[0], us_per_report=stack_us,
        cores=cores, fleet_slope=fleet_slope,
    )  # fmt: skip

    def flat(value: float, rate: float) -> str:
        return "flat" if value <= 0.01 * rate else "grows"

    half = len(inbox) // 2
    first, second = ([p[1] for p in part] or [0] for part in (inbox[:half], inbox[half:]))
    roles = ", ".join(
        f"{r} {us:,.0f}" for r, us in cpu.items() if r not in (*CLIENT_ROLES, "total")
    )
    print(
        f"\nfrontier mix: {mix.ranks:,} ranks on {mix.nodes:,} nodes x {mix.gpus} GPUs; a POST"
        f" per {mix.post_by} a second ({k} step report(s) + {per_post[0]} samples), node agents"
        f" every {mix.interval} s ({mix.tick_samples} samples), a token per node; paced"
        f" {args.seconds:.0f} s by {pacer.senders} senders; ingest pool {args.ingest_workers},"
        f" celery concurrency {args.worker_concurrency}, ingest nice {args.ingest_nice} sched"
        f" {args.ingest_sched} group {args.ingest_group}; {cores} cores, load average"
        f" {os.getloadavg()[0]:.1f}"
    )
    print(
        f"offered     {offered['reports']:10,.0f} step reports/s {offered['samples']:10,.0f}"
        f" samples/s  ({offered['posts']:,.0f} POSTs/s)"
    )
    sent = sum(pacer.sent.values())
    print(
        f"sent        {sent / post_s:10,.0f} POSTs/s ({pacer.sent[REPORTER]:,} reporters',"
        f" {pacer.sent[AGENT]:,} agents'); {pacer.skipped:,} passed over while over"
        f" {MAX_LATE_S:.0f} s behind (left in their spools); answers {dict(pacer.statuses)}"
    )
    print(
        f"accepted    {accepted[0]:10,.0f} step reports/s {accepted[1]:10,.0f} samples/s"
        f"  (202s while posting)"
    )
    print(
        f"committed   {committed[0]:10,.0f} step reports/s {committed[1]:10,.0f} samples/s"
        f"  (stored while posting); end to end {reports / (committed_at - pacer.start):,.0f}"
        f" reports/s; inbox drained {committed_at - pacer.end:.1f} s after the last POST"
    )
    print(
        f"backlog     inbox {flat(slope(inbox), sent / post_s)}: first half mean"
        f" {statistics.fmean(first):.0f} rows, second half {statistics.fmean(second):.0f},"
        f" slope {slope(inbox):+.2f} rows/s; the fleet's spools (due - accepted)"
        f" {flat(fleet_slope, offered['reports'])}: slope {fleet_slope:+,.0f} reports/s"
    )
    print(
        f"lag         accept -> commit p50 {p50 * 1e3:,.0f} ms, p95 {p95 * 1e3:,.0f}"
        f" ms, p99 {p99 * 1e3:,.0f} ms, max {(worst or 0) * 1e3:,.0f} ms ({batches:,}"
        f" batches, to the drain's start); POST p50"
        f" {percentile(pacer.latencies, 50) * 1e3:,.0f} ms, p99"
        f" {percentile(pacer.latencies, 99) * 1e3:,.0f} ms"
    )
    print(
        f"CPU/report  {stack_us:,.0f} µs the stack ({roles}); of which the ingest path"
        f" {sum(cpu.get(r, 0.0) for r in INGEST_ROLES):,.0f} µs; bench client"
        f" {sum(cpu.get(r, 0.0) for r in CLIENT_ROLES):,.0f} µs; the stack won"
        f" {stack_us * reports / 1e6 / (committed_at - pacer.start):.2f} cores"
    )
    print(
        f"raw COPY    {raw_rate:10,.0f} step rows/s (the same rows, binary, 1,000-row batches,"
        f" a commit each); ours / raw {committed[0] / raw_rate:.4f} (committed)"
    )
    print(
        f"verdict     {said}: CPU {offered['reports']:,.0f} reports/s x {stack_us:,.0f} µs ="
        f" {offered['reports'] * stack_us / 1e6:,.1f} cores / {cores} = {cpu_factor:.1f}x;"
        f" rate offered / committed = {rate_factor:.1f}x on this host as it was"
    )
    return 0


def frontier_arguments(parser) -> None:
    """bench/ingest.py's flags of this mode."""
    add = parser.add_argument
    add("--frontier", action="store_true", help="the mix of a 16,384-rank run, paced (issue 27)")
    add("--seconds", type=float, default=60, help="frontier: seconds paced")
    add("--ranks", type=int, default=16_384, help="frontier: training ranks")
    add("--gpus-per-node", type=int, default=8, help="frontier: ranks (GPUs) a node")
    add("--telemetry-interval", type=int, default=10, help="frontier: the agent's tick, s")
    add(
        "--post-by",
        choices=["rank", "node"],
        default="rank",
        help="frontier: a POST a rank a second (the reporter today) or a node a second",
    )


def _requests_here(argv: list[str]) -> None:
    """For tests/bench: the whole requests of the posts due in [--start, --end) s, each
    after its length (4 bytes, big-endian), to a file; node n's token is `secret-n`."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--start", type=float, default=0)
    parser.add_argument("--end", type=float, default=1)
    frontier_arguments(parser)
    args = parser.parse_args(argv)
    mix = Mix(args.ranks, args.gpus_per_node, args.telemetry_interval, args.post_by)
    pacer = Pacer(mix, "http://127.0.0.1:8000", [f"secret-{n}" for n in range(mix.nodes)], 0, 0)
    pacer.wall0 = time.time()
    with open(args.out, "wb") as out:
        for index in range(pacer.due_count(args.start)[0], pacer.due_count(args.end)[0]):
            request = pacer.request(*pacer.entry(index))
            out.write(len(request).to_bytes(4, "big") + request)


if __name__ == "__main__" and sys.argv[1:2] == ["seed"]:
    print(json.dumps(_seed_here(int(sys.argv[2]), int(sys.argv[3]))))
elif __name__ == "__main__" and sys.argv[1:2] == ["requests"]:
    _requests_here(sys.argv[2:])
