"""Detection per cluster: beat's tick sends one pass per cluster, which any of the periodic
workers takes, each under its cluster's own lock: a slow cluster delays only itself, its
passes never overlap (the ones that would are skipped and counted), and each cluster's
overview says when its own detectors last ran."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.alerts.models import DetectorPass
from apps.alerts.selectors import periodic_skips
from apps.alerts.services import EVALUATE_CLUSTER_TASK, SYNC_LOCK_NAMESPACE
from apps.clusters.models import Cluster, Node
from launcher.procs import wait_until
from tests.stackproc import LOG_DIR, Process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

HELD_S = 18.0  # past LATE_PERIODS (3) periods of 5 s: the held cluster's overview says late


@pytest.fixture(scope="module")
def periodic_workers(live_stack):
    """Two periodic worker processes: the stack's (beat embedded) and one more, without beat
    and under a node name of its own, as a second host would run it. Yields their logs."""
    command = list(live_stack.periodic.command)
    if "-B" in command:
        command = command[: command.index("-B")]  # one beat per deployment
    command[command.index("-n") + 1] = "periodic2." + command[command.index("-n") + 1]
    command[command.index("--concurrency") + 1] = "1"
    second = Process(f"{live_stack.name}-periodic2", command, live_stack.env, supervised=True)
    logs = [LOG_DIR / f"{live_stack.name}-periodic.log", LOG_DIR / f"{second.name}.log"]
    offset = logs[1].stat().st_size if logs[1].exists() else 0
    second.start()
    wait_until(lambda: b" ready." in logs[1].read_bytes()[offset:], 60, "the second worker")
    yield logs
    second.stop()


def active_cluster(prefix: str) -> Cluster:
    """A cluster with a node seen just now: evaluated on every tick."""
    cluster = Cluster.objects.create(name=f"{prefix}-{uuid.uuid4().hex[:6]}")
    Node.objects.create(cluster=cluster, name="node-00", last_seen=timezone.now())
    return cluster


def last_pass(cluster: Cluster) -> DetectorPass | None:
    return DetectorPass.objects.filter(cluster=cluster).first()


def passes_waiting(cluster: Cluster) -> int:
    """Backends waiting for the cluster's sync lock: passes of it that are running."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND objid = %s AND NOT granted",
            [SYNC_LOCK_NAMESPACE, cluster.pk],
        )
        return cursor.fetchone()[0]


def detectors_line(client: Client, cluster: Cluster) -> str:
    page = client.get(f"/clusters/{cluster.name}/")
    assert page.status_code == 200
    found = re.search(r'<p id="detectors-ran"[^>]*>([^<]*)</p>', page.content.decode())
    assert found, "the overview's detectors line"
    return found.group(1)


def ran_ago(line: str) -> float:
    found = re.match(r"Detectors ran (\d+) s ago", line)
    assert found, line
    return float(found.group(1))


def evaluate_cluster_tasks(log, offset: int) -> int:
    return log.read_bytes()[offset:].count(f"Task {EVALUATE_CLUSTER_TASK}[".encode())


def test_a_slow_cluster_delays_only_itself_and_its_passes_never_overlap(periodic_workers):
    from django.conf import settings

    period = settings.ALERT_EVALUATE_INTERVAL
    offsets = [log.stat().st_size for log in periodic_workers]
    slow, quick = active_cluster("slow"), active_cluster("quick")
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("ops", password="x" * 16))
    wait_until(lambda: last_pass(slow) and last_pass(quick), 30, "both clusters' first pass")
    before = last_pass(slow)
    overlaps = periodic_skips().get(f"{EVALUATE_CLUSTER_TASK}:overlap", 0)

    # The test holds the slow cluster's sync lock: its next pass stops in the middle (as a
    # pass over a huge window would), holding the cluster's pass lock and one worker.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s, %s)", [SYNC_LOCK_NAMESPACE, slow.pk])
    held_at = time.monotonic()
    try:
        wait_until(lambda: passes_waiting(slow) == 1, 3 * period, "the slow cluster's pass")
        quick_passes: set[float] = set()
        while time.monotonic() - held_at < HELD_S:
            # never a second pass of the slow cluster beside the one that is stuck
            assert passes_waiting(slow) == 1
            quick_passes.add(last_pass(quick).ran_at.timestamp())
            time.sleep(0.25)
        # the quick cluster went on every period on the other worker slots
        ordered = sorted(quick_passes)
        assert len(ordered) >= 3, ordered
        assert max(b - a for a, b in zip(ordered, ordered[1:], strict=False)) < 2 * period
        # each overview: its own cluster's pass
        quick_line, slow_line = detectors_line(client, quick), detectors_line(client, slow)
        assert ran_ago(quick_line) <= 2 * period and "late" not in quick_line, quick_line
        assert ran_ago(slow_line) >= HELD_S - 1 and slow_line.endswith(": late"), slow_line
        stuck = last_pass(slow)
        assert stuck.ran_at == before.ran_at  # no pass of the slow cluster finished
        # the ticks' passes of the slow cluster found its lock taken: skipped and counted
        assert stuck.skipped - before.skipped >= 2, stuck.skipped
        after = periodic_skips().get(f"{EVALUATE_CLUSTER_TASK}:overlap", 0)
        assert after - overlaps >= 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [SYNC_LOCK_NAMESPACE, slow.pk])
    # the stuck pass finishes; it took as long as it was held
    wait_until(lambda: last_pass(slow).ran_at > before.ran_at, 30, "the slow pass to finish")
    assert last_pass(slow).duration_s >= HELD_S - 2 * period
    wait_until(lambda: ran_ago(detectors_line(client, slow)) <= 2 * period, 30, "slow again")
    # any periodic worker takes a cluster's pass: both took some
    received = [
        evaluate_cluster_tasks(log, at) for log, at in zip(periodic_workers, offsets, strict=True)
    ]
    assert all(count > 0 for count in received), received


def test_an_expired_cluster_pass_is_counted_on_its_cluster(periodic_workers):
    from celery import current_app

    cluster = active_cluster("expired")
    wait_until(lambda: last_pass(cluster), 30, "the cluster's first pass")
    before = last_pass(cluster).skipped
    expired = periodic_skips().get(f"{EVALUATE_CLUSTER_TASK}:expired", 0)
    current_app.send_task(
        EVALUATE_CLUSTER_TASK,
        args=(cluster.pk,),
        expires=datetime.now(UTC) - timedelta(seconds=1),
    )
    wait_until(lambda: last_pass(cluster).skipped > before, 30, "the expired pass counted")
    assert periodic_skips().get(f"{EVALUATE_CLUSTER_TASK}:expired", 0) > expired
