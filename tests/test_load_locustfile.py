"""bench/locustfile.py (the mixed load of `make load`) against the live stack for a few
seconds: one agent, one long-poll, one browser; every kind of request made, none failed,
and every sample and step report the agent was told was accepted stored."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from apps.access.services import role_grant
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from apps.runs.models import Run, StepReport
from launcher.procs import ROOT

pytestmark = pytest.mark.stack
PASSWORD = "a-long-load-password"
KINDS = (
    "ingest POST",
    "poll: to the base URL",
    "poll: held",
    "login",
    "page: overview",
    "page: run",
    "page: node",
    "page: alerts",
)


def test_it_runs_every_user_class_without_a_failure(live_stack, live_db, tmp_path):
    cluster = Cluster.objects.create(name="load")
    run = Run.objects.create(cluster=cluster, name="load-run")
    Node.objects.bulk_create(Node(cluster=cluster, name=f"node-{i:02d}") for i in range(2))
    nodes = ["node-00", "node-01"]
    tokens = [token_issue(cluster_name="load", nodes=[node])[1] for node in nodes]
    viewer = get_user_model().objects.create_user("load-viewer", password=PASSWORD)
    role_grant(user=viewer, cluster=cluster, role="viewer")
    config = {
        "url": live_stack.url, "ingest_url": live_stack.url, "cluster": "load",
        "run": run.name, "run_start": time.time() - 100, "run_nodes": 1, "nodes": nodes,
        "tokens": tokens, "agents": 1, "longpolls": 1, "browsers": 1, "poll_wait": 1,
        "think": 0.5, "viewer": {"username": "load-viewer", "password": PASSWORD},
        "out_dir": str(tmp_path),
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    stored_before = samples_stored()

    locust = subprocess.run(
        [
            *(sys.executable, "-m", "locust", "-f", str(ROOT / "bench" / "locustfile.py")),
            *("--headless", "-u", "3", "-r", "3", "-t", "8s", "--stop-timeout", "20"),
            *("--csv", str(tmp_path / "load"), "--only-summary", "--loglevel", "WARNING"),
        ],
        cwd=ROOT,
        env={**live_stack.env, "OPSBOARD_LOAD_CONFIG": str(tmp_path / "config.json")},
        capture_output=True,
        text=True,
        timeout=90,
    )

    stats = (tmp_path / "load_stats.csv").read_text().splitlines()
    rows = {row["Name"]: row for row in csv.DictReader(stats)}
    failures = (tmp_path / "load_failures.csv").read_text()
    assert locust.returncode == 0, locust.stdout[-3000:] + locust.stderr[-3000:] + failures
    assert int(rows["Aggregated"]["Failure Count"]) == 0, failures
    for kind in KINDS:
        assert int(rows[kind]["Request Count"]) > 0, kind
    told = json.loads(next(Path(tmp_path).glob("accepted-*.json")).read_text())
    assert told["samples"] > 0 and told["steps"] > 0
    deadline = time.monotonic() + 30
    while InboxBatch.objects.filter(processed_at__isnull=True).exists():
        assert time.monotonic() < deadline, "the inbox did not drain"
        time.sleep(0.2)
    assert samples_stored() - stored_before == told["samples"]
    assert StepReport.objects.filter(run=run).count() == told["steps"]


def samples_stored() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(n), 0) FROM telemetry_chunk")
        return cursor.fetchone()[0]
