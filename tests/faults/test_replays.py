"""Fault 6: every batch replayed 3 times, and 100 batches each posted twice at once."""

import gzip
import json
import threading

import httpx
import pytest

from launcher.procs import wait_until
from tests.faults.ingest import assert_stored_exactly_once, fault_batch, unprocessed

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

REPLAYED, REPLAYS, DOUBLE_POSTS = 50, 3, 100


def post(url: str, secret: str, batch: dict) -> tuple[int, dict]:
    response = httpx.post(
        f"{url}/api/v1/ingest",
        content=gzip.compress(json.dumps(batch).encode()),
        headers={
            "Authorization": f"Bearer {secret}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        },
        timeout=60,
    )
    return response.status_code, response.json()


def test_it_stores_a_replayed_batch_once_and_answers_every_replay_alike(
    live_stack, agent_token, live_db
):
    token, secret = agent_token
    batches = [fault_batch("replay", index) for index in range(REPLAYED)]
    firsts = [post(live_stack.url, secret, batch) for batch in batches]
    assert {status for status, _ in firsts} == {202}
    for batch in batches:
        answers = [post(live_stack.url, secret, batch) for _ in range(REPLAYS)]
        duplicate = (200, {"batch_id": batch["batch_id"], "duplicate": True})
        assert answers == [duplicate] * REPLAYS
    wait_until(lambda: unprocessed(token) == 0, 300, "the replayed batches stored")
    # a replay after the batch is stored is answered as one before it was
    late = [post(live_stack.url, secret, batch) for batch in batches]
    assert {status for status, _ in late} == {200}
    assert_stored_exactly_once(token, [batch["batch_id"] for batch in batches])


def test_it_stores_a_batch_posted_twice_at_once_exactly_once(live_stack, agent_token, live_db):
    token, secret = agent_token
    batches = [fault_batch("double", index) for index in range(DOUBLE_POSTS)]
    answers: dict[str, list[tuple[int, dict]]] = {batch["batch_id"]: [] for batch in batches}
    start = threading.Barrier(2 * DOUBLE_POSTS, timeout=60)

    def twice(batch: dict) -> None:
        start.wait()  # all 200 posts leave together
        answers[batch["batch_id"]].append(post(live_stack.url, secret, batch))

    threads = [
        threading.Thread(target=twice, args=(batch,), daemon=True)
        for batch in batches
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    for batch in batches:
        pair = sorted(answers[batch["batch_id"]], key=lambda answer: answer[0])
        assert [status for status, _ in pair] == [200, 202], pair
        assert pair[0][1] == {"batch_id": batch["batch_id"], "duplicate": True}
        assert pair[1][1]["accepted"] == {"samples": 2000, "steps": 8, "events": 0}
    wait_until(lambda: unprocessed(token) == 0, 300, "the double posts stored")
    assert_stored_exactly_once(token, [batch["batch_id"] for batch in batches])
