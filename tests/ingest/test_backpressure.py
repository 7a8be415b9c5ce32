"""Backpressure: a valid POST waits while the inbox backlog is over its limit and the workers
are draining (bounded, then accepted anyway); a bad one is answered at once; without a
backlog, or with the workers stopped, nothing waits."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.test import Client

from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from apps.ingest.services import backpressure
from tests.conftest import database_url, make_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def limited(settings, monkeypatch):
    settings.INGEST_BACKLOG_ROWS, settings.INGEST_BACKLOG_WAIT_S = 3, 1.5
    monkeypatch.setattr(backpressure, "_last", (0.0, False))  # no reading left from before
    return token_issue(cluster_name="bp", name="t")


@pytest.fixture
def draining():
    """Workers draining, as far as the POSTs can tell: a drain heartbeat every 0.2 s."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            backpressure.drain_heartbeat()
            stop.wait(0.2)

    beater = threading.Thread(target=beat)
    beater.start()
    yield
    stop.set()
    beater.join()


class Backlog:
    """Inbox rows waiting, row-locked by a connection of the test's own.

    The session's live stack (tests/conftest.py) runs a real worker on this same database
    and queue; a drain task left queued by an earlier test would otherwise drain these rows
    mid-test. Its claim skips locked rows (FOR UPDATE SKIP LOCKED) while the backlog count
    still sees them: a backlog the workers are busy with, for as long as the test needs."""

    def __init__(self, token, count: int) -> None:
        InboxBatch.objects.bulk_create(
            InboxBatch(token=token, batch_id=f"waiting-{i}", payload=b"{}") for i in range(count)
        )
        self.holder = psycopg.connect(database_url(connection.settings_dict))
        self.holder.execute(
            "SELECT id FROM ingest_inboxbatch WHERE batch_id LIKE %s FOR UPDATE", ["waiting-%"]
        )

    def drain(self) -> None:
        """The workers catch up: every waiting row processed, committed."""
        self.holder.execute("UPDATE ingest_inboxbatch SET processed_at = now()")
        self.holder.commit()

    def close(self) -> None:
        self.holder.close()  # rolls back what is still open


@pytest.fixture
def backlog():
    held: list[Backlog] = []

    def make(token, count: int) -> Backlog:
        held.append(Backlog(token, count))
        return held[-1]

    yield make
    for each in held:
        each.close()


def post(secret: str, body: dict):
    started = time.monotonic()
    response = Client().post(
        "/api/v1/ingest",
        json.dumps(body).encode(),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    return response, time.monotonic() - started


def test_no_backlog_no_wait(limited):
    response, took = post(limited[1], make_batch())
    assert response.status_code == 202
    assert took < 0.5


def test_a_post_waits_while_the_backlog_is_over_its_limit_then_is_accepted(
    limited, draining, backlog
):
    backlog(limited[0], 4)
    response, took = post(limited[1], make_batch())
    assert response.status_code == 202, "accepted anyway: never refused for load"
    assert 1.4 <= took < 3


def test_a_post_goes_on_as_soon_as_the_workers_catch_up(limited, draining, backlog):
    waiting = backlog(limited[0], 4)

    def drain_later() -> None:
        time.sleep(0.4)
        waiting.drain()

    drainer = threading.Thread(target=drain_later)
    drainer.start()
    response, took = post(limited[1], make_batch())
    drainer.join()
    assert response.status_code == 202
    assert 0.3 <= took < 1.2


def test_bad_input_is_answered_at_once_whatever_the_backlog(limited, draining, backlog):
    backlog(limited[0], 4)
    response, took = post(limited[1], {"batch_id": "x", "node": "a/b"})
    assert response.status_code == 400
    assert took < 0.5


def test_zero_rows_turns_it_off(limited, draining, settings, backlog):
    settings.INGEST_BACKLOG_ROWS = 0
    backlog(limited[0], 4)
    response, took = post(limited[1], make_batch())
    assert response.status_code == 202
    assert took < 0.5


def test_no_wait_while_the_workers_are_not_draining(limited, settings, backlog):
    """A backlog nobody drains (workers stopped): waiting would only slow every agent.

    The session's live worker may still drain a task an earlier test left queued and set
    the heartbeat under the session's prefix mid-test; keys of this test's own prefix are
    ones no worker of ours writes, as with workers stopped."""
    from apps.core.redis import redis_client

    settings.REDIS_PREFIX = f"{settings.REDIS_PREFIX}-nobody-drains"
    redis_client().delete(f"{settings.REDIS_PREFIX}:ingest:drained-at")
    backlog(limited[0], 4)
    response, took = post(limited[1], make_batch())
    assert response.status_code == 202
    assert took < 0.5
