"""Run events are kept while their run lives and for RUN_EVENTS_RETENTION_DAYS after it is
over; within a run, each kind is capped at RUN_EVENTS_MAX_PER_RUN (never the newest
checkpoint of a tier and state)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from apps.clusters.models import Cluster, Node
from apps.runs.models import Run, RunEvent
from apps.runs.tasks import prune_events

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=120)  # past the 90-day default
YOUNG = NOW - timedelta(days=30)


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(cluster=Cluster.objects.create(name="ret"), name="node-01")


def run_of(node: Node, name: str, **times) -> Run:
    run = Run.objects.create(cluster=node.cluster, name=name)
    Run.objects.filter(pk=run.pk).update(**times)  # created_at included: auto_now_add
    return run


def events(node: Node, run: Run | None, kind: str, times: list[datetime], **data) -> list[int]:
    """Insert one event per time, in one statement; returns their ids."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_runevent (cluster_id, node_id, run_id, ts, kind, data)"
            " SELECT %s, %s, %s, t, %s, %s::jsonb FROM unnest(%s::timestamptz[]) t RETURNING id",
            [node.cluster_id, node.pk, run and run.pk, kind, _json(data), times],
        )
        return [row[0] for row in cursor.fetchall()]


def _json(data: dict) -> str:
    import json

    return json.dumps(data)


def remaining(ids: list[int]) -> set[int]:
    return set(RunEvent.objects.filter(pk__in=ids).values_list("pk", flat=True))


def test_it_deletes_the_events_of_runs_over_and_old_node_events_only(node):
    ended = run_of(node, "ended", created_at=OLD, last_step_at=OLD, ended_at=OLD, state="finished")
    # a run killed without run_end, silent since
    silent = run_of(node, "silent", created_at=OLD, last_step_at=OLD)
    ended_lately = run_of(
        node, "ended-lately", created_at=OLD, last_step_at=OLD, ended_at=YOUNG, state="failed"
    )
    # a long run still stepping: its old events are its timeline
    live = run_of(node, "live", created_at=OLD, last_step_at=NOW)
    gone = events(node, ended, "log", [OLD, OLD]) + events(node, silent, "error", [OLD])
    gone += events(node, None, "xid", [OLD])
    kept = events(node, ended_lately, "log", [OLD, YOUNG]) + events(node, live, "log", [OLD])
    kept += events(node, None, "ecc", [YOUNG]) + events(node, ended, "log", [YOUNG])

    result = prune_events()

    assert remaining(gone) == set()
    assert remaining(kept) == set(kept)
    assert result["expired"] == len(gone)
    assert result["dropped"] == {}


def test_it_caps_each_kind_of_a_run_and_keeps_the_newest_checkpoints(node, settings):
    settings.RUN_EVENTS_MAX_PER_RUN = 5
    run = run_of(node, "chatty", last_step_at=NOW)
    minutes = [NOW - timedelta(minutes=m) for m in range(12, 0, -1)]  # oldest first
    logs = events(node, run, "log", minutes)
    # the only durable completed checkpoint is the oldest of its kind: kept past the cap
    durable = events(node, run, "checkpoint", [NOW - timedelta(hours=5)], tier="durable",
                     state="completed")  # fmt: skip
    fast = events(node, run, "checkpoint", minutes[:7], tier="fast", state="completed")
    few = events(node, run, "error", minutes[:5])

    result = prune_events()

    assert remaining(logs) == set(logs[-5:])  # the newest five
    assert remaining(durable + fast) == set(durable + fast[-5:])
    assert remaining(few) == set(few)
    assert result["dropped"] == {f"{run.pk}/log": 7, f"{run.pk}/checkpoint": 2}
    assert prune_events()["dropped"] == {}  # nothing more to drop


def test_zero_turns_each_rule_off(node, settings):
    settings.RUN_EVENTS_RETENTION_DAYS = 0
    settings.RUN_EVENTS_MAX_PER_RUN = 0
    run = run_of(node, "ended", created_at=OLD, last_step_at=OLD, ended_at=OLD, state="finished")
    ids = events(node, run, "log", [OLD] * 3) + events(node, None, "xid", [OLD])
    assert prune_events() == {"expired": 0, "dropped": {}, "completions": 0}
    assert remaining(ids) == set(ids)
