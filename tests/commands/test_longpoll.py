"""The agents' long-poll on the live stack: held by the ASGI server (woken by Redis within a
second of an issue, by the database safety net otherwise), `kinds=` splitting one node's
commands between two pollers, the 307 from WSGI that the agent client follows, and held
polls leaving gunicorn's workers to ingest."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from apps.commands.models import Command
from apps.commands.services import command_create
from opsboard_agent.commands import CommandClient
from tests.commands.conftest import client, issue

pytestmark = pytest.mark.usefixtures("live_stack")


def asgi(live_stack, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{live_stack.ws_port}",
        timeout=40,
        headers={"Authorization": f"Bearer {secret}"},
    )


class HeldPoll(threading.Thread):
    """One poll on the ASGI server in a thread: its response and when it came."""

    def __init__(self, live_stack, secret: str, **params) -> None:
        super().__init__(daemon=True)
        self.live_stack, self.secret, self.params = live_stack, secret, params
        self.response: httpx.Response | None = None
        self.at = 0.0

    def run(self) -> None:
        with asgi(self.live_stack, self.secret) as agent:
            self.response = agent.get("/api/v1/commands", params=self.params)
            self.at = time.monotonic()

    def ids(self) -> list[str]:
        assert self.response is not None and self.response.status_code == 200
        return [command["id"] for command in self.response.json()["commands"]]


def test_a_poll_held_on_the_asgi_server_returns_within_a_second_of_an_issue(live_stack, world):
    poll = HeldPoll(live_stack, world.agent_secret, node="node-01", wait=20)
    poll.start()
    time.sleep(1.5)  # the poll is held
    assert poll.is_alive()
    with client(live_stack, world.operator_secret) as operator:
        issued_at = time.monotonic()
        created = issue(operator, kind="checkpoint", run="run-1")
    poll.join(30)
    assert created.status_code == 201
    assert poll.ids() == [created.json()["id"]]
    assert poll.response.json()["commands"][0]["state"] == "delivered"
    assert poll.at - issued_at < 1.0


def test_kinds_give_each_of_two_pollers_only_its_own(live_stack, world):
    stops = HeldPoll(live_stack, world.agent_secret, node="node-01", wait=20, kinds="stop,resume")
    checkpoints = HeldPoll(live_stack, world.agent_secret, node="node-01", wait=20,
                           kinds="checkpoint")  # fmt: skip
    stops.start()
    checkpoints.start()
    time.sleep(1.5)
    with client(live_stack, world.operator_secret) as operator:
        stop = issue(operator, kind="stop", run="run-1", node="node-01").json()
        stops.join(10)
        assert stops.ids() == [stop["id"]]
        assert checkpoints.is_alive()  # not woken by, nor handed, the stop
        checkpoint = issue(operator, kind="checkpoint", run="run-1", node="node-01").json()
        checkpoints.join(10)
    assert checkpoints.ids() == [checkpoint["id"]]


def test_a_command_of_a_kind_not_asked_for_stays_issued(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        stop = issue(operator, kind="stop", run="run-1", node="node-01").json()
    with asgi(live_stack, world.agent_secret) as agent:
        started = time.monotonic()
        answer = agent.get(
            "/api/v1/commands", params={"node": "node-01", "wait": 1, "kinds": "checkpoint"}
        )
        assert answer.json() == {"commands": []}
        assert 0.9 < time.monotonic() - started < 5
        assert Command.objects.get(pk=stop["id"]).state == "issued"
        answer = agent.get("/api/v1/commands", params={"node": "node-01", "kinds": "stop"})
    assert [c["id"] for c in answer.json()["commands"]] == [stop["id"]]


def test_an_empty_poll_on_the_asgi_server_answers_after_wait(live_stack, world):
    with asgi(live_stack, world.agent_secret) as agent:
        started = time.monotonic()
        response = agent.get("/api/v1/commands", params={"node": "node-01", "wait": 1})
    assert response.status_code == 200 and response.json() == {"commands": []}
    assert 0.9 < time.monotonic() - started < 5


def test_a_poll_for_a_host_not_allowed_is_refused_on_the_asgi_server_too(live_stack, world):
    with asgi(live_stack, world.agent_secret) as agent:
        response = agent.get(
            "/api/v1/commands", params={"node": "node-01"}, headers={"Host": "evil.example"}
        )
    assert response.status_code == 400
    assert not response.headers["content-type"].startswith("application/json")  # no list


def test_a_command_no_message_announced_is_found_by_the_safety_net(live_stack, world):
    poll = HeldPoll(live_stack, world.agent_secret, node="node-02", wait=20)
    poll.start()
    time.sleep(1.0)
    # Created below the service that publishes the wake-up: as if the message were lost.
    command, _ = command_create(
        cluster_id=world.cluster.pk, kind="checkpoint", run_id=world.run.pk,
        node_id=world.node2.pk, idempotency_key=uuid.uuid4().hex,
    )  # fmt: skip
    created_at = time.monotonic()
    poll.join(30)
    assert poll.ids() == [str(command.pk)]
    assert poll.at - created_at < 5.0 + 1.5  # COMMANDS_RECHECK_S and a margin


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"node": "node-01", "wait": 31}, "wait"),
        ({"node": "node-01", "wait": "soon"}, "wait"),
        ({"node": "node-01", "wait": 1, "kinds": "checkpoint,reboot"}, "kinds"),
        ({"wait": 1}, "node"),
    ],
)
def test_invalid_parameters_are_400_naming_the_field_on_both_servers(
    live_stack, world, params, loc
):
    answers = []
    for http in (client(live_stack, world.agent_secret), asgi(live_stack, world.agent_secret)):
        with http:
            answers.append(http.get("/api/v1/commands", params=params))
    assert [a.status_code for a in answers] == [400, 400]
    assert answers[0].json() == answers[1].json()
    assert answers[0].json()["errors"][0]["loc"] == loc


def test_users_list_commands_through_the_asgi_server_too(live_stack, world):
    with client(live_stack, world.operator_secret) as operator:
        created = issue(operator, kind="checkpoint", run="run-1").json()
    with asgi(live_stack, world.operator_secret) as operator:
        listed = operator.get("/api/v1/commands", params={"run": "run-1"})
        refused = operator.get(
            "/api/v1/commands", params={"run": "run-1"}, headers={"Authorization": "Bearer nope"}
        )
    assert [c["id"] for c in listed.json()["commands"]] == [created["id"]]
    assert refused.status_code == 401


def test_wsgi_redirects_a_following_agent_and_the_client_polls_there_with_its_token(
    live_stack, world
):
    with client(live_stack, world.agent_secret) as agent:
        params = {"node": "node-01", "wait": 2, "kinds": "checkpoint"}
        redirect = agent.get(
            "/api/v1/commands", params=params, headers={"X-Opsboard-Redirects": "follow"}
        )
    assert redirect.status_code == 307
    location = httpx.URL(redirect.headers["location"])
    assert (location.host, location.port) == ("127.0.0.1", live_stack.ws_port)
    assert location.path == "/api/v1/commands" and location.params["kinds"] == "checkpoint"

    agent_client = CommandClient(server=live_stack.url, token=world.agent_secret)
    with client(live_stack, world.operator_secret) as operator:
        created = issue(operator, kind="checkpoint", run="run-1", node="node-01").json()
    commands = agent_client.poll(node="node-01", wait=5, kinds=("checkpoint",))
    assert [c.id for c in commands] == [created["id"]]
    assert agent_client.poll_server == f"http://127.0.0.1:{live_stack.ws_port}"
    started = time.monotonic()
    assert agent_client.poll(node="node-01", wait=1, kinds=("checkpoint",)) == []
    assert time.monotonic() - started < 5


def test_held_polls_leave_the_gunicorn_workers_to_ingest(live_stack, world):
    # The stack runs 2 web workers; 6 polls held through WSGI would take both for 10 s.
    clients = [CommandClient(server=live_stack.url, token=world.agent_secret) for _ in range(6)]
    with ThreadPoolExecutor(len(clients)) as pool:
        held = [pool.submit(c.poll, node=f"idle-{i}", wait=10) for i, c in enumerate(clients)]
        time.sleep(2.0)
        assert not any(future.done() for future in held)
        timings = []
        with client(live_stack, world.agent_secret) as agent:
            for index in range(5):
                started = time.monotonic()
                sample = {"ts": time.time(), "metric": "host.x", "value": index}
                batch = {"batch_id": uuid.uuid4().hex, "node": "node-01", "samples": [sample]}
                response = agent.post("/api/v1/ingest", json=batch)
                timings.append(time.monotonic() - started)
                assert response.status_code == 202
        assert not any(future.done() for future in held)
        assert max(timings) < 1.0
        assert [future.result(30) for future in held] == [[]] * len(clients)
    assert {c.poll_server for c in clients} == {f"http://127.0.0.1:{live_stack.ws_port}"}
