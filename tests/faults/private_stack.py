"""A stack of the test's own on a private Postgres (tests/faults/postgres_server.py), for the
faults that must not touch the machine's database: counted with SQL in that database, which
holds this test's rows alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from launcher.procs import ROOT
from tests.conftest import stack_env
from tests.faults.ingest import SAMPLES_PER_BATCH, STEPS_PER_BATCH
from tests.faults.postgres_server import PrivatePostgres
from tests.stackproc import Stack

# a sitecustomize that dumps every thread's stack on SIGRTMIN+1 (stack_dump)
STACK_DUMP = Path(__file__).parent / "stackdump"


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout


@contextmanager
def private_stack(live_stack, database: PrivatePostgres, **env: str) -> Iterator[Stack]:
    """A migrated private database under a stack of its own. The session stack's workers
    stand still meanwhile (two cores: four Celery workers and beat would compete)."""
    dump = [str(STACK_DUMP), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = stack_env(DATABASE_URL=database.url, PYTHONPATH=os.pathsep.join(dump), **env)
    stack = Stack(environment, name=env["OPSBOARD_REDIS_PREFIX"])
    manage(stack.env, "migrate", "--noinput", "-v0")
    live_stack.worker.stop()
    live_stack.periodic.stop()
    try:
        yield stack.start()
    finally:
        stack.stop()
        live_stack.worker.start()
        live_stack.periodic.start()


def stack_dump(stack: Stack) -> None:
    """Every web worker writes its threads' stacks to the web log (tests/artifacts/logs)."""
    assert stack.web.popen is not None
    for worker in psutil.Process(stack.web.popen.pid).children():
        worker.send_signal(signal.SIGRTMIN + 1)


def token_issue(stack: Stack, cluster: str) -> str:
    """A new agent token of `cluster` in the stack's database; its secret."""
    return manage(stack.env, "issue_token", cluster, "--name", "faults").strip()


def unprocessed(database: PrivatePostgres) -> int:
    return database.query("SELECT count(*) FROM ingest_inboxbatch WHERE processed_at IS NULL")[0][0]


def assert_stored_exactly_once(database: PrivatePostgres, batch_ids: list[str]) -> None:
    """As tests.faults.ingest's, counted in the private database."""
    assert len(set(batch_ids)) == len(batch_ids)
    inbox = [row[0] for row in database.query("SELECT batch_id FROM ingest_inboxbatch")]
    assert sorted(inbox) == sorted(batch_ids)
    assert unprocessed(database) == 0
    samples = database.query("SELECT coalesce(sum(n), 0) FROM telemetry_chunk")[0][0]
    assert samples == len(batch_ids) * SAMPLES_PER_BATCH
    steps = database.query("SELECT count(*) FROM runs_stepreport")[0][0]
    assert steps == len(batch_ids) * STEPS_PER_BATCH
