"""Fault 3: Postgres crashed (`pg_ctl -m immediate`) during ingest and started again: agents
get 503 + Retry-After meanwhile (never a 500, nor do pages or API reads), the web processes
and workers reconnect by themselves, and every batch answered 202 is stored once."""

import os
import time
import uuid

import pytest

from launcher.procs import wait_until
from tests.conftest import AgentClient
from tests.faults.ingest import Sender, batch_count
from tests.faults.postgres_server import PrivatePostgres
from tests.faults.private_stack import (
    assert_stored_exactly_once,
    private_stack,
    token_issue,
    unprocessed,
)
from tests.faults.probe import Prober

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1800),
]

DOWN_S = float(os.environ.get("FAULTS_PG_DOWN_S", "10"))


@pytest.fixture
def pg_stack(live_stack, live_db):
    database = PrivatePostgres().start()
    try:
        prefix = f"opsboard-faults-pg-{uuid.uuid4().hex[:6]}"
        with private_stack(live_stack, database, OPSBOARD_REDIS_PREFIX=prefix) as stack:
            yield stack, database
    finally:
        database.remove()


def test_ingest_through_a_postgres_crash_stores_every_accepted_batch_once(pg_stack):
    stack, database = pg_stack
    secret = token_issue(stack, "faults-pg")
    agent = AgentClient(stack.url, secret)
    count = batch_count()
    # paced so that the ingest spans the crash: a third before, the rest during and after
    sender = Sender(agent, count, "pg", pace_s=(DOWN_S * 3) / count).start()
    prober = Prober(stack.url, secret).start()
    try:
        wait_until(lambda: len(sender.accepted) >= count // 3, 600, "a third of the ingest")
        accepted_before = len(sender.accepted)
        database.crash()
        crashed = time.monotonic()
        time.sleep(DOWN_S)
        accepted_down = len(sender.accepted) - accepted_before
        database.start()
        restarted = time.monotonic()
        before_restart = dict(sender.statuses)
        sender.join(1800)
        last = time.monotonic()
        wait_until(lambda: unprocessed(database) == 0, 600, "the inbox drained after the crash")
        drained = time.monotonic()
    finally:
        prober.stop()
        agent.http.close()
    after_restart = {
        status: n - before_restart.get(status, 0)
        for status, n in sender.statuses.items()
        if n > before_restart.get(status, 0)
    }
    print(
        f"\nfaults: Postgres down {restarted - crashed:.1f} s ({accepted_down} batches accepted"
        f" meanwhile); {count} batches, answers {sender.statuses} ({after_restart} after the"
        f" restart), longest request"
        f" {sender.longest_s:.1f} s; last batch accepted {last - restarted:.1f} s after the"
        f" restart, backlog 0 {drained - last:.1f} s later;"
        f" worker restarts {stack.worker.restarts}, periodic {stack.periodic.restarts};"
        f" reads {prober.summary()} (longest {prober.longest_s:.1f} s)"
    )
    assert not prober.failures, prober.failures[:10]
    assert sender.no_retry_after == 0
    assert sender.statuses.get(503, 0) > 0, "the crash must have been seen by the agents"
    assert_stored_exactly_once(database, sender.accepted)
