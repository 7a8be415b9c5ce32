"""Fault 8: beat (embedded in the periodic worker) killed with SIGKILL and restarted. Nothing
it schedules is lost or doubled: detector evaluations, rollups, the inbox sweep, command
expiry each catch up once, from the database's state, after the restart."""

import json
import signal
import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from apps.access.services import role_grant
from apps.alerts.models import DetectorPass
from apps.clusters.models import Node
from apps.commands.models import Command, CommandTransition
from apps.commands.services import command_issue
from apps.ingest.models import InboxBatch
from apps.runs.models import Run
from launcher.procs import wait_until
from tests.faults.ingest import (
    SAMPLES_PER_BATCH,
    STEPS_PER_BATCH,
    Sender,
    assert_stored_exactly_once,
    fault_batch,
    unprocessed,
)

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), pytest.mark.timeout(900)]

BEFORE, DURING, SWEPT, EXPIRING = 20, 20, 10, 10


def rolled_up(cluster) -> tuple[int, int, int]:
    """(samples, step reports) in this cluster's 1-minute rollups, and dirty ranges left."""
    nodes = list(Node.objects.filter(cluster=cluster).values_list("pk", flat=True))
    runs = list(Run.objects.filter(cluster=cluster).values_list("pk", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT coalesce(sum(n), 0) FROM history_sample_1m WHERE node_id = ANY(%s)),"
            " (SELECT coalesce(sum(n), 0) FROM history_step_1m WHERE run_id = ANY(%s)),"
            " (SELECT count(*) FROM history_dirty_series WHERE node_id = ANY(%s))"
            " + (SELECT count(*) FROM history_dirty_run WHERE run_id = ANY(%s))",
            [nodes, runs, nodes, runs],
        )
        return tuple(int(value) for value in cursor.fetchone())


def test_nothing_beat_schedules_is_lost_or_doubled_when_it_is_killed(
    live_stack, agent, agent_token, live_db
):
    token = agent_token[0]
    cluster = token.cluster
    Sender(agent, BEFORE, "beat-before").start().join(300)
    wait_until(lambda: unprocessed(token) == 0, 120, "the first batches stored")
    wait_until(lambda: DetectorPass.objects.filter(cluster=cluster).exists(), 60, "a pass")

    live_stack.periodic.kill(signal.SIGKILL)  # the periodic worker and its embedded beat
    killed = timezone.now()
    try:
        # while beat is dead: more data (dirty ranges to roll up), commands due to expire,
        # and inbox rows whose task was lost (only the sweep will ever store them)
        Sender(agent, DURING, "beat-during").start().join(300)
        wait_until(lambda: unprocessed(token) == 0, 120, "the ingest worker, without beat")
        operator = get_user_model().objects.create_user(f"op-{uuid.uuid4().hex[:6]}")
        role_grant(user=operator, cluster=cluster, role="operator")
        run = Run.objects.get(cluster=cluster, name="faults")
        commands = [
            command_issue(
                user=operator, cluster=cluster, kind="checkpoint", run=run,
                idempotency_key=f"beat-{index}",
            )[0]
            for index in range(EXPIRING)
        ]  # fmt: skip
        Command.objects.filter(pk__in=[c.pk for c in commands]).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        lost = [fault_batch("beat-swept", index) for index in range(SWEPT)]
        InboxBatch.objects.bulk_create(
            InboxBatch(token=token, batch_id=b["batch_id"], payload=_body(b), node=b["node"])
            for b in lost
        )
        time.sleep(5)  # beat's periods pass with nobody to send them
        assert unprocessed(token) == SWEPT
        live = Command.objects.filter(pk__in=[c.pk for c in commands], state="issued")
        assert live.count() == EXPIRING  # nothing expires them while beat is dead
    finally:
        live_stack.periodic.start()
    restarted = time.monotonic()

    batches = BEFORE + DURING + SWEPT
    wait_until(lambda: unprocessed(token) == 0, 120, "the sweep to store the lost batches")
    swept = time.monotonic() - restarted
    wait_until(lambda: rolled_up(cluster)[2] == 0, 120, "the rollups to consume every dirty range")
    rolled = time.monotonic() - restarted
    wait_until(
        lambda: DetectorPass.objects.get(cluster=cluster).ran_at > killed, 60, "an evaluation"
    )
    evaluated = time.monotonic() - restarted
    wait_until(
        lambda: not Command.objects.filter(pk__in=[c.pk for c in commands], state="issued"),
        60,
        "the expiry sweep",
    )
    expired = time.monotonic() - restarted
    print(
        f"\nfaults: after beat's restart: swept in {swept:.1f} s, rolled up {rolled:.1f} s,"
        f" evaluated {evaluated:.1f} s, {EXPIRING} commands expired {expired:.1f} s"
    )

    assert_stored_exactly_once(
        token,
        [f"beat-before-{i}" for i in range(BEFORE)]
        + [f"beat-during-{i}" for i in range(DURING)]
        + [b["batch_id"] for b in lost],
    )
    assert rolled_up(cluster) == (batches * SAMPLES_PER_BATCH, batches * STEPS_PER_BATCH, 0)
    for command in commands:
        moves = CommandTransition.objects.filter(command=command, to_state="expired").count()
        command.refresh_from_db()
        assert (command.state, moves) == ("expired", 1)
    # the evaluations go on, one pass record per cluster, none counted twice
    assert DetectorPass.objects.filter(cluster=cluster).count() == 1


def _body(batch: dict) -> bytes:
    return json.dumps(batch).encode()
