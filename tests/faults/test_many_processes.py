"""Beyond one machine: each role as processes of its own, several of each, as separate hosts
would run them on one Postgres and one Redis: 2 HTTP servers, 2 ASGI servers, 3 ingest
workers, 2 periodic workers (beat in one) and the live publisher. Ingest batches and command
long-polls go through both front ends, moving to the other on a refused connection as a load
balancer would; one process of each role gets SIGKILL on the way. Every accepted batch is
stored once, every command is delivered and ends in one state, the backlog drains."""

from __future__ import annotations

import itertools
import signal
import threading
import time
import uuid

import httpx
import pytest
from django.db import connection

from apps.clusters.models import Node
from apps.commands.models import Command
from apps.commands.services import command_create
from apps.runs.models import Run
from launcher.commands import server_commands
from launcher.procs import free_port, http_ok, wait_until
from opsboard_agent.commands import CommandClient
from tests.conftest import AgentClient, stack_env
from tests.faults.ingest import (
    SAMPLES_PER_BATCH,
    Sender,
    assert_stored_exactly_once,
    batch_count,
    unprocessed,
)
from tests.stackproc import LOG_DIR, Process

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1800),
]

POLLERS = 16  # nodes, each with an agent holding a command long-poll


def named(command: list[str], node_name: str) -> list[str]:
    """A Celery worker's command with a node name of its own (`-n`): workers of one host
    must not share one."""
    if "-n" in command:
        at = command.index("-n")
        return [*command[: at + 1], node_name, *command[at + 2 :]]
    return [*command, "-n", node_name]


class Fleet:
    def __init__(self, env: dict[str, str]) -> None:
        queue = env["OPSBOARD_REDIS_PREFIX"]
        self.fronts: list[tuple[Process, Process]] = []
        self.urls: list[str] = []
        per_front = []
        for index in range(2):
            port, ws_port = free_port(), free_port()
            front_env = {**env, "LIVE_WS_PORT": str(ws_port), "PYTHONUNBUFFERED": "1"}
            commands = server_commands(
                host="127.0.0.1", port=port, ws_port=ws_port, web_workers=2,
                worker_concurrency=2, queue=queue, beat_in_worker=index == 0,
                beat_schedule=LOG_DIR / "fleet-beat-schedule",
            )  # fmt: skip
            per_front.append((commands, front_env))
            self.fronts.append(
                (
                    Process(f"fleet-web{index}", commands["web"], front_env),
                    Process(f"fleet-ws{index}", commands["ws"], front_env),
                )
            )
            self.urls.append(f"http://127.0.0.1:{port}")
        (first, worker_env), (second, _) = per_front
        self.workers = [
            Process(f"fleet-ingest{i}", named(first["worker"], f"ingest{i}.{queue}@%h"), worker_env)
            for i in range(3)
        ]
        self.periodics = [
            Process("fleet-periodic0", first["periodic"], worker_env),  # with beat
            Process(
                "fleet-periodic1", named(second["periodic"], f"periodic1.{queue}@%h"), worker_env
            ),
        ]
        self.publisher = Process("fleet-publisher", first["publisher"], worker_env)

    @property
    def processes(self) -> list[Process]:
        fronts = [p for pair in self.fronts for p in pair]
        return [*fronts, *self.workers, *self.periodics, self.publisher]

    def start(self) -> Fleet:
        for process in self.processes:
            process.start()
        for url in self.urls:
            wait_until(lambda url=url: http_ok(f"{url}/healthz"), 60, f"{url} up")
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()


class FailoverAgent(AgentClient):
    """An agent behind a load balancer: after a failed connection its retry goes to the
    other front (the failure still reaches the Sender, which retries the batch)."""

    def __init__(self, urls: list[str], secret: str) -> None:
        self.clients = [AgentClient(url, secret) for url in urls]
        self.turn = itertools.cycle(range(len(urls)))
        self.current = next(self.turn)

    def post(self, batch, **kwargs) -> httpx.Response:
        try:
            return self.clients[self.current].post(batch, **kwargs)
        except httpx.TransportError:
            self.current = next(self.turn)
            raise


class Poller(threading.Thread):
    """One node's agent: holds the long-poll on a front (following its redirect to the
    ASGI server), moves to the other front when its server dies, acks what it gets."""

    def __init__(self, urls: list[str], secret: str, node: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.urls, self.secret, self.node, self.stop = urls, secret, node, stop
        self.acked: list[str] = []
        self.failovers = 0

    def run(self) -> None:
        for url in itertools.cycle(self.urls):
            client = CommandClient(server=url, token=self.secret, timeout=10)
            while not self.stop.is_set():
                try:
                    commands = client.poll(node=self.node, wait=5)
                    for command in commands:
                        if client.ack(command.id, "succeeded", "done") < 300:
                            self.acked.append(command.id)
                except OSError:
                    self.failovers += 1
                    time.sleep(0.2)
                    break
            if self.stop.is_set():
                return


def test_a_fleet_of_processes_loses_nothing_when_one_of_each_role_dies(live_db, agent_token):
    token, secret = agent_token
    fleet = Fleet(stack_env(INGEST_SWEEP_INTERVAL="1", INGEST_SWEEP_AGE="2")).start()
    stop = threading.Event()
    try:
        run = Run.objects.create(cluster=token.cluster, name="fleet-run")
        nodes = [
            Node.objects.create(cluster=token.cluster, name=f"poll-{i:02d}") for i in range(POLLERS)
        ]
        pollers = [Poller(fleet.urls, secret, node.name, stop) for node in nodes]
        for poller in pollers:
            poller.start()
        count = batch_count()
        sender = Sender(FailoverAgent(fleet.urls, secret), count, f"fleet-{uuid.uuid4().hex[:6]}")
        started = time.monotonic()
        sender.start()
        issued: list[str] = []
        victims = [fleet.fronts[0][0], fleet.fronts[0][1], fleet.workers[0], fleet.periodics[0]]
        for round_index in range(4):
            wait_until(
                lambda r=round_index: len(sender.accepted) >= count * (r + 1) // 5
                or not sender.thread.is_alive(),
                900, "a fifth more of the batches accepted",
            )  # fmt: skip
            issued += [_checkpoint(run, node) for node in nodes]
            victims[round_index].kill(signal.SIGKILL)
            print(f"faults: SIGKILL {victims[round_index].name} at batch {len(sender.accepted)}")
        issued += [_checkpoint(run, node) for node in nodes]
        sender.join(1800)
        accepted_at = time.monotonic()
        wait_until(lambda: unprocessed(token) == 0, 600, "the inbox backlog to return to 0")
        wait_until(
            lambda: {c for p in pollers for c in p.acked} >= set(issued), 300, "every command acked"
        )
        drained = time.monotonic()
    finally:
        stop.set()
        fleet.stop()
    print(
        f"faults: fleet of {len(fleet.processes)} processes, {len(sender.accepted)} batches of"
        f" {SAMPLES_PER_BATCH} samples accepted in {accepted_at - started:.1f} s, backlog 0 and"
        f" every command acked {drained - accepted_at:.1f} s later; answers {sender.statuses};"
        f" poll fail-overs {sum(p.failovers for p in pollers)}"
    )
    assert len(sender.accepted) == count
    assert_stored_exactly_once(token, sender.accepted)
    acked = [command_id for poller in pollers for command_id in poller.acked]
    # each delivered and acked; a second ack only where a delivery's answer died with its
    # server (redelivered after COMMANDS_REDELIVER_AFTER_S), and it changes nothing
    assert set(acked) == set(issued)
    print(f"faults: {len(issued)} commands, {len(acked) - len(issued)} acked a second time")
    states = Command.objects.filter(id__in=issued).values_list("state", flat=True)
    assert set(states) == {"succeeded"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM commands_commandtransition WHERE command_id = ANY(%s::uuid[])"
            " AND to_state = 'succeeded'",
            [issued],
        )
        assert cursor.fetchone()[0] == len(issued)  # one terminal transition each


def _checkpoint(run: Run, node: Node) -> str:
    command, _ = command_create(
        cluster_id=run.cluster_id, kind="checkpoint", idempotency_key=uuid.uuid4().hex,
        run_id=run.pk, node_id=node.pk,
    )  # fmt: skip
    return str(command.pk)
