"""Two runs on one node: each run's poller takes only its own run's commands (`run=` on the
poll), on the WSGI and the ASGI server alike, and the agent's poller sends its run; a poll
without `run` still takes every run the node serves (agents before the extension)."""

from __future__ import annotations

import pytest

from apps.commands.models import Command
from apps.runs.models import Run
from opsboard_agent.commands import CommandClient
from tests.commands.conftest import client, issue, serve, world  # noqa: F401
from tests.commands.test_longpoll import asgi

pytestmark = pytest.mark.usefixtures("live_stack")


@pytest.fixture
def two_runs(world):  # noqa: F811
    """run-2 beside run-1 on node-01."""
    run2 = Run.objects.create(cluster=world.cluster, name="run-2")
    serve(run2, world.node1, ranks=range(0, 2))
    return world


def ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [command["id"] for command in response.json()["commands"]]


@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_a_runs_poller_takes_only_its_runs_commands(live_stack, two_runs, server):
    with client(live_stack, two_runs.operator_secret) as operator:
        for_run2 = issue(operator, kind="checkpoint", run="run-2").json()["id"]
    open_client = client if server == "wsgi" else asgi
    with open_client(live_stack, two_runs.agent_secret) as agent:
        poll = {"node": "node-01", "kinds": "checkpoint"}
        assert ids(agent.get("/api/v1/commands", params={**poll, "run": "run-1"})) == []
        assert Command.objects.get(pk=for_run2).state == "issued"  # left for run-2's poller
        assert ids(agent.get("/api/v1/commands", params={**poll, "run": "run-2"})) == [for_run2]
    assert Command.objects.get(pk=for_run2).state == "delivered"


def test_the_agents_poller_sends_its_run(live_stack, two_runs):
    with client(live_stack, two_runs.operator_secret) as operator:
        for_run1 = issue(operator, kind="checkpoint", run="run-1").json()["id"]
        for_run2 = issue(operator, kind="checkpoint", run="run-2").json()["id"]
    agent = CommandClient(server=live_stack.url, token=two_runs.agent_secret)
    got = agent.poll(node="node-01", wait=0, kinds=("checkpoint",), run="run-2")
    assert [command.id for command in got] == [for_run2]
    assert Command.objects.get(pk=for_run1).state == "issued"
    # an older agent, asking without run: every run the node serves, as before
    assert [c.id for c in agent.poll(node="node-01", wait=0, kinds=("checkpoint",))] == [for_run1]
