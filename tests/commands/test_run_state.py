"""A run's state follows its stop and resume commands: a succeeded stop (the last of the
run's live stops) makes it `stopped`, a succeeded resume `running`; ingest's restart events
and fresh steps run a stopped run again, and the run_end of the job going down because of
the stop leaves it stopped. A stopped run is not evaluated by the detectors."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from django.db import transaction

from apps.alerts.selectors import cluster_window
from apps.commands.services import command_ack, command_issue
from apps.runs.models import Run
from apps.runs.services import RunSeen, run_mark_stopped, runs_end, runs_touch


def issue(world, kind: str, node=None, **fields):
    return command_issue(
        user=world.operator, cluster=world.cluster, kind=kind, run=world.run, node=node,
        reason="maintenance window", idempotency_key=uuid.uuid4().hex, **fields,
    )[0]  # fmt: skip


def ack(command, state: str):
    return command_ack(command=command, state=state, actor_name="agent")


def run_state(world) -> str:
    return Run.objects.get(pk=world.run.pk).state


def ingest_events(world, *events: dict) -> None:
    with transaction.atomic():
        runs_end(events=[(world.run.pk, event) for event in events])


def test_a_succeeded_stop_stops_the_run(world):
    stop = issue(world, "stop")
    ack(stop, "accepted")
    assert run_state(world) == "running"
    ack(stop, "succeeded")
    run = Run.objects.get(pk=world.run.pk)
    assert run.state == "stopped" and run.ended_at is not None


def test_a_failed_stop_leaves_the_run_running(world):
    stop = issue(world, "stop")
    ack(stop, "failed")
    assert run_state(world) == "running"


def test_a_run_stopped_node_by_node_is_stopped_when_the_last_stop_succeeded(world):
    first, second = issue(world, "stop", node=world.node1), issue(world, "stop", node=world.node2)
    ack(first, "succeeded")
    assert run_state(world) == "running"  # node-02's supervisor has not acked yet
    ack(second, "succeeded")
    assert run_state(world) == "stopped"


def test_a_succeeded_resume_runs_the_run_again(world):
    ack(issue(world, "stop"), "succeeded")
    resume = issue(world, "resume")
    ack(resume, "accepted")
    assert run_state(world) == "stopped"
    ack(resume, "succeeded")
    run = Run.objects.get(pk=world.run.pk)
    assert run.state == "running" and run.ended_at is None


def test_a_stopped_run_is_not_evaluated(world):
    assert [run.run for run in cluster_window(cluster=world.cluster, now=time.time()).runs] == [
        "run-1"
    ]
    ack(issue(world, "stop"), "succeeded")
    assert cluster_window(cluster=world.cluster, now=time.time()).runs == ()


def test_the_run_end_of_the_job_going_down_leaves_it_stopped(world):
    stop = issue(world, "stop")
    ack(stop, "succeeded")
    # the reporter's run_end, sent while the job went down, arrives after the ack
    ingest_events(world, {"kind": "run_end", "ts": time.time() - 1, "state": "failed"})
    assert run_state(world) == "stopped"


def test_a_stop_acked_after_the_job_s_run_end_arrived_still_stops_the_run(world):
    stop = issue(world, "stop")
    ingest_events(world, {"kind": "run_end", "ts": time.time(), "state": "failed"})
    assert run_state(world) == "failed"
    ack(stop, "succeeded")
    assert run_state(world) == "stopped"


def test_a_run_that_ended_before_the_stop_keeps_its_end(world):
    ingest_events(world, {"kind": "run_end", "ts": time.time() - 30, "state": "finished"})
    ack(issue(world, "stop"), "succeeded")
    assert run_state(world) == "finished"


def test_a_restart_event_after_the_stop_runs_it_again(world):
    ack(issue(world, "stop"), "succeeded")
    ingest_events(world, {"kind": "restart", "ts": time.time() - 600})  # before: replayed
    assert run_state(world) == "stopped"
    ingest_events(world, {"kind": "restart", "ts": time.time() + 1})
    assert run_state(world) == "running"


def test_steps_well_after_the_stop_run_it_again(world):
    ack(issue(world, "stop"), "succeeded")
    key = (world.cluster.pk, "run-1")
    soon = datetime.now(UTC) + timedelta(seconds=5)  # spooled steps of the stopping job
    step = {"rank": 0, "step": 101, "ts": soon.timestamp()}
    seen = RunSeen()
    seen.add_step(step)
    with transaction.atomic():
        runs_touch(seen={key: seen})
    assert run_state(world) == "stopped"
    later = RunSeen()
    later.add_step({"rank": 0, "step": 102, "ts": time.time() + 120})
    with transaction.atomic():
        runs_touch(seen={key: later})
    assert run_state(world) == "running"


def test_of_two_racing_stops_one_changes_the_run(world):
    since = datetime.now(UTC) - timedelta(seconds=1)
    assert run_mark_stopped(run_id=world.run.pk, since=since) is True
    assert run_mark_stopped(run_id=world.run.pk, since=since) is False
