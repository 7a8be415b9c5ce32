"""A stop or resume whose end committed but whose run update did not (the web worker or
Postgres died between the two: fault 9 (b) can land there) is re-applied by the sweep,
judged from the run as it is, and never undoes what the run did since."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.commands.models import Command
from apps.commands.services import command_advance, command_issue, commands_sweep
from apps.runs.models import Run
from apps.runs.services import RUN_RESUME_AFTER_S
from tests.commands.conftest import World

pytestmark = pytest.mark.django_db


def succeeded(world: World, kind: str) -> Command:
    command, _ = command_issue(
        user=world.operator, cluster=world.cluster, kind=kind, run=world.run,
        idempotency_key=uuid.uuid4().hex,
    )  # fmt: skip
    for state in ("delivered", "accepted", "succeeded"):
        command = command_advance(command_id=command.pk, to_state=state)
    return command


def run_left(world: World, **fields) -> None:
    """The run as the lost update left it."""
    Run.objects.filter(pk=world.run.pk).update(**fields)


def run_now(world: World) -> tuple[str, object]:
    run = Run.objects.get(pk=world.run.pk)
    return run.state, run.ended_at


def test_a_stop_whose_run_update_was_lost_stops_the_run_once(world):
    stop = succeeded(world, "stop")
    run_left(world, state="running", ended_at=None)
    assert commands_sweep()["runs"] == 1
    assert run_now(world) == ("stopped", stop.finished_at)
    assert commands_sweep()["runs"] == 0, "a stopped run is left alone"


def test_a_resume_whose_run_update_was_lost_makes_the_run_running(world):
    succeeded(world, "stop")
    succeeded(world, "resume")
    run_left(world, state="stopped", ended_at=timezone.now() - timedelta(seconds=30))
    assert commands_sweep()["runs"] == 1
    assert run_now(world) == ("running", None)


def test_a_run_that_stepped_on_after_its_stop_keeps_running(world):
    stop = succeeded(world, "stop")
    later = stop.finished_at + timedelta(seconds=RUN_RESUME_AFTER_S + 5)
    run_left(world, state="running", ended_at=None, last_step_at=later)
    assert commands_sweep()["runs"] == 0
    assert run_now(world) == ("running", None)


def test_a_run_that_ended_after_its_resume_keeps_its_end(world):
    resume = succeeded(world, "resume")
    ended = resume.finished_at + timedelta(seconds=5)
    run_left(world, state="finished", ended_at=ended)
    assert commands_sweep()["runs"] == 0
    assert run_now(world) == ("finished", ended)


def test_a_stop_older_than_the_replay_window_is_not_replayed(world, settings):
    stop = succeeded(world, "stop")
    Command.objects.filter(pk=stop.pk).update(
        finished_at=timezone.now() - timedelta(seconds=settings.COMMANDS_RUN_REPLAY_S + 1)
    )
    run_left(world, state="running", ended_at=None)
    assert commands_sweep()["runs"] == 0
    assert run_now(world)[0] == "running"
