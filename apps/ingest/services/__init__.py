"""The ingest path after the view: durable accept → enqueue → drain the inbox into storage."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

import orjson
import psycopg
from django import db
from django.conf import settings
from django.db import connection, transaction

from apps.clusters.models import AgentToken, Node
from apps.clusters.services import nodes_touch
from apps.core.db import server_cursor
from apps.core.tasks import queue_length, task_enqueue
from apps.history.services import runs_mark_dirty, series_mark_dirty
from apps.ingest.models import decode_payload
from apps.ingest.services.backpressure import drain_heartbeat
from apps.ingest.services.latency import batches_latency_observe
from apps.ingest.services.stored import StoredBatch, stored_batch_decode, stored_batch_from
from apps.ingest.services.wakeup import BATCH_PROCESS_TASK, batch_enqueue, drain_pending_clear
from apps.live.services import live_mark_dirty
from apps.runs.services import RunSeen, events_store, runs_touch, steps_store
from apps.telemetry.columns import Sample, columns_from_records
from apps.telemetry.services import health_update, samples_store

logger = logging.getLogger(__name__)

NODE_NAME_MAX = Node._meta.get_field("name").max_length


def batch_accept(
    *, token: AgentToken, batch_id: str, payload: bytes, encoding: str = "identity"
) -> int | None:
    """Commit the batch to the inbox and enqueue it; None when the batch_id was seen before.

    Runs in autocommit: when this returns an id, the row is committed, so the batch survives
    a Redis outage or a killed worker (the sweep re-enqueues it)."""
    with server_cursor() as cursor:
        cursor.execute(
            "INSERT INTO ingest_inboxbatch"
            " (token_id, batch_id, received_at, payload, payload_encoding)"
            " VALUES (%s, %s, now(), %s, %s)"
            " ON CONFLICT (token_id, batch_id) DO NOTHING RETURNING id",
            [token.pk, batch_id, payload, encoding],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    transaction.on_commit(lambda: batch_enqueue(inbox_id=row[0]))
    return row[0]


def inbox_drain_pending(*, first_id: int | None) -> DrainResult:
    """The drain task's work: clear the pending flag, then drain until the inbox is empty.

    The flag is cleared first, so a batch accepted from now on publishes a task of its own,
    which another worker process runs in parallel (the claim skips locked rows). Every row
    committed before the clear is drained here: by a transaction that claims fewer rows than
    INGEST_DRAIN_ROWS, all unlocked rows were claimed. The work per task is bounded
    (INGEST_DRAIN_TASK_ROUNDS transactions, INGEST_DRAIN_TASK_SECONDS) so that other tasks on
    the queue are not starved; a task that stops with rows left wakes another drain."""
    drain_pending_clear()
    limit = max(1, settings.INGEST_DRAIN_ROWS)
    deadline = time.monotonic() + settings.INGEST_DRAIN_TASK_SECONDS
    total = DrainResult()
    for _ in range(max(1, settings.INGEST_DRAIN_TASK_ROUNDS)):
        drained = inbox_drain(first_id=first_id, limit=limit)
        first_id = None
        total.add(drained)
        if drained.claimed < limit:
            return total
        if time.monotonic() >= deadline:
            break
    batch_enqueue(inbox_id=None)
    return total


@dataclass
class DrainResult:
    batches: int = 0
    samples: int = 0
    steps: int = 0
    events: int = 0
    nodes: set[tuple[int, int]] = field(default_factory=set)  # (cluster id, node id)
    claimed: int = 0  # rows claimed: stored (counted in `batches`) or quarantined

    def add(self, other: DrainResult) -> None:
        self.batches += other.batches
        self.samples += other.samples
        self.steps += other.steps
        self.events += other.events
        self.nodes |= other.nodes
        self.claimed += other.claimed


def inbox_drain(*, first_id: int | None, limit: int) -> DrainResult:
    """Store up to `limit` unprocessed inbox rows (`first_id` first) in one transaction.

    Rows locked by another worker are skipped, a processed row is never stored again, so
    running this twice for the same id, or concurrently, stores every batch exactly once.
    Every row claimed leaves processed: stored, or quarantined when it fails alone for a
    permanent reason (see `store_failure_is_permanent`), so a bad batch never blocks the
    others nor comes back. A transient error (connection, serialisation, deadlock) rolls
    the whole drain back and propagates, for the task to retry."""
    with transaction.atomic():
        rows = _claim(first_id=first_id, limit=limit)
        if not rows:
            return DrainResult()
        try:
            with transaction.atomic():  # the fast path: every row in one go
                stored = batches_store(batches=[_claimed(row) for row in rows])
            stored_ids = [row[0] for row in rows]
        except Exception as exc:
            if not store_failure_is_permanent(exc):
                raise
            stored, stored_ids = _rows_store_singly(rows=rows)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE ingest_inboxbatch SET processed_at = now(), payload = NULL"
                " WHERE id = ANY(%s)",
                [stored_ids],
            )
        stored.batches, stored.claimed = len(stored_ids), len(rows)
        transaction.on_commit(lambda: live_mark_dirty(nodes=stored.nodes))
        transaction.on_commit(drain_heartbeat)
        transaction.on_commit(lambda: batches_latency_observe(received=[r[2] for r in rows]))
    return stored


# Retrying these may succeed: the connection, the server or a concurrent transaction
# (serialisation failure 40001 and deadlock 40P01 are OperationalErrors) was at fault.
# Anything else raised while storing a batch comes back on every retry: its data is.
TRANSIENT_ERRORS = (
    db.OperationalError,
    db.InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)


def store_failure_is_permanent(exc: Exception) -> bool:
    return not isinstance(exc, TRANSIENT_ERRORS)


def _claimed(row: tuple) -> ClaimedBatch:
    return ClaimedBatch(
        cluster_id=row[1],
        received_at=row[2],
        body=stored_batch_decode(decode_payload(bytes(row[3]), row[4])),
    )


def _rows_store_singly(*, rows: list[tuple]) -> tuple[DrainResult, list[int]]:
    """Store each row in a savepoint of its own and quarantine those that fail alone."""
    total, stored_ids = DrainResult(), []
    for row in rows:
        result = _row_store(row=row)
        if result is None:
            continue
        stored_ids.append(row[0])
        total.add(result)
    return total, stored_ids


def _row_store(*, row: tuple) -> DrainResult | None:
    """Store one row in a savepoint of its own; None when it failed and was quarantined."""
    try:
        with transaction.atomic():
            return batches_store(batches=[_claimed(row)])
    except Exception as exc:
        if not store_failure_is_permanent(exc):
            raise
        _quarantine(row=row, error=exc)
    return None


ERROR_MAX_CHARS = 2000


def _quarantine(*, row: tuple, error: Exception) -> None:
    message = f"{type(error).__name__}: {error}".replace("\x00", "\\x00")[:ERROR_MAX_CHARS]
    logger.warning("inbox row %s quarantined: %s", row[0], message)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ingest_inboxbatch SET processed_at = now(), quarantined_at = now(),"
            " error = %s, node = %s WHERE id = %s",
            [message, _node_name(row), row[0]],
        )


def _node_name(row: tuple) -> str:
    """The batch's node name, when the body yields a storable one (else "")."""
    try:
        name = orjson.loads(decode_payload(bytes(row[3]), row[4])).get("node")
    except Exception:  # an unreadable body: the error says why
        return ""
    if isinstance(name, str) and len(name) <= NODE_NAME_MAX and "\x00" not in name:
        return name
    return ""


def batches_release(*, ids: list[int]) -> list[int]:
    """Take these batches out of quarantine and enqueue them again (after a fix); returns
    the ids released. A batch that fails again is quarantined again."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ingest_inboxbatch SET processed_at = NULL, quarantined_at = NULL,"
            " error = '', node = '' WHERE id = ANY(%s) AND quarantined_at IS NOT NULL"
            " RETURNING id",
            [list(ids)],
        )
        released = sorted(row[0] for row in cursor.fetchall())
    for inbox_id in released:
        transaction.on_commit(lambda inbox_id=inbox_id: batch_enqueue(inbox_id=inbox_id))
    return released


@dataclass(frozen=True)
class ClaimedBatch:
    cluster_id: int
    received_at: datetime
    body: StoredBatch

    @classmethod
    def of(cls, cluster_id: int, received_at: datetime, body: dict) -> ClaimedBatch:
        """A batch from its body as parsed JSON (as the contract's objects)."""
        return cls(cluster_id, received_at, stored_batch_from(body))


def batches_store(*, batches: list[ClaimedBatch]) -> DrainResult:
    """Store validated batches: nodes, runs, sample chunks, latest health, steps, events.

    Runs inside the caller's transaction; each table gets one statement for all batches."""
    node_ids = nodes_touch(
        seen={(b.cluster_id, b.body.node): (b.received_at, b.body.node_info) for b in batches},
        # a batch without a run comes from a node agent: only such nodes can go missing
        agents={(b.cluster_id, b.body.node) for b in batches if not b.body.run},
    )
    runs_seen: dict[tuple[int, str], RunSeen] = defaultdict(RunSeen)
    for batch in batches:
        if batch.body.run:
            run = runs_seen[batch.cluster_id, batch.body.run]
            for step in batch.body.steps:
                run.add_step(step)
    run_ids = runs_touch(seen=runs_seen)

    samples_by_node: list[tuple[int, list[Sample]]] = []
    steps, events = [], []
    for batch in batches:
        node_id = node_ids[batch.cluster_id, batch.body.node]
        run_id = run_ids.get((batch.cluster_id, batch.body.run or ""))
        samples_by_node.append((node_id, batch.body.samples))
        steps.extend((run_id, node_id, step) for step in batch.body.steps)
        events.extend((batch.cluster_id, node_id, run_id, event) for event in batch.body.events)
    result = DrainResult(nodes={(key[0], node_id) for key, node_id in node_ids.items()})
    series = columns_from_records(samples_by_node)
    samples = samples_store(series=series)
    series_mark_dirty(ranges=samples.ranges)
    health_update(series=series)
    stored_steps = steps_store(steps=steps)
    runs_mark_dirty(ranges=stored_steps.ranges)
    result.samples, result.steps = samples.count, stored_steps.count
    result.events = events_store(events=events)
    return result


_CLAIM_SQL = """
SELECT b.id, t.cluster_id, b.received_at, b.payload, b.payload_encoding
FROM ingest_inboxbatch b JOIN clusters_agenttoken t ON t.id = b.token_id
WHERE b.processed_at IS NULL {condition}
ORDER BY b.id LIMIT %s
FOR UPDATE OF b SKIP LOCKED
"""


def _claim(*, first_id: int | None, limit: int) -> list[tuple]:
    with server_cursor() as cursor:
        rows: list[tuple] = []
        if first_id is not None:
            cursor.execute(_CLAIM_SQL.format(condition="AND b.id = %s"), [first_id, 1], binary=True)
            rows = cursor.fetchall()
        if limit > len(rows):
            cursor.execute(
                _CLAIM_SQL.format(condition="AND b.id <> %s"),
                [first_id or 0, limit - len(rows)],
                binary=True,
            )
            rows += cursor.fetchall()
    return rows


def inbox_sweep(*, older_than_s: float, limit: int = 10_000, queue: str | None = None) -> int:
    """Enqueue tasks for inbox rows left unprocessed (lost task, broker down); returns how
    many tasks it sent.

    Every task drains up to INGEST_DRAIN_ROWS of the oldest rows, so the rows need one task
    per that many, less the tasks already waiting in the queue: a backlog is not doubled at
    every sweep (the sweep runs on its own worker, on time however long the queue is)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM ingest_inboxbatch WHERE processed_at IS NULL"
            " AND received_at < now() - make_interval(secs => %s) ORDER BY id LIMIT %s",
            [older_than_s, limit],
        )
        ids = [row[0] for row in cursor.fetchall()]
    if not ids:
        return 0
    per_task = max(1, settings.INGEST_DRAIN_ROWS)
    queue = queue or settings.CELERY_TASK_DEFAULT_QUEUE
    try:
        waiting = queue_length(queue)
    except Exception:  # the broker is down: sending will fail too, and the next sweep retries
        logger.warning("inbox sweep: broker unavailable, %d rows wait", len(ids))
        return 0
    firsts = ids[::per_task][: max(0, -(-len(ids) // per_task) - waiting)]
    for inbox_id in firsts:
        task_enqueue(BATCH_PROCESS_TASK, inbox_id, queue=queue)
    return len(firsts)
