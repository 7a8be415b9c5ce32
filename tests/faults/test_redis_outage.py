"""Fault 2: Redis stopped for 60 s during ingest, then restarted; then killed and restarted
with its data lost (every queued task gone): the inbox sweep recovers everything."""

import os
import time
import uuid

import pytest

from apps.clusters.services import token_issue
from launcher.procs import wait_until
from tests.conftest import AgentClient
from tests.faults.ingest import Sender, assert_stored_exactly_once, batch_count, unprocessed
from tests.faults.redis_server import stack_on_private_redis

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(3600),
]

DOWN_S = float(os.environ.get("FAULTS_REDIS_DOWN_S", "60"))


@pytest.fixture
def redis_stack(live_stack, tmp_path, live_db):
    """A stack of its own on a private Redis (tests.faults.redis_server)."""
    with stack_on_private_redis(
        live_stack, tmp_path / "redis", name="faults-redis", publisher=False
    ) as stack_and_server:
        yield stack_and_server


def test_ingest_through_a_redis_outage_and_a_wiped_redis_stores_every_batch_once(redis_stack):
    stack, server = redis_stack
    token, secret = token_issue(cluster_name=f"faults-redis-{uuid.uuid4().hex[:6]}")
    agent = AgentClient(stack.url, secret)
    count = batch_count()
    # paced so that the ingest spans the outage: a third before, the rest during and after
    sender = Sender(agent, count, "outage", pace_s=(DOWN_S * 1.5) / count).start()
    wait_until(lambda: len(sender.accepted) >= count // 3, 600, "a third of the ingest")
    server.stop()
    stopped = time.monotonic()
    accepted_before = len(sender.accepted)
    time.sleep(DOWN_S)
    accepted_down = len(sender.accepted) - accepted_before
    server.start()
    restarted = time.monotonic()
    sender.join(1800)
    wait_until(lambda: unprocessed(token) == 0, 600, "the inbox drained after the outage")
    recovered = time.monotonic() - restarted
    print(
        f"\nfaults: Redis down {restarted - stopped:.0f} s: {accepted_down} batches accepted"
        f" meanwhile; backlog 0 {recovered:.1f} s after its restart; answers {sender.statuses};"
        f" worker restarts {stack.worker.restarts}, periodic {stack.periodic.restarts}"
    )
    assert accepted_down > 0, "ingest must go on accepting while Redis is down"
    assert_stored_exactly_once(token, sender.accepted)

    # the second time its data is lost: queued drain tasks and flags are gone for good
    wiped = Sender(agent, count, "wiped", pace_s=10.0 / count).start()
    wait_until(lambda: len(wiped.accepted) >= count // 2, 600, "half the second ingest")
    server.lose_everything()
    server.start()
    lost_at = time.monotonic()
    wiped.join(1800)
    wait_until(lambda: unprocessed(token) == 0, 600, "the sweep to recover the lost tasks")
    print(
        f"faults: Redis wiped: backlog 0 {time.monotonic() - lost_at:.1f} s after it came"
        f" back empty; answers {wiped.statuses}"
    )
    assert_stored_exactly_once(token, sender.accepted + wiped.accepted)
