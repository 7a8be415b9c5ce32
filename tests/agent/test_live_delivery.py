"""Delivery against the real stack (web server, worker) started by `live_stack`: rejected
batches, an outage longer than the spool, and kill -9 of the agent mid-flush."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from launcher.procs import wait_until
from opsboard_agent.sender import Sender
from opsboard_agent.shipper import Shipper
from opsboard_agent.spool import Spool
from tests.agent.conftest import REPO, closed_port_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack]


def inbox_ids(token) -> list[str]:
    from apps.ingest.models import InboxBatch

    return list(InboxBatch.objects.filter(token=token).values_list("batch_id", flat=True))


def raw_points(url: str, secret: str, node: str, metric: str) -> list:
    response = httpx.get(
        f"{url}/api/v1/series",
        params={"node": node, "metric": metric},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    if response.status_code == 404:  # the node is not registered yet
        return []
    response.raise_for_status()
    return response.json()["points"]


def test_a_400_is_sent_once_and_dropped(live_stack, agent_token, live_db, tmp_path):
    token, secret = agent_token
    spool = Spool(tmp_path, max_bytes=1 << 20)
    now = time.time()
    bad = {
        "batch_id": "bad-1",
        "node": "node-01",
        "samples": [{"ts": now - 30 * 86400, "metric": "gpu.util", "value": 1.0}],
    }
    good = {
        "batch_id": "good-1",
        "node": "node-01",
        "samples": [{"ts": now, "metric": "gpu.util", "gpu": 0, "value": 1.0}],
    }
    spool.put("bad-1", json.dumps(bad).encode())
    spool.put("good-1", json.dumps(good).encode())
    sender = Sender(spool, server=live_stack.url, token=secret)
    assert sender.send_once() == 0.0  # 400: dropped, not retried
    assert sender.send_once() == 0.0  # the next batch goes through
    assert sender.send_once() is None
    assert (sender.stats.attempts, sender.stats.rejected, sender.stats.delivered) == (2, 1, 1)
    assert inbox_ids(token) == ["good-1"]


def test_an_outage_fills_the_spool_then_the_rest_is_delivered_once(
    live_stack, agent_token, live_db, tmp_path
):
    token, secret = agent_token
    # The size of one batch, to set the cap at five and a half of them.
    probe = Spool(tmp_path / "probe", max_bytes=1 << 20)
    shipper_probe = Shipper(spool=probe, sender=None, node="node-02")
    shipper_probe.add(samples=filler(0))
    shipper_probe.flush()
    size = probe.size_bytes
    probe.close()

    spool = Spool(tmp_path / "spool", max_bytes=int(size * 5.5))
    sender = Sender(
        spool, server=closed_port_url(), token=secret, backoff_base=0.05, backoff_cap=0.3
    )
    shipper = Shipper(spool=spool, sender=sender, node="node-02").start()
    spooled = []
    for i in range(12):
        shipper.add(samples=filler(i))
        spooled += shipper.flush()
        time.sleep(0.05)
    time.sleep(0.5)  # a few more failed attempts
    assert sender.stats.retries > 3 and sender.stats.delivered == 0
    assert spool.dropped == 7 and len(spool) == 5
    survivors = spool.batch_ids()
    assert survivors == spooled[7:]

    sender.server = live_stack.url  # the server is back
    wait_until(lambda: len(spool) == 0, 30, "the spool to drain")
    # A batch built now reports all 7 drops (each batch counts those before it).
    shipper.add(samples=filler(99))
    survivors += shipper.flush()
    wait_until(lambda: len(spool) == 0, 30, "the last batch")
    shipper.close(drain_timeout=0)
    assert sorted(inbox_ids(token)) == sorted(survivors)
    assert sender.stats.delivered == 6 and sender.stats.duplicates == 0
    # The drop count reached the server as the agent's own metric.
    wait_until(
        lambda: (
            max(
                (
                    p[1]
                    for p in raw_points(
                        live_stack.url, secret, "node-02", "agent.spool_dropped_batches"
                    )
                ),
                default=0,
            )
            >= 7
        ),
        60,
        "agent.spool_dropped_batches to be stored",
    )


def filler(i: int) -> list[dict]:
    now = time.time()
    return [{"ts": now, "metric": "host.cpu_util", "value": float(i % 10)}] * 20


def test_kill_9_mid_flush_loses_nothing_and_duplicates_nothing(
    live_stack, agent_token, live_db, tmp_path
):
    token, secret = agent_token
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    spool_dir = tmp_path / "spool"
    command = [
        sys.executable,
        "-m",
        "opsboard_agent",
        "run",
        "--server",
        live_stack.url,
        "--token-file",
        str(token_file),
        "--node",
        "node-k9",
        "--interval",
        "0.05",
        "--batch-seconds",  # a batch a tick: many flushes for the kills to land in
        "0",
        "--spool-dir",
        str(spool_dir),
        "--spool-journal",
        "--no-gpu",
        "--log-level",
        "WARNING",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(3)
    for _ in range(5):
        agent = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True)
        time.sleep(1.0 + rng.random())  # agent start-up, then flushes mid-stream
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(timeout=10)
    agent = subprocess.Popen(command, cwd=REPO, env=env, start_new_session=True)
    time.sleep(2)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0

    spool = Spool(spool_dir, max_bytes=1 << 30, journal=True)
    sender = Sender(spool, server=live_stack.url, token=secret)
    while sender.send_once() is not None:  # whatever the last drain left
        pass
    spooled = spool.journal_ids()
    assert len(spooled) == len(set(spooled)) > 50
    stored = inbox_ids(token)
    assert len(stored) == len(set(stored))
    assert set(stored) == set(spooled)  # 0 lost, nothing that was not spooled
    # Each batch carries one agent.collector_errors sample: stored exactly once each.
    wait_until(
        lambda: (
            len(raw_points(live_stack.url, secret, "node-k9", "agent.collector_errors"))
            >= len(spooled)
        ),
        90,
        "the worker to store every batch",
    )
    time.sleep(2)
    assert len(raw_points(live_stack.url, secret, "node-k9", "agent.collector_errors")) == len(
        spooled
    )


def test_gathered_ticks_are_stored_once_each_as_chunks_of_many_points(
    live_stack, agent_token, live_db, tmp_path
):
    from django.db import connection

    token, secret = agent_token
    token_file = tmp_path / "token"
    token_file.write_text(secret)
    command = [
        *(sys.executable, "-m", "opsboard_agent", "run", "--server", live_stack.url),
        *("--token-file", str(token_file), "--node", "node-b1", "--no-gpu"),
        *("--interval", "0.2", "--batch-seconds", "1", "--spool-dir", str(tmp_path / "spool")),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 0, stderr
    stopped = re.search(r"stopped after (\d+) ticks; 0 batches left", stderr)
    assert stopped, stderr
    ticks = int(stopped.group(1))
    assert ticks >= 10
    # One agent.collector_errors sample a tick: every tick stored, none twice.
    wait_until(
        lambda: (
            len(raw_points(live_stack.url, secret, "node-b1", "agent.collector_errors")) >= ticks
        ),
        60,
        "every tick to be stored",
    )
    points = raw_points(live_stack.url, secret, "node-b1", "agent.collector_errors")
    assert len(points) == len({p[0] for p in points}) == ticks
    batches = inbox_ids(token)
    assert len(batches) == len(set(batches)) <= 2 + ticks // 5 - 1  # the first tick alone
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(c.n), sum(c.n) FROM telemetry_chunk c"
            " JOIN telemetry_metric m ON m.id = c.metric_id"
            " JOIN clusters_node n ON n.id = c.node_id"
            " WHERE n.cluster_id = %s AND n.name = 'node-b1'"
            " AND m.name = 'agent.collector_errors'",
            [token.cluster_id],
        )
        most, total = cursor.fetchone()
    assert total == ticks and most >= 4  # a chunk a batch: ≈ 5 ticks each
