"""The agent's command poller against a loopback server speaking the agent protocol."""

from __future__ import annotations

import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from opsboard_agent.commands import CommandClient, CommandPoller
from tests.agent.command_stub import TOKEN, CommandStub
from tests.agent.conftest import closed_port_url


@pytest.fixture
def stub(loopback):
    return CommandStub(loopback)


def poller_for(url: str, handled: list, *, kinds=("stop",), run=None, wait=1.0, handle=None):
    client = CommandClient(server=url, token=TOKEN)

    def record(command):
        handled.append(command)
        poller.ack(command, "accepted")
        poller.ack(command, "succeeded", "done")

    poller = CommandPoller(
        client,
        node="node-01",
        run=run,
        kinds=kinds,
        wait=wait,
        handle=handle or record,
        backoff_base=0.05,
        backoff_cap=0.2,
    )
    return poller


def test_it_long_polls_with_the_token_and_acks_forward(stub):
    handled: list = []
    poller = poller_for(stub.url, handled).start()
    try:
        command_id = stub.issue("stop", run="run-1")
        stub.wait_for(lambda: stub.states[command_id] == "succeeded", 10, "succeeded")
    finally:
        poller.stop()
    assert [c.id for c in handled] == [command_id]
    assert handled[0].kind == "stop" and handled[0].run == "run-1"
    # A poll answered before the acks landed offers it again: acked again, nothing more.
    states = [a["state"] for a in stub.acks_of(command_id)]
    assert states[:2] == ["accepted", "succeeded"] and set(states[2:]) <= {"succeeded"}
    assert stub.acks_of(command_id)[1]["detail"] == "done"
    query = parse_qs(urlsplit(stub.polls[0].path).query)
    assert query == {"node": ["node-01"], "wait": ["1"], "kinds": ["stop"]}


def test_a_redelivered_command_is_acked_again_not_executed_twice(loopback):
    stub = CommandStub(loopback, redeliver=True)  # a server that keeps offering it
    handled: list = []
    poller = poller_for(stub.url, handled).start()
    try:
        command_id = stub.issue("stop", run="run-1")
        stub.wait_for(lambda: len(stub.acks_of(command_id)) >= 4, 15, "repeated acks")
    finally:
        poller.stop()
    assert len(handled) == 1
    states = [a["state"] for a in stub.acks_of(command_id)]
    assert states[:2] == ["accepted", "succeeded"] and set(states[2:]) == {"succeeded"}


def test_it_reconnects_with_backoff_when_the_server_is_away_or_overloaded(stub):
    handled: list = []
    poller = poller_for(closed_port_url(), handled)
    poller.start()
    try:
        time.sleep(0.5)
        assert poller.failures >= 2 and not handled
        stub.fail_polls = 2
        poller.client.server = stub.url  # the server comes back (overloaded at first)
        command_id = stub.issue("stop", run="run-1")
        stub.wait_for(lambda: stub.states[command_id] == "succeeded", 10, "succeeded")
    finally:
        poller.stop()
    assert stub.fail_polls == 0 and len(handled) == 1 and poller.failures == 0


def test_it_leaves_other_kinds_and_runs_to_other_processes_without_spinning(stub):
    handled: list = []
    poller = poller_for(stub.url, handled, kinds=("checkpoint",), run="run-1").start()
    try:
        other_kind = stub.issue("stop", run="run-1")
        other_run = stub.issue("checkpoint", run="run-2")
        time.sleep(2.0)
        mine = stub.issue("checkpoint", run="run-1")
        stub.wait_for(lambda: stub.states[mine] == "succeeded", 10, "succeeded")
    finally:
        poller.stop()
    assert [c.id for c in handled] == [mine]
    assert not stub.acks_of(other_kind) and not stub.acks_of(other_run)
    # The pending commands answer each poll at once; the poller pauses instead of spinning.
    assert len(stub.polls) <= 6


def test_a_handler_that_raises_fails_its_command(stub):
    def broken(command):
        raise RuntimeError("no such job")

    poller = poller_for(stub.url, [], handle=broken).start()
    try:
        command_id = stub.issue("stop", run="run-1")
        stub.wait_for(lambda: stub.states[command_id] == "failed", 10, "failed")
    finally:
        poller.stop()
    assert stub.acks_of(command_id)[-1]["detail"] == "RuntimeError: no such job"


def test_a_wrong_token_is_retried_not_fatal(stub):
    client = CommandClient(server=stub.url, token="wrong")
    seen = threading.Event()
    poller = CommandPoller(
        client, node="n", kinds=("stop",), handle=lambda c: seen.set(), wait=1, backoff_base=0.05
    ).start()
    try:
        time.sleep(0.5)
        assert poller.failures >= 1 and not seen.is_set()
        client.token = TOKEN  # a rotated token file read again
        stub.issue("stop")
        assert seen.wait(10)
    finally:
        poller.stop()
