"""Fault 5: the real agent (`opsboard-agent run`, its spool on disk) cut off from the server
for 120 s: the web server is stopped, every POST refused. The spool holds what the agent
collects within its byte cap, dropping the oldest batches and counting them once the cap is
reached; after the server is back, everything still spooled is delivered, and stored, once.

The spool's journal names every batch the agent ever spooled: each is stored, dropped
(counted by the agent) or still spooled when it stopped, exactly one of the three. The
workers stand still until the agent has stopped, so the inbox still holds every delivered
body: the samples they carry are the samples stored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection

from apps.clusters.models import Node
from apps.ingest.models import InboxBatch, decode_payload
from launcher.procs import ROOT, free_port, http_ok, wait_until
from opsboard_agent.spool import SUFFIX
from tests.stackproc import LOG_DIR

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1800),
]

CUTOFF_S = float(os.environ.get("FAULTS_CUTOFF_S", "120"))
INTERVAL_S = 0.25  # a collection, and so a batch, every 0.25 s
# The cap: about half of what the agent spools during the cutoff (a host-metrics batch is
# ~870 bytes), so that it must drop; the journal and the counted drops say which went.
CAP_BYTES = int(CUTOFF_S / INTERVAL_S * 870 / 2)
NODE = "cutoff-node"


class Agent:
    def __init__(self, url: str, secret: str, directory: Path) -> None:
        self.spool = directory / "spool"
        token_file = directory / "token"
        token_file.write_text(secret)
        port = free_port()
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"
        command = [sys.executable, "-m", "opsboard_agent", "run", "--server", url]
        command += ["--token-file", str(token_file), "--node", NODE, "--no-gpu"]
        command += ["--interval", str(INTERVAL_S), "--batch-seconds", "0"]
        command += ["--spool-dir", str(self.spool)]
        command += ["--spool-max-mb", str(CAP_BYTES / 2**20), "--spool-journal"]
        command += ["--metrics-port", str(port)]
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        with open(LOG_DIR / "faults-agent.log", "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_until(lambda: http_ok(self.metrics_url), 30, "the agent's metrics")

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.metrics_url, timeout=5).text
        values = {}
        for line in text.splitlines():
            if line.startswith("opsboard_agent_spool_"):
                name, value = line.rsplit(" ", 1)
                key = name.removeprefix("opsboard_agent_spool_").removesuffix("_total")
                values[key] = float(value)
        return values

    def stop(self) -> None:
        """SIGTERM: it spools its buffer and delivers for up to 5 s, then exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def journal(self) -> list[str]:
        return (self.spool / "journal").read_text().split()

    def spooled(self) -> list[str]:
        return [json.loads(p.read_bytes())["batch_id"] for p in self.spool.glob("*" + SUFFIX)]


def delivered(token) -> int:
    return InboxBatch.objects.filter(token=token).count()


def inbox_samples(token) -> int:
    rows = InboxBatch.objects.filter(token=token).values_list("payload", "payload_encoding")
    return sum(
        len(json.loads(decode_payload(bytes(payload), encoding)).get("samples", []))
        for payload, encoding in rows
    )


def stored_samples(token) -> int:
    node = Node.objects.get(cluster=token.cluster, name=NODE)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(n), 0) FROM telemetry_chunk WHERE node_id = %s", [node.pk]
        )
        return int(cursor.fetchone()[0])


def test_the_spool_holds_a_cutoff_within_its_cap_and_delivers_it_once(
    live_stack, agent_token, live_db, tmp_path
):
    token, secret = agent_token
    live_stack.worker.stop()  # the inbox keeps every delivered body until the counts
    live_stack.periodic.stop()
    agent = Agent(live_stack.url, secret, tmp_path)
    try:
        wait_until(lambda: delivered(token) >= 20, 120, "the agent's first batches")
        live_stack.web.stop()
        cut = time.monotonic()
        most_bytes, dropped = 0.0, 0.0
        while time.monotonic() - cut < CUTOFF_S:
            metrics = agent.metrics()
            most_bytes, dropped = max(most_bytes, metrics["bytes"]), metrics["dropped_batches"]
            time.sleep(1)
        at_restore = agent.metrics()
        live_stack.web.start()
        wait_until(lambda: http_ok(f"{live_stack.url}/healthz"), 60, "the web server back")
        restored = time.monotonic()
        # the backoff is capped at 60 s (opsboard_agent.sender); then one batch a tick waits
        wait_until(lambda: agent.metrics()["batches"] <= 1, 300, "the spool delivered")
        emptied = time.monotonic() - restored
        dropped = agent.metrics()["dropped_batches"]
    finally:
        agent.stop()
        if not live_stack.web.running:
            live_stack.web.start()
            wait_until(lambda: http_ok(f"{live_stack.url}/healthz"), 60, "the web server")
        live_stack.worker.start()
        live_stack.periodic.start()
    journal, left = agent.journal(), agent.spooled()
    stored_ids = list(InboxBatch.objects.filter(token=token).values_list("batch_id", flat=True))
    samples = inbox_samples(token)
    wait_until(
        lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
        300,
        "the inbox stored",
    )
    print(
        f"\nfaults: agent cut off {CUTOFF_S:.0f} s: spool at most {most_bytes:.0f} bytes of a"
        f" {CAP_BYTES}-byte cap ({at_restore['batches']:.0f} batches at the restore),"
        f" {dropped:.0f} oldest dropped; spool empty {emptied:.1f} s after the restore;"
        f" {len(journal)} batches spooled = {len(stored_ids)} stored + {dropped:.0f} dropped"
        f" + {len(left)} left; {samples} samples delivered and stored"
    )
    assert most_bytes <= CAP_BYTES
    assert dropped > 0, "the cutoff outgrew the cap: the oldest batches must have gone"
    assert len(set(journal)) == len(journal)
    assert set(stored_ids) <= set(journal) and set(left) <= set(journal)
    assert not set(stored_ids) & set(left)
    assert len(journal) == len(stored_ids) + dropped + len(left)
    assert stored_samples(token) == samples
