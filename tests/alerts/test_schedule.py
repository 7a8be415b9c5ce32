"""Detection runs on time: beat's periodic work has its own queue and worker, so a backlog of
thousands of ingest tasks never delays it, and a pass that expires is logged and counted."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from django.conf import settings

from apps.alerts.models import DetectorPass
from apps.alerts.selectors import periodic_skips
from apps.core.redis import redis_client
from apps.ingest.models import InboxBatch
from launcher.commands import server_commands
from launcher.procs import wait_until
from tests.conftest import make_batch
from tests.stackproc import LOG_DIR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

BACKLOG = 3000


def ran_at(cluster) -> float | None:
    found = DetectorPass.objects.filter(cluster=cluster).first()
    return found.ran_at.timestamp() if found else None


def ingest_queue_length() -> int:
    return redis_client().llen(settings.CELERY_TASK_DEFAULT_QUEUE)


def test_the_launcher_runs_beats_tasks_on_a_worker_of_their_own(tmp_path):
    commands = server_commands(
        host="127.0.0.1",
        port=1,
        ws_port=2,
        web_workers=1,
        worker_concurrency=2,
        queue="pfx",
        beat_schedule=tmp_path / "beat",
    )
    worker, periodic = commands["worker"], commands["periodic"]
    assert worker[worker.index("-Q") + 1] == "pfx"
    assert periodic[periodic.index("-Q") + 1] == "pfx.periodic"
    assert "beat" in commands and "-B" not in periodic
    # the routes send every beat task to that queue (the settings' prefix, like the default)
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert f"{settings.REDIS_PREFIX}.periodic" == settings.CELERY_PERIODIC_QUEUE
    assert {
        task: settings.CELERY_TASK_ROUTES.get(task, {}).get("queue") for task in scheduled
    } == dict.fromkeys(scheduled, settings.CELERY_PERIODIC_QUEUE)
    assert "ingest.batch_process" not in settings.CELERY_TASK_ROUTES


def test_evaluation_runs_every_period_under_an_ingest_backlog_and_finds_a_fault(agent, agent_token):
    from apps.ingest.tasks import batch_process

    token = agent_token[0]
    assert agent.post(make_batch(node="busy-01", samples=2)).status_code == 202
    wait_until(lambda: ran_at(token.cluster), 30, "the first detector pass")

    # Thousands of queued ingest tasks (each drains up to INGEST_DRAIN_ROWS rows, so most
    # find nothing left: a long queue, as ~60 ingest tasks a second make one).
    rows = InboxBatch.objects.bulk_create(
        InboxBatch(
            token=token,
            batch_id=f"backlog-{i}",
            node="busy-01",
            payload=orjson.dumps(make_batch(batch_id=f"backlog-{i}", node="busy-01", samples=1)),
        )
        for i in range(BACKLOG)
    )
    try:
        for row in rows:
            batch_process.apply_async((row.pk,))
        fault = make_batch(node="busy-02", samples=1)
        fault["events"] = [{"ts": time.time(), "kind": "xid", "gpu": 1, "code": 79}]
        assert agent.post(fault).status_code == 202
        fault_at = time.time()

        passes, deadline = set(), time.monotonic() + 30
        while time.monotonic() < deadline and len(passes) < 3:
            if ingest_queue_length() < BACKLOG / 2:
                # the workers got through half of it (a task that finds its rows stored
                # takes a few ms): queue more, so that the queue stays long for 3 periods
                for _ in range(BACKLOG // 2):
                    batch_process.apply_async((None,))
            at, queued = ran_at(token.cluster), ingest_queue_length()
            if queued > BACKLOG / 10 and at is not None and at > fault_at:
                passes.add(at)  # a pass that ran while the ingest queue was long
            time.sleep(0.2)
        assert len(passes) >= 3, f"passes during the backlog: {sorted(passes)}"
        period = settings.ALERT_EVALUATE_INTERVAL
        ordered = sorted(passes)
        assert max(b - a for a, b in zip(ordered, ordered[1:], strict=False)) < 3 * period

        def xid_alert():
            return [
                a for a in agent.get("/api/v1/alerts", node="busy-02").json()["alerts"]
                if a["kind"] == "xid"
            ]  # fmt: skip

        wait_until(xid_alert, 60, "the xid alert under the backlog")
        # xid's time to detect: stored, then the next pass (the backlog holds the row back)
        assert xid_alert()[0]["opened_at"] - fault_at < 60
    finally:
        wait_until(
            lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
            120,
            "the backlog to drain",
        )
        # what is still queued finds its rows stored: drop it rather than slow later tests
        redis_client().delete(settings.CELERY_TASK_DEFAULT_QUEUE)


def test_an_expired_periodic_pass_is_logged_and_counted(live_stack, live_db):
    from apps.alerts.tasks import evaluate_all

    key = "alerts.evaluate_all:expired"
    before = periodic_skips().get(key, 0)
    task_id = uuid.uuid4().hex
    evaluate_all.apply_async(expires=datetime.now(UTC) - timedelta(seconds=1), task_id=task_id)
    wait_until(lambda: periodic_skips().get(key, 0) > before, 30, "the expired pass counted")
    log = LOG_DIR / f"{live_stack.name}-periodic.log"
    assert "alerts.evaluate_all expired in the queue" in log.read_text(errors="replace")
