"""Finished commands go COMMANDS_RETENTION_DAYS after they finished, with their transitions
and a drain's steps; a live command, or a drain with a live or young step, stays."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from apps.clusters.models import Cluster, Node
from apps.commands.models import Command, CommandTransition
from apps.commands.tasks import prune
from apps.runs.models import Run

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=200)


@pytest.fixture
def place(db) -> tuple[Run, Node]:
    cluster = Cluster.objects.create(name="ret-commands")
    return Run.objects.create(cluster=cluster, name="r"), Node.objects.create(
        cluster=cluster, name="n"
    )


def command(place, kind: str, state: str, *, issued=OLD, finished=None, parent=None) -> Command:
    run, node = place
    made = Command.objects.create(
        cluster=run.cluster, kind=kind, state=state, idempotency_key=uuid.uuid4().hex,
        run=None if kind in ("drain", "cordon") else run, node=node, parent=parent,
        issued_at=issued, expires_at=issued + timedelta(minutes=10), finished_at=finished,
    )  # fmt: skip
    CommandTransition.objects.create(command=made, to_state="issued", at=issued)
    if finished:
        CommandTransition.objects.create(
            command=made, from_state="issued", to_state=state, at=finished
        )
    return made


def test_it_deletes_old_finished_commands_with_their_transitions_and_steps(place):
    young = NOW - timedelta(days=10)
    gone = [
        command(place, "checkpoint", "succeeded", finished=OLD),
        command(place, "stop", "expired", finished=OLD),
    ]
    drain = command(place, "drain", "succeeded", finished=OLD)
    gone += [drain, command(place, "stop", "succeeded", finished=OLD, parent=drain)]
    kept = [
        command(place, "checkpoint", "failed", finished=young),
        command(place, "cordon", "issued"),  # live, and years overdue: never deleted
        command(place, "checkpoint", "accepted"),
    ]
    # a drain whose step finished lately (or is live) stays, steps and all
    held = command(place, "drain", "failed", finished=OLD)
    kept += [held, command(place, "checkpoint", "succeeded", finished=young, parent=held)]
    live_parent = command(place, "drain", "accepted")
    kept += [live_parent, command(place, "stop", "failed", finished=OLD, parent=live_parent)]

    deleted = prune()
    with connection.cursor() as cursor:  # the deferred foreign keys hold (as at a commit)
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")

    left = set(Command.objects.values_list("pk", flat=True))
    assert left == {made.pk for made in kept}
    transitions = set(CommandTransition.objects.values_list("command_id", flat=True))
    assert transitions == left
    assert deleted == 3  # top-level: the two run commands and the drain (its step with it)


def test_zero_keeps_them_forever(place, settings):
    settings.COMMANDS_RETENTION_DAYS = 0
    made = command(place, "checkpoint", "succeeded", finished=OLD - timedelta(days=900))
    assert prune() == 0
    assert Command.objects.filter(pk=made.pk).exists()
