"""Fault 1: the ingest worker killed with SIGKILL at 3 random moments of a large ingest."""

import random
import signal
import time

import pytest

from launcher.procs import wait_until
from tests.faults.ingest import (
    SAMPLES_PER_BATCH,
    Sender,
    assert_stored_exactly_once,
    batch_count,
    unprocessed,
)

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(3600),
]

KILLS = 3


def test_it_stores_every_accepted_sample_once_across_three_worker_kills(
    live_stack, agent, agent_token, live_db
):
    token = agent_token[0]
    count = batch_count()
    seed = random.randrange(1 << 30)
    print(f"\nfaults: seed {seed}, {count} batches of {SAMPLES_PER_BATCH} samples")
    # 3 moments, each a point in the ingest (the nth accepted batch), drawn once per run
    moments = sorted(random.Random(seed).sample(range(count // 10, count * 9 // 10), KILLS))
    sender = Sender(agent, count, f"kill-{seed}").start()
    started = time.monotonic()
    try:
        for moment in moments:
            wait_until(
                lambda moment=moment: (
                    len(sender.accepted) >= moment or not sender.thread.is_alive()
                ),
                1800,
                f"batch {moment} accepted",
                interval=0.05,
            )
            backlog = unprocessed(token)
            live_stack.worker.kill(signal.SIGKILL)
            print(f"faults: SIGKILL at batch {len(sender.accepted)}, backlog {backlog}")
            live_stack.worker.start()  # the test is the worker's supervisor here
        sender.join(1800)
    finally:
        if not live_stack.worker.running:
            live_stack.worker.start()
    accepted_at = time.monotonic()
    wait_until(lambda: unprocessed(token) == 0, 600, "the inbox backlog to return to 0")
    drained = time.monotonic()
    print(
        f"faults: {len(sender.accepted)} batches accepted in {accepted_at - started:.1f} s,"
        f" backlog 0 {drained - accepted_at:.1f} s later; answers {sender.statuses}"
    )
    assert len(sender.accepted) == count
    assert_stored_exactly_once(token, sender.accepted)
