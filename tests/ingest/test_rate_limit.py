"""Per-token rate limit of POST /api/v1/ingest: a token bucket in the real Redis, shared by
the web workers of a stack started with a small limit; 429 with Retry-After and the
contract's error body, other tokens unaffected, accepted again after the wait."""

from __future__ import annotations

import time
import uuid

import pytest
from django.test import override_settings

from apps.clusters.services import token_issue
from apps.core.redis import redis_client
from apps.ingest.ratelimit import ingest_rate_key, ingest_rate_take
from tests.conftest import AgentClient, make_batch, stack_env
from tests.stackproc import Stack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
# one batch per 5 s after a burst of 5: a burst of requests cannot earn a batch back
RATE, BURST = 0.2, 5


@pytest.fixture(scope="module")
def limited_stack(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        stack = Stack(
            stack_env(INGEST_RATE_PER_TOKEN=str(RATE), INGEST_RATE_BURST=str(BURST)),
            name="ratelimited",
            publisher=False,
        ).start()
    yield stack
    stack.stop()


def fresh_agent(stack: Stack) -> tuple[AgentClient, int]:
    token, secret = token_issue(cluster_name=f"r-{uuid.uuid4().hex[:8]}", name="test")
    redis_client().delete(ingest_rate_key(token_id=token.id))  # ids repeat across sessions
    return AgentClient(stack.url, secret), token.id


def test_the_sixth_batch_of_a_burst_gets_429_with_retry_after(limited_stack, live_db):
    agent, _ = fresh_agent(limited_stack)
    other, _ = fresh_agent(limited_stack)
    answers = [agent.post(make_batch(samples=1)) for _ in range(BURST + 2)]
    assert [a.status_code for a in answers] == [202] * BURST + [429, 429]

    limited = answers[BURST]
    retry_after = int(limited.headers["Retry-After"])
    assert 1 <= retry_after <= 1 / RATE
    errors = limited.json()["errors"]
    assert errors and {"loc", "msg"} <= set(errors[0]) and "rate" in errors[0]["msg"]

    # another cluster's token has its own bucket
    assert other.post(make_batch(samples=1)).status_code == 202

    time.sleep(retry_after)
    assert agent.post(make_batch(samples=1)).status_code == 202


def test_a_refused_batch_is_not_stored_and_may_be_sent_again(limited_stack, live_db):
    from apps.ingest.models import InboxBatch

    agent, _ = fresh_agent(limited_stack)
    for _ in range(BURST):
        assert agent.post(make_batch(samples=1)).status_code == 202
    batch = make_batch(samples=1)
    limited = agent.post(batch)
    assert limited.status_code == 429
    assert not InboxBatch.objects.filter(batch_id=batch["batch_id"]).exists()
    time.sleep(int(limited.headers["Retry-After"]))
    assert agent.post(batch).status_code == 202  # the agent's retry with the same body


# 5 a second: one batch's refill takes 200 ms, longer than a busy machine stalls between
# two takes, so the 4th take is refused however loaded the host is.
@override_settings(INGEST_RATE_PER_TOKEN=5.0, INGEST_RATE_BURST=3)
def test_the_bucket_refills_at_the_rate_up_to_the_burst(db):
    key_id = 10**9 + uuid.uuid4().int % 10**6
    redis_client().delete(ingest_rate_key(token_id=key_id))
    assert [ingest_rate_take(token_id=key_id) for _ in range(3)] == [0, 0, 0]
    assert ingest_rate_take(token_id=key_id) >= 1  # whole seconds for Retry-After
    time.sleep(1.0)  # 5 batches' worth of refill, capped at the burst of 3
    assert [ingest_rate_take(token_id=key_id) for _ in range(3)] == [0, 0, 0]
    assert ingest_rate_take(token_id=key_id) >= 1


@override_settings(INGEST_RATE_PER_TOKEN=0.0)
def test_a_zero_rate_turns_the_limit_off(db):
    assert all(ingest_rate_take(token_id=1) == 0 for _ in range(50))


@override_settings(REDIS_URL="redis://127.0.0.1:1/0", INGEST_RATE_BURST=1)
def test_it_fails_open_when_redis_is_unreachable(db):
    from apps.ingest import ratelimit

    ratelimit._script.cache_clear()
    try:
        started = time.monotonic()
        assert [ingest_rate_take(token_id=1) for _ in range(20)] == [0] * 20
        assert time.monotonic() - started < 2, "one failed attempt, then the limiter rests"
    finally:
        ratelimit._script.cache_clear()
        ratelimit._down_until = 0.0
