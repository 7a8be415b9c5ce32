"""With no DATABASE_URL / REDIS_URL the stack starts its own Postgres and Redis under the
var dir, ingests end to end, stops them on Ctrl-C, and finds its data again on restart."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_batch
from tests.stackproc import ROOT, free_port, http_ok, wait_until

pytestmark = pytest.mark.timeout(240)


def embedded_env(var_dir) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "OPSBOARD_REDIS_PREFIX")
    }
    return {**env, "OPSBOARD_VAR_DIR": str(var_dir), "DEBUG": "true", "PYTHONUNBUFFERED": "1"}


def start_stack(env, port, log):
    command = [sys.executable, "-m", "opsboard.stack", "run", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--ws-port", str(free_port())],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log_path = Path(log.name)
    wait_until(
        lambda: b"Opsboard is up" in log_path.read_bytes() or process.poll() is not None,
        120,
        "the embedded stack",
    )
    assert process.poll() is None, "the stack exited during start-up"
    return process


def stop_stack(process):
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(timeout=60) == 0


def series(port, secret, start):
    response = httpx.get(
        f"http://127.0.0.1:{port}/api/v1/series",
        params={"node": "node-01", "metric": "gpu.util", "gpu": 0, "start": start},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=10,
    )
    return response.json()["points"] if response.status_code == 200 else []


def test_the_embedded_default_ingests_end_to_end_and_keeps_its_data(tmp_path):
    env = embedded_env(tmp_path / "var")
    port = free_port()
    with open(tmp_path / "stack.log", "wb") as log, open(tmp_path / "restart.log", "wb") as log2:
        stack = start_stack(env, port, log)
        try:
            secret = subprocess.run(
                [sys.executable, "manage.py", "issue_token", "embedded"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            now = time.time()
            response = httpx.post(
                f"http://127.0.0.1:{port}/api/v1/ingest",
                json=make_batch(samples=8, ts=now),
                headers={"Authorization": f"Bearer {secret}"},
            )
            assert response.status_code == 202
            points = wait_until(
                lambda: series(port, secret, now - 60), 60, "the batch to be stored"
            )
            assert len(points) == 1 and points[0][1] == 0.0
        finally:
            stop_stack(stack)
        assert not (tmp_path / "var" / "pgdata" / "postmaster.pid").exists()
        assert not http_ok(f"http://127.0.0.1:{port}/healthz")

        stack = start_stack(env, port, log2)  # the same var dir: the data is still there
        try:
            assert len(series(port, secret, now - 60)) == 1
        finally:
            stop_stack(stack)
