"""One state machine: forward only, a repeat is a no-op, backwards is refused; each real
move is one conditional UPDATE (racing callers move a command once) and one history row;
an idempotency key makes one command; overdue commands expire."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import close_old_connections
from django.utils import timezone

from apps.audit.models import AuditEntry
from apps.commands.models import Command, CommandTransition
from apps.commands.services import (
    CommandConflict,
    CommandDenied,
    command_advance,
    command_issue,
    commands_sweep,
)
from tests.commands.conftest import World


def checkpoint(world: World, key: str | None = None) -> tuple[Command, bool]:
    return command_issue(
        user=world.operator, cluster=world.cluster, kind="checkpoint", run=world.run,
        idempotency_key=key or uuid.uuid4().hex,
    )  # fmt: skip


def history(command: Command) -> list[tuple[str, str]]:
    return list(
        CommandTransition.objects.filter(command=command).values_list("from_state", "to_state")
    )


def test_it_moves_forward_and_records_each_transition(world):
    command, created = checkpoint(world)
    assert created and command.state == "issued"
    for state in ("delivered", "accepted", "succeeded"):
        command = command_advance(command_id=command.pk, to_state=state)
        assert command.state == state
    assert command.delivered_at and command.accepted_at and command.finished_at
    assert history(command) == [
        ("", "issued"),
        ("issued", "delivered"),
        ("delivered", "accepted"),
        ("accepted", "succeeded"),
    ]


def test_repeating_the_current_state_is_a_no_op(world):
    command, _ = checkpoint(world)
    first = command_advance(command_id=command.pk, to_state="accepted")
    again = command_advance(command_id=command.pk, to_state="accepted")
    assert again.state == "accepted" and again.accepted_at == first.accepted_at
    assert len(history(command)) == 2


@pytest.mark.parametrize(
    ("reached", "refused"),
    [("accepted", "delivered"), ("succeeded", "accepted"), ("failed", "succeeded"),
     ("expired", "succeeded"), ("delivered", "issued")],
)  # fmt: skip
def test_it_refuses_to_move_backwards_or_out_of_a_terminal_state(world, reached, refused):
    command, _ = checkpoint(world)
    command_advance(command_id=command.pk, to_state=reached)
    with pytest.raises(CommandConflict):
        command_advance(command_id=command.pk, to_state=refused)
    assert Command.objects.get(pk=command.pk).state == reached


def test_a_repeated_idempotency_key_returns_the_same_command(world):
    key = uuid.uuid4().hex
    first, created = checkpoint(world, key)
    second, created_again = checkpoint(world, key)
    assert created and not created_again and first.pk == second.pk
    assert Command.objects.filter(cluster=world.cluster).count() == 1


def racing(count: int, action) -> list:
    """Run `action()` in `count` threads released at once; their results or exceptions."""
    barrier, results = threading.Barrier(count), []

    def run():
        try:
            barrier.wait()
            results.append(action())
        except Exception as error:  # noqa: BLE001 - the test judges what each thread got
            results.append(error)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_racing_transitions_move_a_command_once(world):
    command, _ = checkpoint(world)
    command_advance(command_id=command.pk, to_state="accepted")
    # half of the racers say succeeded, half failed: exactly one terminal state wins
    states = iter(["succeeded", "failed"] * 4)
    targets = [next(states) for _ in range(8)]
    picks = iter(targets)
    lock = threading.Lock()

    def move():
        with lock:
            state = next(picks)
        return command_advance(command_id=command.pk, to_state=state)

    results = racing(8, move)
    final = Command.objects.get(pk=command.pk).state
    assert final in ("succeeded", "failed")
    assert history(command)[-1] == ("accepted", final) and len(history(command)) == 3
    assert all(
        (isinstance(r, Command) and r.state == final) or isinstance(r, CommandConflict)
        for r in results
    )


def test_racing_operators_with_one_key_make_one_command(world):
    key = uuid.uuid4().hex
    results = racing(8, lambda: checkpoint(world, key))
    assert Command.objects.filter(cluster=world.cluster).count() == 1
    assert sum(created for _, created in results) == 1


def test_a_viewer_is_denied_and_the_attempt_is_audited(world):
    from apps.access.models import ClusterRole

    viewer = ClusterRole.objects.get(cluster=world.cluster, role="viewer").user
    with pytest.raises(CommandDenied):
        command_issue(
            user=viewer, cluster=world.cluster, kind="stop", run=world.run,
            idempotency_key="k1",
        )  # fmt: skip
    assert not Command.objects.exists()
    entry = AuditEntry.objects.get(action="command.stop", cluster_id=world.cluster.pk)
    assert (entry.outcome, entry.actor_name, entry.target) == ("denied", "vik", "run:run-1")


def test_the_sweep_expires_overdue_live_commands_only(world):
    overdue, _ = checkpoint(world)
    delivered, _ = checkpoint(world)
    done, _ = checkpoint(world)
    fresh, _ = checkpoint(world)
    command_advance(command_id=delivered.pk, to_state="delivered")
    command_advance(command_id=done.pk, to_state="succeeded")
    past = timezone.now() - timedelta(seconds=1)
    Command.objects.exclude(pk=fresh.pk).update(expires_at=past)
    assert commands_sweep()["expired"] == 2
    states = dict(Command.objects.values_list("pk", "state"))
    assert states == {
        overdue.pk: "expired", delivered.pk: "expired", done.pk: "succeeded", fresh.pk: "issued"
    }  # fmt: skip
