"""Fault 10, the soak: the demo's cluster with its faults (the real agent code, 8 nodes × 8
GPUs, two runs, noise on), a paced ingest on top of it, and browsers going round the pages
(overview, cluster, run, node, alerts), for FAULTS_SOAK_MINUTES (30). Afterwards: the web
and worker processes' memory grew < 10 % after the warm-up, their file descriptors and the
database connections are flat, the inbox backlog is back to 0, no table holds a partition
past its retention, the pages logged no error, and the stack's logs are clean (no traceback,
no ERROR line, no pooled connection discarded as closed)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from apps.core.partitions import partitions_list
from apps.history.services.retention import TIME_TABLES
from launcher.procs import wait_until
from launcher.stack import simulator_command
from tests.conftest import stack_env
from tests.dashboard.conftest import BrowserPage, chromium, operator  # noqa: F401 (fixture)
from tests.faults.ingest import SAMPLES_PER_BATCH, Sender, fault_batch, unprocessed
from tests.stackproc import LOG_DIR, Stack

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(3 * 3600),
]

MINUTES = float(os.environ.get("FAULTS_SOAK_MINUTES", "30"))
# Half of what this 2-core host's stack stores at most (bench/ingest.py: 146-230 k/s), less
# the demo cluster's own ≈ 1.5 k samples/s
RATE = float(os.environ.get("FAULTS_SOAK_RATE", "70000"))
BROWSERS = int(os.environ.get("FAULTS_SOAK_BROWSERS", "20"))
LOG_PROBLEMS = ("Traceback", " ERROR ", "ERROR/", "discarding closed connection")


class PacedSender(Sender):
    """Posts batch i at start + i × interval, from THREADS threads (a POST may take longer
    than the interval on a busy host: agents post in parallel too), each batch until
    accepted."""

    THREADS = 4

    def __init__(self, *args, rate: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.interval = SAMPLES_PER_BATCH / rate

    def _run(self) -> None:
        began = time.monotonic()
        threads = [
            threading.Thread(target=self._share, args=(began, offset), daemon=True)
            for offset in range(self.THREADS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _share(self, began: float, offset: int) -> None:
        try:
            for index in range(offset, self.count, self.THREADS):
                time.sleep(max(0.0, began + index * self.interval - time.monotonic()))
                self._post(fault_batch(self.prefix, index))
        except BaseException as error:
            self.error = error


def footprint(stack: Stack) -> dict[str, tuple[int, int]]:
    """Per role: resident bytes and open file descriptors of its whole process tree."""
    roles = {}
    for process in stack.processes:
        root = psutil.Process(process.popen.pid)
        tree = [root, *root.children(recursive=True)]
        rss = fds = 0
        for member in tree:
            try:
                rss += member.memory_info().rss
                fds += member.num_fds()
            except psutil.NoSuchProcess:
                continue
        roles[process.name] = (rss, fds)
    return roles


def database_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def log_sizes() -> dict[Path, int]:
    return {path: path.stat().st_size for path in LOG_DIR.glob("soak-*.log")}


def log_problems(since: dict[Path, int]) -> list[str]:
    problems = []
    for path in LOG_DIR.glob("soak-*.log"):
        with open(path, "rb") as log:
            log.seek(since.get(path, 0))
            for line in log.read().decode(errors="replace").splitlines():
                if any(problem in line for problem in LOG_PROBLEMS):
                    problems.append(f"{path.name}: {line[:300]}")
    return problems


def test_a_soak_leaves_memory_descriptors_connections_and_logs_flat(
    chromium,  # noqa: F811 (the fixture)
    agent_token,
    live_db,
    tmp_path,
):
    token, secret = agent_token
    logs_before = log_sizes()
    stack = Stack(stack_env(), name="soak").start()
    (tmp_path / "token").write_text(secret)
    simulator = psutil.Popen(
        simulator_command(
            server=stack.url, token_file=tmp_path / "token", spool_dir=tmp_path / "spool"
        ),
        stdout=open(tmp_path / "simulator.log", "wb"),  # noqa: SIM115 (the child's)
        stderr=subprocess.STDOUT,
    )
    seconds = MINUTES * 60
    sender = PacedSender(stack_agent(stack, secret), int(RATE * seconds / SAMPLES_PER_BATCH),
                         "soak", rate=RATE)  # fmt: skip
    operator("op")
    pages: list[BrowserPage] = []
    try:
        sender.start()
        pages = [BrowserPage(chromium, stack.url, "op") for _ in range(BROWSERS)]
        warm_up = max(60.0, seconds / 6)
        browse_until(pages, stack.url, token.cluster.name, deadline=time.monotonic() + warm_up)
        warm, warm_connections = footprint(stack), database_connections()
        browse_until(
            pages, stack.url, token.cluster.name, deadline=time.monotonic() + seconds - warm_up
        )
        sender.join(600)
        simulator.terminate()
        simulator.wait(60)
        wait_until(lambda: unprocessed(token) == 0, 300, "the inbox backlog to return to 0")
        time.sleep(5)  # the passes that were under way finish
        end, end_connections = footprint(stack), database_connections()
        errors = [error for page in pages for error in page.errors]
    finally:
        for page in pages:
            page.close()
        if simulator.poll() is None:
            simulator.kill()
        stack.stop()
    growth = {role: end[role][0] / warm[role][0] - 1 for role in warm}
    print(
        f"\nfaults: soak {MINUTES:g} min at {RATE:,.0f} samples/s + the demo cluster,"
        f" {BROWSERS} browsers; {len(sender.accepted)} batches, answers {sender.statuses}"
    )
    for role in warm:
        print(
            f"faults: {role}: RSS {warm[role][0] / 2**20:.0f} → {end[role][0] / 2**20:.0f} MiB"
            f" ({growth[role]:+.1%}), fds {warm[role][1]} → {end[role][1]}"
        )
    print(f"faults: database connections {warm_connections} → {end_connections}")
    assert len(sender.accepted) == sender.count
    assert errors == []
    assert all(value < 0.10 for value in growth.values()), growth
    assert all(end[role][1] <= warm[role][1] + 8 for role in warm), (warm, end)
    assert end_connections <= warm_connections + 2
    assert_within_retention()
    assert log_problems(logs_before) == []


def stack_agent(stack: Stack, secret: str):
    from tests.conftest import AgentClient

    return AgentClient(stack.url, secret)


def browse_until(pages: list[BrowserPage], url: str, cluster: str, *, deadline: float) -> None:
    """Round the pages: each browser loads the next one every ~BROWSERS/4 seconds, so the
    server sees about 4 page loads a second with their charts' fetches."""
    paths = [reverse("home"), reverse("alerts"), reverse("cluster-overview", args=[cluster])]
    run_paths = _run_and_node_paths(cluster)
    turn = 0
    while time.monotonic() < deadline:
        page = pages[turn % len(pages)]
        choices = paths + run_paths
        page.page.goto(url + choices[turn % len(choices)], wait_until="load")
        turn += 1
        time.sleep(0.25)


def _run_and_node_paths(cluster: str) -> list[str]:
    from apps.clusters.models import Node
    from apps.runs.models import Run

    runs = Run.objects.filter(cluster__name=cluster).order_by("name")[:1]
    nodes = Node.objects.filter(cluster__name=cluster).order_by("name")[:1]
    return [
        *(reverse("run-detail", args=[cluster, run.name]) for run in runs),
        *(reverse("node-detail", args=[cluster, node.name]) for node in nodes),
    ]


def assert_within_retention() -> None:
    """No time table keeps a partition whose every row is past its retention, and each has
    its partitions made ahead (the maintenance pass ran)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        for spec in TIME_TABLES:
            days = getattr(settings, f"HISTORY_{spec.retention_setting}_RETENTION_DAYS")
            ranges = [p for p in partitions_list(cursor, spec.table) if p.hi is not None]
            assert ranges[-1].hi > now + timedelta(days=6), spec.table
            if days:
                cutoff = now - timedelta(days=days) - spec.reach
                assert all(p.hi > cutoff for p in ranges), spec.table
