"""Fault 9: operator actions under faults, on a real job (examples/ddp_train.py, 2 ranks under
torchrun, wrapped in `opsboard-agent supervise` on node-01: tests/commands/e2e.py), a stack
of its own on a Redis of its own. (a) Redis down while a checkpoint and a stop are pending;
(c) the agent restarted between a stop's delivery and its ack; (d) the supervisor killed
during a drain's stop. Every command ends in exactly one terminal state, the node is in the
state its audit log says, and no process of the job survives a stop acked `succeeded`.
(b), Postgres restarted in the middle of a drain, needs a private Postgres under its stack:
test_drain_postgres_restart.py."""

import signal
import time
import uuid

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.access.services import role_grant, user_token_issue
from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.commands.models import Command, CommandTransition
from apps.runs.models import Run, StepReport
from launcher.procs import wait_until
from tests.commands.e2e import SupervisedJob, command_post, wait_for
from tests.faults.redis_server import stack_on_private_redis
from tests.stackproc import Stack

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

RUN, NODE = "faults-run", "node-01"
TERMINAL = ("succeeded", "failed", "expired")
REDIS_DOWN_S = 15
TUNED = {
    "COMMANDS_REDELIVER_AFTER_S": "3",  # (c): the restarted agent gets the stop again soon
    "COMMANDS_DRAIN_STOP_S": "20",  # (d): the stop nobody acks any more expires soon
    # (a): a checkpoint whose job was stopped before its save was reported expires soon
    "COMMANDS_EXPIRE_AFTER_S": "60",
}


@pytest.fixture
def action_stack(live_stack, tmp_path, live_db):
    """(stack, its Redis): a stack of its own on a private Redis (tests.faults.redis_server)."""
    with stack_on_private_redis(
        live_stack, tmp_path / "redis", name="faults-actions", **TUNED
    ) as pair:
        yield pair


class World:
    """A cluster, an operator's API client, the supervised job; what the test asserts on."""

    def __init__(self, stack: Stack, tmp_path) -> None:
        token, self.agent_secret = token_issue(cluster_name=f"act-{uuid.uuid4().hex[:8]}")
        self.cluster = token.cluster
        operator = get_user_model().objects.create_user(f"op-{uuid.uuid4().hex[:6]}")
        role_grant(user=operator, cluster=self.cluster, role="operator")
        headers = {"Authorization": f"Bearer {user_token_issue(user=operator)[1]}"}
        self.operator = httpx.Client(base_url=stack.url, timeout=40, headers=headers)
        self.agent = httpx.Client(
            base_url=stack.url, timeout=40, headers={"Authorization": f"Bearer {self.agent_secret}"}
        )
        self.job = SupervisedJob(
            server=stack.url, secret=self.agent_secret, run=RUN, node=NODE, workdir=tmp_path,
            nodes=NODE, ranks=2, log_name="faults-actions-job",
        )  # fmt: skip

    def start_job(self) -> None:
        started = timezone.now()
        self.job.start()
        steps = StepReport.objects.filter(run__cluster=self.cluster, node__name=NODE)
        self.wait(
            lambda: steps.filter(ts__gte=started).exists(),
            180,
            "the job's first steps from node-01",
        )
        self.job.remember_processes()

    def issue(self, kind: str, **body) -> Command:
        pk = command_post(self.operator, kind=kind, cluster=self.cluster.name, **body)
        return Command.objects.get(pk=pk)

    def state(self) -> str:
        commands = Command.objects.filter(cluster=self.cluster).order_by("issued_at")
        lines = [f"{c.kind} {c.pk}: {c.state} {c.result}" for c in commands]
        return f"commands: {lines}; job log:\n{self.job.log_tail(2000)}"

    def wait(self, predicate, timeout: float, what: str):
        return wait_for(predicate, timeout, what, self.state)

    def ended(self, *commands: Command, timeout: float = 120) -> None:
        self.wait(
            lambda: all(Command.objects.get(pk=c.pk).state in TERMINAL for c in commands),
            timeout,
            "every command in a terminal state",
        )

    def close(self) -> None:
        self.job.stop()
        self.operator.close()
        self.agent.close()


@pytest.fixture
def world(action_stack, tmp_path):
    made = World(action_stack[0], tmp_path)
    try:
        yield made
    finally:
        made.close()


def ends_once(command: Command) -> str:
    """The command's terminal state, entered by exactly one transition and never left."""
    moves = list(CommandTransition.objects.filter(command=command).order_by("at", "pk"))
    terminal = [move for move in moves if move.to_state in TERMINAL]
    command.refresh_from_db()
    assert len(terminal) == 1, [(m.from_state, m.to_state) for m in moves]
    assert moves[-1] == terminal[0] and terminal[0].to_state == command.state
    return command.state


def node_as_audited(world: World) -> str:
    """The node's state, checked against what its audit log says: no node entry, `active`;
    a drain that ran its hook, `cordoned` (however a drain ends, its node ends cordoned)."""
    node = Node.objects.get(cluster=world.cluster, name=NODE)
    entries = AuditEntry.objects.filter(cluster_id=world.cluster.pk, target=f"node:{NODE}")
    last = entries.filter(action__startswith="node.").order_by("pk").last()
    expected = {None: "active", ("node.drain", "succeeded"): "cordoned"}[
        last and (last.action, last.outcome)
    ]
    assert node.state == expected, (node.state, last and (last.action, last.outcome))
    return node.state


def assert_no_survivor(world: World) -> None:
    """No process of the job is left: none seen below the supervisor, and none of those each
    start of the job recorded (its launcher and torchrun agents: e2e_launch.py)."""

    def left() -> list[int]:
        launched = [
            pid for start in world.job.launches() for pid in (start["pid"], *start["agents"])
        ]
        return world.job.survivors() + [pid for pid in launched if world.job.alive(pid)]

    world.wait(lambda: not left(), 30, "no process of the job left")


def test_a_checkpoint_and_a_stop_pending_while_redis_is_down_each_end_once(world, action_stack):
    _, server = action_stack
    world.start_job()
    server.stop()
    down_at = time.monotonic()
    checkpoint = world.issue("checkpoint", run=RUN)
    world.wait(
        lambda: Command.objects.get(pk=checkpoint.pk).state != "issued", 30, "the checkpoint taken"
    )
    stop = world.issue("stop", run=RUN)
    states_down = {}
    try:
        time.sleep(max(0.0, REDIS_DOWN_S - (time.monotonic() - down_at)))
        states_down = {c.kind: Command.objects.get(pk=c.pk).state for c in (checkpoint, stop)}
    finally:
        server.start()
    back = time.monotonic()
    world.ended(checkpoint, stop)
    print(
        f"\nfaults: actions (a): Redis down {back - down_at:.0f} s; while down: {states_down};"
        f" both terminal {time.monotonic() - back:.1f} s after its return:"
        f" checkpoint {ends_once(checkpoint)}, stop {ends_once(stop)}"
    )
    assert ends_once(stop) == "succeeded"
    assert_no_survivor(world)
    assert Run.objects.get(cluster=world.cluster, name=RUN).state == "stopped"
    assert node_as_audited(world) == "active"


def test_a_stop_taken_by_an_agent_that_restarted_before_its_ack_ends_once(world):
    world.start_job()
    # the agent goes down (SIGKILL: its job follows it, by PDEATHSIG and the watchdog)...
    world.job.popen.send_signal(signal.SIGKILL)
    world.job.popen.wait(10)
    assert_no_survivor(world)
    # ...just after it took the stop: delivered, never acknowledged
    stop = world.issue("stop", run=RUN)
    taken = world.agent.get(
        "/api/v1/commands", params={"node": NODE, "kinds": "stop,drain,resume", "wait": 0}
    )
    assert [c["id"] for c in taken.json()["commands"]] == [str(stop.pk)], taken.text
    assert Command.objects.get(pk=stop.pk).state == "delivered"
    restarted = time.monotonic()
    # systemd starts the supervisor again, and it starts the job: the stop comes again
    # before the job's first step (COMMANDS_REDELIVER_AFTER_S)
    world.job.start()
    world.ended(stop, timeout=90)
    deliveries = CommandTransition.objects.filter(command=stop, to_state="delivered").count()
    print(
        f"\nfaults: actions (c): stop delivered {deliveries} times, {ends_once(stop)}"
        f" {time.monotonic() - restarted:.1f} s after the agent's restart"
    )
    assert ends_once(stop) == "succeeded"
    assert_no_survivor(world)
    assert Run.objects.get(cluster=world.cluster, name=RUN).state == "stopped"
    assert node_as_audited(world) == "active"


def test_a_drain_whose_supervisor_is_killed_during_its_stop_ends_once(world):
    world.start_job()
    drain = world.issue("drain", node=NODE, reason="faults: supervisor killed mid-stop")
    stop = world.wait(
        lambda: Command.objects.filter(parent=drain, kind="stop").first(), 120, "the drain's stop"
    )
    # polled every 20 ms: the supervisor acks `succeeded` about a second after `accepted`
    wait_until(
        lambda: Command.objects.get(pk=stop.pk).state in ("delivered", "accepted", *TERMINAL),
        60,
        "the stop taken by the supervisor",
        interval=0.02,
        state=world.state,
    )
    world.job.remember_processes()
    world.job.popen.send_signal(signal.SIGKILL)
    at_kill = Command.objects.get(pk=stop.pk).state
    killed = time.monotonic()
    world.job.popen.wait(10)
    assert at_kill in ("delivered", "accepted"), f"the stop was already {at_kill}"
    assert_no_survivor(world)  # the job follows its supervisor (PDEATHSIG, the watchdog)
    world.ended(drain, stop, timeout=90)
    checkpoint = Command.objects.get(parent=drain, kind="checkpoint")
    states = {c.kind: ends_once(c) for c in (drain, checkpoint, stop)}
    print(
        f"\nfaults: actions (d): supervisor killed with the stop {at_kill}; after"
        f" {time.monotonic() - killed:.1f} s: {states}; node {node_as_audited(world)}"
    )
    assert states == {"drain": "failed", "checkpoint": "succeeded", "stop": "expired"}
    assert Run.objects.get(cluster=world.cluster, name=RUN).state != "stopped"
