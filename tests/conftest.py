"""Shared fixtures: the real stack (ASGI server, Celery worker + beat, live publisher)
on the test database and Redis, agent tokens, and an HTTP client for the agent API."""

from __future__ import annotations

import gzip
import json
import time
import uuid

import httpx
import pytest
from django.conf import settings
from django.db import connection

from apps.clusters.services import token_issue
from apps.ingest.models import InboxBatch
from tests.stackproc import Stack, database_url


def _flush_retrying_deadlocks() -> None:
    """pytest-django empties every table after a transactional test with `flush` (one
    TRUNCATE of all tables). The live stack's workers keep running their periodic passes on
    the same database, and a pass holding one table's lock while asking for another's can
    deadlock with the TRUNCATE; Postgres then aborts one side. When that side is the flush,
    try again: the pass has rolled back or finished by then."""
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_retrying(self, *args, **options):
        for attempt in range(3):
            try:
                return handle(self, *args, **options)
            except Exception as error:  # CommandError wraps the database's error
                cause = error.__cause__ or error
                if attempt == 2 or "deadlock" not in str(cause).lower():
                    raise
                time.sleep(0.2)

    flush.Command.handle = handle_retrying


# Tables the flush leaves alone. The audit log refuses TRUNCATE (a trigger): it keeps every
# test's entries, so a test reading it looks at its own only (its cluster, actor, target).
FLUSH_KEPT_TABLES = frozenset({"audit_auditentry"})


def _flush_keeping_the_audit_log() -> None:
    """Django's sql_flush (the one statement `flush` runs) without FLUSH_KEPT_TABLES."""
    from django.core.management.commands import flush

    def sql_flush(style, connection, reset_sequences=True, allow_cascade=False):
        tables = connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        kept = [table for table in tables if table not in FLUSH_KEPT_TABLES]
        return connection.ops.sql_flush(
            style, kept, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )

    flush.sql_flush = sql_flush


_flush_retrying_deadlocks()
_flush_keeping_the_audit_log()


def pytest_sessionfinish(session, exitstatus) -> None:
    """On the embedded default (no DATABASE_URL / REDIS_URL), stop the embedded Postgres and
    Redis that this session started, so that `make test` leaves no server behind; servers it
    found running (a developer's `make run`) are left alone. External services: a no-op."""
    from opsboard.embedded import stop_started

    stop_started()


def stack_env(**extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "OPSBOARD_REDIS_PREFIX": settings.REDIS_PREFIX,
        "DEBUG": "true",
        "INGEST_SWEEP_INTERVAL": "1",
        "INGEST_SWEEP_AGE": "2",
        "METRICS_TOKEN": "test-scrape-token",  # tests/metrics/scrape.py
        **extra,
    }


@pytest.fixture(scope="session")
def live_stack(django_db_setup, django_db_blocker):
    """One stack for the whole session, on the test database (tests using it must be
    transactional so that the worker sees their rows)."""
    with django_db_blocker.unblock():
        stack = Stack(stack_env()).start()
    yield stack
    stack.stop()


@pytest.fixture
def live_db(transactional_db):
    """A transactional test; the sample chunk table (not a Django model) is emptied after.

    Teardown first waits for the workers to drain the inbox: the flush that follows
    truncates every table, and doing that under a worker's open transaction deadlocks."""
    yield
    deadline = time.monotonic() + 60
    while InboxBatch.objects.filter(processed_at__isnull=True).exists():
        if time.monotonic() > deadline:
            break  # the flush will still empty the tables
        time.sleep(0.1)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE telemetry_chunk")


@pytest.fixture
def agent_token(live_db):
    """(token model, secret) for a fresh cluster."""
    return token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="test")


class AgentClient:
    """Talks to the ingest API as an agent would (JSON or gzip bodies, bearer token)."""

    def __init__(self, base_url: str, secret: str) -> None:
        self.base_url, self.secret = base_url, secret
        self.http = httpx.Client(base_url=base_url, timeout=30)

    def post(
        self,
        batch: dict | bytes,
        *,
        gzip_body: bool = False,
        secret: str | None = None,
        headers: dict | None = None,
    ) -> httpx.Response:
        body = batch if isinstance(batch, bytes) else json.dumps(batch).encode()
        all_headers = {
            "Authorization": f"Bearer {secret or self.secret}",
            "Content-Type": "application/json",
            **(headers or {}),
        }
        if gzip_body:
            body = gzip.compress(body)
            all_headers["Content-Encoding"] = "gzip"
        return self.http.post("/api/v1/ingest", content=body, headers=all_headers)

    def get(self, path: str, **params) -> httpx.Response:
        return self.http.get(
            path, params=params, headers={"Authorization": f"Bearer {self.secret}"}
        )


@pytest.fixture
def agent(live_stack, agent_token):
    client = AgentClient(live_stack.url, agent_token[1])
    yield client
    client.http.close()


def make_batch(
    batch_id: str | None = None,
    node: str = "node-01",
    samples: int = 10,
    steps: int = 0,
    run: str | None = None,
    ts: float | None = None,
    **extra,
) -> dict:
    """A valid batch: `samples` gpu.util readings (one per second) and `steps` step reports."""
    ts = time.time() if ts is None else ts
    batch = {
        "batch_id": batch_id or uuid.uuid4().hex,
        "node": node,
        "samples": [
            {"ts": ts - samples + i, "metric": "gpu.util", "gpu": i % 8, "value": float(i % 100)}
            for i in range(samples)
        ],
    }
    if steps:
        batch["run"] = run or "run-1"
        batch["steps"] = [
            {
                "ts": ts,
                "rank": rank,
                "step": 100,
                "step_time": 0.8,
                "compute_time": 0.6,
                "comm_wait": 0.15,
                "data_time": 0.04,
                "h2d_time": 0.01,
                "tokens": 1000,
            }
            for rank in range(steps)
        ]
    batch.update(extra)
    return batch
