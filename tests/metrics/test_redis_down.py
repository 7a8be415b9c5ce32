"""With Redis (the broker) unreachable, a server process still answers its probes: /readyz
503 naming the broker, /metrics 200 with the database's gauges and `opsboard_redis_up 0`.
A real process pointed at a port where nothing listens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.procs import free_port
from tests.conftest import stack_env
from tests.metrics.scrape import TOKEN, parse, value

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json
from django.test import Client
client = Client()
ready = client.get("/readyz")
scrape = client.get("/metrics", HTTP_AUTHORIZATION="Bearer %s")
print(json.dumps({"ready": [ready.status_code, ready.json()],
                  "metrics": [scrape.status_code, scrape.content.decode()]}))
"""


def test_without_redis_the_probes_say_so_and_the_database_gauges_remain():
    env = {
        **os.environ,
        **stack_env(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"),
        "ALLOWED_HOSTS": "testserver",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", PROBE % TOKEN],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    status, body = answers["ready"]
    assert status == 503 and body["not_ready"] == ["broker"]
    assert body["checks"]["database"] == "ok"
    status, text = answers["metrics"]
    assert status == 200
    samples, families = parse(text)
    assert value(samples, "opsboard_redis_up") == 0
    assert ("opsboard_inbox_backlog_batches", ()) in samples
    assert "opsboard_ingest_batches" not in families  # kept in Redis: left out
