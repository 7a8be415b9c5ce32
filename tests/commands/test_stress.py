"""1,000 commands under racing operators (each key sent by four at once), dropped acks,
repeated acks and restarted agents acking again in parallel: every command ends in exactly
one terminal state, reached by one transition. Bounded in time: a thread still running at its
deadline (a lock that never comes free) fails the test instead of hanging the suite; how fast
commands move is measured by bench/commands.py, not asserted here."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import timedelta

from django.db import connection
from django.utils import timezone

from apps.commands.choices import TERMINAL_STATES
from apps.commands.models import Command, CommandTransition
from apps.commands.services import CommandConflict, command_ack, command_issue, commands_sweep

COMMANDS = 1000
OPERATORS = 3
AGENTS = 2
# per phase; the whole test takes 25–65 s on two busy cores
PHASE_DEADLINE_S = 240


def in_threads(count: int, work) -> None:
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            work(index)
        except BaseException as error:  # noqa: BLE001 - reported by the test below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + PHASE_DEADLINE_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), "a thread is stuck"
    assert not errors, errors[:3]


# what the agents do with command i: nothing (the ack was dropped), or a script of acks
SCRIPTS = [
    [],
    ["accepted", "accepted", "succeeded", "succeeded"],
    ["failed", "accepted"],
    ["accepted", "succeeded", "failed"],
    ["succeeded"],
]


def test_each_of_1000_commands_ends_in_exactly_one_terminal_state(world):
    keys = [f"stress-{i}" for i in range(COMMANDS)]

    def operator(index: int) -> None:
        order = keys if index % 2 == 0 else list(reversed(keys))
        for key in order:
            command_issue(user=world.operator, cluster=world.cluster, kind="stop", run=world.run,
                          idempotency_key=key)  # fmt: skip

    in_threads(OPERATORS, operator)
    commands = list(Command.objects.filter(cluster=world.cluster).order_by("idempotency_key"))
    assert len(commands) == COMMANDS

    def agent(index: int) -> None:
        # every agent (a restarted one acks again) runs every script, each from its own end
        mine = commands if index % 2 == 0 else list(reversed(commands))
        for command in mine:
            for state in SCRIPTS[int(command.idempotency_key.split("-")[1]) % len(SCRIPTS)]:
                # a move backwards, or another agent finished it first: 409, no change
                with contextlib.suppress(CommandConflict):
                    command_ack(command=command, state=state, actor_name=f"agent-{index}")

    in_threads(AGENTS, agent)
    # nobody acknowledged the dropped ones: they expire on beat's sweep
    Command.objects.filter(cluster=world.cluster).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    commands_sweep()

    states = dict(Command.objects.filter(cluster=world.cluster).values_list("pk", "state"))
    assert set(states.values()) <= TERMINAL_STATES
    expired = [c.pk for c in commands if int(c.idempotency_key.split("-")[1]) % 5 == 0]
    assert {states[pk] for pk in expired} == {"expired"}
    moves: dict = {}
    for pk, source, target in (
        CommandTransition.objects.filter(command__cluster=world.cluster)
        .order_by("command_id", "at", "id")
        .values_list("command_id", "from_state", "to_state")
    ):
        moves.setdefault(pk, []).append((source, target))
    for pk, chain in moves.items():
        # one unbroken chain from issued to the final state; exactly one terminal move
        assert chain[0] == ("", "issued")
        assert all(chain[i][1] == chain[i + 1][0] for i in range(len(chain) - 1)), chain
        assert sum(target in TERMINAL_STATES for _, target in chain) == 1
        assert chain[-1][1] == states[pk]
