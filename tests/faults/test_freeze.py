"""Fault 4: Redis, then Postgres, frozen with SIGSTOP for 30 s each during ingest (a paused
VM, a stalled disk): every request is answered within its bounds (docs/faults.md, "Bounds"),
agents get 202, or 503/429 with Retry-After, and after SIGCONT everything resumes by itself:
every batch answered 202 stored once, the inbox backlog back to 0."""

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
    stack_dump,
    token_issue,
    unprocessed,
)
from tests.faults.probe import Prober
from tests.faults.redis_server import PrivateRedis

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1800),
]

FREEZE_S = float(os.environ.get("FAULTS_FREEZE_S", "30"))
# The longest any request may take while a server is frozen: the agent's own timeout
# (opsboard_agent.sender.Sender). docs/faults.md, "Bounds", adds up what a request can wait.
REQUEST_BOUND_S = 10.0


@pytest.fixture
def frozen_stack(live_stack, live_db, tmp_path):
    database, redis = PrivatePostgres(), PrivateRedis(tmp_path / "redis")
    try:
        database.start()
        redis.start()
        prefix = f"opsboard-faults-freeze-{uuid.uuid4().hex[:6]}"
        with private_stack(
            live_stack, database, REDIS_URL=redis.url, OPSBOARD_REDIS_PREFIX=prefix
        ) as stack:
            yield stack, database, redis
    finally:
        redis.lose_everything()
        database.remove()


def frozen(what, stack, sender: Sender, prober: Prober) -> tuple[float, int, dict[int, int]]:
    """Freeze `what` for FREEZE_S; (the longest request meanwhile, batches accepted, answers)."""
    sender.longest_s = prober.longest_s = 0.0
    accepted, statuses = len(sender.accepted), dict(sender.statuses)
    what.freeze()
    try:
        time.sleep(FREEZE_S * 2 / 3)
        stack_dump(stack)  # where the workers wait, in the web log
        time.sleep(FREEZE_S / 3)
    finally:
        what.thaw()
    time.sleep(REQUEST_BOUND_S)  # a request sent just before SIGCONT ends within its bound
    answers = {
        s: n - statuses.get(s, 0) for s, n in sender.statuses.items() if n > statuses.get(s, 0)
    }
    return max(sender.longest_s, prober.longest_s), len(sender.accepted) - accepted, answers


def test_nothing_hangs_while_redis_then_postgres_is_frozen_and_all_resumes(frozen_stack):
    stack, database, redis = frozen_stack
    secret = token_issue(stack, "faults-freeze")
    agent = AgentClient(stack.url, secret)
    count = batch_count()
    # paced to span both freezes (and the bound's wait after each)
    sender = Sender(agent, count, "freeze", pace_s=3 * (FREEZE_S + REQUEST_BOUND_S) / count)
    prober = Prober(stack.url, secret)
    sender.start()
    prober.start()
    try:
        wait_until(lambda: len(sender.accepted) >= count // 6, 600, "a sixth of the ingest")
        redis_frozen = frozen(redis, stack, sender, prober)
        postgres_frozen = frozen(database, stack, sender, prober)
        sender.join(1800)
        last = time.monotonic()
        wait_until(lambda: unprocessed(database) == 0, 600, "the inbox drained after the freezes")
        drained = time.monotonic() - last
    finally:
        prober.stop()
        agent.http.close()
    for name, (longest, accepted, answers) in (
        ("Redis", redis_frozen),
        ("Postgres", postgres_frozen),
    ):
        print(
            f"\nfaults: {name} frozen {FREEZE_S:.0f} s: longest request {longest:.1f} s,"
            f" {accepted} batches accepted meanwhile, answers {answers}"
        )
    print(
        f"faults: {count} batches, answers {sender.statuses}; backlog 0 {drained:.1f} s after"
        f" the last; worker restarts {stack.worker.restarts}, periodic {stack.periodic.restarts};"
        f" reads {prober.summary()}"
    )
    assert not prober.failures, prober.failures[:10]
    assert sender.no_retry_after == 0
    assert max(redis_frozen[0], postgres_frozen[0]) <= REQUEST_BOUND_S
    assert_stored_exactly_once(database, sender.accepted)
