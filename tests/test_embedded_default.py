"""With no DATABASE_URL / REDIS_URL the stack starts its own Postgres and Redis under the
var dir, ingests end to end, stops them on Ctrl-C, and finds its data again on restart."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from launcher.procs import ROOT, free_port, http_ok, wait_until
from tests.conftest import make_batch

pytestmark = pytest.mark.timeout(240)


def embedded_env(var_dir) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "OPSBOARD_REDIS_PREFIX")
    }
    return {**env, "OPSBOARD_VAR_DIR": str(var_dir), "DEBUG": "true", "PYTHONUNBUFFERED": "1"}


def start_stack(env, port, log):
    command = [sys.executable, "-m", "launcher.stack", "run", "--port", str(port)]
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
            # the embedded Postgres is the stack's own: its backends follow ingest's priority
            # (DB_BACKEND_NICE, opt-in elsewhere), named to every child that uses it
            children = psutil.Process(stack.pid).children(recursive=True)
            environs = [c.environ() for c in children if c.is_running()]
            served = [e for e in environs if "DATABASE_URL" in e]
            assert served and all(e.get("DB_BACKEND_NICE") == "true" for e in served)
        finally:
            stop_stack(stack)
        assert not (tmp_path / "var" / "pgdata" / "postmaster.pid").exists()
        assert not http_ok(f"http://127.0.0.1:{port}/healthz")

        stack = start_stack(env, port, log2)  # the same var dir: the data is still there
        try:
            assert len(series(port, secret, now - 60)) == 1
        finally:
            stop_stack(stack)


def servers_up(var_dir) -> set[str]:
    """Which embedded servers of this var dir run: Postgres by its postmaster's command line
    (which names the data directory), Redis by its port answering (it renames its process)."""
    import psutil
    import redis

    up = set()
    pgdata = str(var_dir / "pgdata")
    if any(pgdata in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])):
        up.add("postgres")
    port_file = var_dir / "redis" / "port"
    if port_file.exists():
        try:
            redis.Redis(port=int(port_file.read_text()), socket_timeout=1).ping()
            up.add("redis")
        except redis.RedisError:
            pass
    return up


def pytest_on_embedded_default(env) -> None:
    """A short pytest session (pure tests, no database) on the embedded default: the
    settings still start (or attach to) the embedded servers, as `make test` does."""
    command = [sys.executable, "-m", "pytest", "tests/detectors/test_xid.py", "-q"]
    result = subprocess.run(
        [*command, "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True, timeout=180
    )
    assert result.returncode == 0, result.stdout.decode()[-2000:]


def embedded_start(env) -> None:
    code = "from opsboard.embedded import database_url, redis_url; database_url(); redis_url()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)


def embedded_stop(env) -> None:
    code = "from opsboard.embedded import stop_all; stop_all()"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=60)


def test_a_test_session_stops_the_servers_it_started_and_leaves_running_ones_alone(tmp_path):
    var = tmp_path / "var"
    env = embedded_env(var)
    try:
        pytest_on_embedded_default(env)
        assert (var / "pgdata").exists(), "the session did not use the embedded default"
        wait_until(lambda: not servers_up(var), 30, "the embedded servers to stop")

        embedded_start(env)
        assert servers_up(var) == {"postgres", "redis"}
        pytest_on_embedded_default(env)
        assert servers_up(var) == {"postgres", "redis"}
    finally:
        embedded_stop(env)
