"""Fault 9 (b): Postgres restarted (`pg_ctl -m immediate`, then started again) in the middle
of a drain, on the real job of test_actions.py (examples/ddp_train.py, 2 ranks under torchrun,
in `opsboard-agent supervise` on node-01) and a private Postgres under a stack of its own
(tests/faults/private_stack.py). The crash comes in either phase of the drain: while its
checkpoint is delivered or accepted (its ack and the ranks' checkpoint events meet a database
that is down), or while its stop is delivered or accepted (the supervisor stops the job, and
its acks meet a database that is down). Every command ends in exactly one terminal state, the drain
makes one checkpoint and one stop, the node is in the state its audit log says, no process
of the job survives the stop acked `succeeded`, no request hangs or answers `500`, and the
stack carries out a later command by itself.

The test process's own database is not the stack's: it reads the private one with SQL."""

import json
import os
import time
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest

from launcher.procs import wait_until
from tests.commands.e2e import SupervisedJob, command_post, wait_for
from tests.faults.postgres_server import PrivatePostgres
from tests.faults.private_stack import manage, private_stack
from tests.faults.probe import Prober

pytestmark = [
    pytest.mark.faults,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(600),
]

RUN, NODE = "faults-run", "node-01"
TERMINAL = ("succeeded", "failed", "expired")
DOWN_S = float(os.environ.get("FAULTS_PG_DOWN_S", "10"))
# How long after Postgres is back every command of the drain may take to end: the agents'
# ack retries (backoff capped at 5 s), their poll's backoff, the 2 s sweep, and in the
# checkpoint phase the ranks' spooled events and the stop that follows.
RECOVERY_S = 90
TUNED = {
    "COMMANDS_REDELIVER_AFTER_S": "3",  # a delivery whose answer the crash lost comes again
    # a phase that never ends fails the drain well within the test's time, not after 15 min
    "COMMANDS_DRAIN_CHECKPOINT_S": "150",
    "COMMANDS_DRAIN_STOP_S": "90",
}
# Made inside the private database by the stack's own code (manage.py shell): an operator
# with a personal API token, as test_actions.World makes in the test database.
OPERATOR = """
import json, uuid
from django.contrib.auth import get_user_model
from apps.access.services import role_grant, user_token_issue
from apps.clusters.models import Cluster
user = get_user_model().objects.create_user(f"op-{uuid.uuid4().hex[:6]}")
role_grant(user=user, cluster=Cluster.objects.get(name=%r), role="operator")
print(json.dumps({"token": user_token_issue(user=user)[1]}))
"""


@pytest.fixture
def drain_stack(live_stack, live_db):
    database = PrivatePostgres().start()
    try:
        prefix = f"{os.environ.get('OPSBOARD_REDIS_PREFIX', 'opsboard')}-faults-drain-pg"
        env = {"OPSBOARD_REDIS_PREFIX": f"{prefix}-{uuid.uuid4().hex[:6]}", **TUNED}
        with private_stack(live_stack, database, **env) as stack:
            yield stack, database
    finally:
        database.remove()


class Drain:
    """The cluster, an operator's API client and the supervised job on the private stack;
    what the test reads back, with SQL, from the private database (its rows alone)."""

    def __init__(self, stack, database: PrivatePostgres, tmp_path) -> None:
        self.database = database
        cluster = f"drainpg-{uuid.uuid4().hex[:6]}"
        self.agent_secret = manage(stack.env, "issue_token", cluster, "--name", "faults").strip()
        made = manage(stack.env, "shell", "-v0", "-c", OPERATOR % cluster)
        operator = json.loads(made.strip().splitlines()[-1])["token"]
        self.cluster = cluster
        self.operator = httpx.Client(
            base_url=stack.url, timeout=40, headers={"Authorization": f"Bearer {operator}"}
        )
        self.job = SupervisedJob(
            server=stack.url, secret=self.agent_secret, run=RUN, node=NODE, workdir=tmp_path,
            nodes=NODE, ranks=2, log_name="faults-drain-pg-job",
        )  # fmt: skip

    def one(self, sql: str, params: list | None = None):
        rows = self.database.query(sql, params)
        return rows[0][0] if rows else None

    def start_job(self) -> None:
        started = datetime.now(UTC)
        self.job.start()
        self.wait(
            lambda: self.one("SELECT count(*) FROM runs_stepreport WHERE ts >= %s", [started]),
            180,
            "the job's first steps from node-01",
        )
        self.job.remember_processes()

    def issue(self, kind: str, **body) -> str:
        return command_post(self.operator, kind=kind, cluster=self.cluster, **body)

    def commands(self) -> dict[str, tuple[str, str]]:
        """{id: (kind, state)} of every command, the drain's children included."""
        rows = self.database.query("SELECT id::text, kind, state FROM commands_command")
        return {pk: (kind, state) for pk, kind, state in rows}

    def child(self, drain: str, kind: str) -> str | None:
        return self.one(
            "SELECT id::text FROM commands_command WHERE parent_id = %s AND kind = %s",
            [drain, kind],
        )

    def state(self) -> str:
        try:
            commands = sorted(self.commands().values())
        except psycopg.Error as error:
            commands = [("database", repr(error))]
        return f"commands: {commands}; job log:\n{self.job.log_tail(2000)}"

    def wait(self, predicate, timeout: float, what: str):
        return wait_for(predicate, timeout, what, self.state)

    def ends_once(self, command: str) -> str:
        """As test_actions.ends_once: one transition into a terminal state, the last one."""
        moves = self.database.query(
            "SELECT from_state, to_state FROM commands_commandtransition"
            " WHERE command_id = %s ORDER BY at, id",
            [command],
        )
        terminal = [move for move in moves if move[1] in TERMINAL]
        state = self.one("SELECT state FROM commands_command WHERE id = %s", [command])
        assert len(terminal) == 1, moves
        assert moves[-1] == terminal[0] and terminal[0][1] == state, (moves, state)
        return state

    def node_as_audited(self) -> str:
        """The node's state, checked against its last audited change: none, `active`; a
        drain that ran its hook, `cordoned` (however a drain ends); an uncordon, `active`."""
        node = self.one("SELECT state FROM clusters_node WHERE name = %s", [NODE])
        last = self.database.query(
            "SELECT action, outcome FROM audit_auditentry WHERE target = %s"
            " AND action LIKE 'node.%%' ORDER BY id DESC LIMIT 1",
            [f"node:{NODE}"],
        )
        expected = {
            None: "active",
            ("node.drain", "succeeded"): "cordoned",
            ("node.uncordon", "succeeded"): "active",
        }[last[0] if last else None]
        assert node == expected, (node, last)
        return node

    def no_survivor(self) -> None:
        """As test_actions.assert_no_survivor: none seen below the supervisor, and none of
        those each start of the job recorded (its launcher and torchrun agents)."""

        def left() -> list[int]:
            launched = [
                pid for start in self.job.launches() for pid in (start["pid"], *start["agents"])
            ]
            return self.job.survivors() + [pid for pid in launched if self.job.alive(pid)]

        self.wait(lambda: not left(), 30, "no process of the job left")

    def close(self) -> None:
        self.job.stop()
        self.operator.close()


@pytest.fixture
def drain(drain_stack, tmp_path):
    made = Drain(*drain_stack, tmp_path)
    try:
        yield made
    finally:
        made.close()


def crash_point(drain: Drain, drain_id: str, kind: str) -> str:
    """Wait, reading every 20 ms, for the drain's `kind` child to be taken (delivered or
    accepted, not yet over); its state then. One connection: not one per read."""
    with psycopg.connect(drain.database.url, autocommit=True) as conn:

        def taken() -> str | None:
            row = conn.execute(
                "SELECT state FROM commands_command WHERE parent_id = %s AND kind = %s",
                [drain_id, kind],
            ).fetchone()
            return row[0] if row and row[0] != "issued" else None

        return wait_until(taken, 180, f"the drain's {kind} taken", interval=0.02, state=drain.state)


@pytest.mark.parametrize("phase", ["checkpoint", "stop"])
def test_a_drain_through_a_postgres_restart_ends_once_and_as_audited(drain, drain_stack, phase):
    stack, database = drain_stack
    drain.start_job()
    prober = Prober(stack.url, drain.agent_secret).start()
    try:
        drain_id = drain.issue("drain", node=NODE, reason=f"faults: Postgres restart ({phase})")
        at_crash = crash_point(drain, drain_id, phase)
        drain.job.remember_processes()
        database.crash()
        crashed = time.monotonic()
        time.sleep(DOWN_S)
        database.start()
        back = time.monotonic()
        assert at_crash in ("delivered", "accepted"), f"the {phase} was already {at_crash}"
        checkpoint = drain.wait(lambda: drain.child(drain_id, "checkpoint"), 60, "the checkpoint")
        stop = drain.wait(lambda: drain.child(drain_id, "stop"), RECOVERY_S, "the drain's stop")
        drain.wait(
            lambda: all(state in TERMINAL for _, state in drain.commands().values()),
            RECOVERY_S,
            "every command in a terminal state",
        )
        ended = time.monotonic()
        node_after_drain = drain.node_as_audited()
        # the stack by itself, after the restart: a write through the API, its task on the
        # periodic worker, the node's hook path and audit entry
        uncordon = drain.issue("uncordon", node=NODE, reason="faults: after the restart")
        drain.wait(
            lambda: drain.commands()[uncordon][1] in TERMINAL, 60, "the uncordon carried out"
        )
        uncordoned = time.monotonic()
    finally:
        prober.stop()
    states = {kind: drain.ends_once(pk) for pk, (kind, _) in drain.commands().items()}
    children = database.query(
        "SELECT kind, count(*) FROM commands_command WHERE parent_id = %s GROUP BY kind",
        [drain_id],
    )
    run_state = drain.one("SELECT state FROM runs_run WHERE name = %s", [RUN])
    print(
        f"\nfaults: actions (b), crash in the {phase} phase ({phase} {at_crash}): Postgres"
        f" down {back - crashed:.1f} s; every command terminal {ended - back:.1f} s after its"
        f" return: {states}; node then {node_after_drain}; run {run_state}; uncordon"
        f" {uncordoned - ended:.1f} s later;"
        f" worker restarts {stack.worker.restarts}, periodic {stack.periodic.restarts};"
        f" reads {prober.summary()} (longest {prober.longest_s:.1f} s)"
    )
    assert sorted(children) == [("checkpoint", 1), ("stop", 1)], children
    assert {
        pk: drain.ends_once(pk) for pk in (drain_id, checkpoint, stop, uncordon)
    } == dict.fromkeys((drain_id, checkpoint, stop, uncordon), "succeeded")
    assert len(states) == len(drain.commands()) == 4, states
    assert node_after_drain == "cordoned"
    drain.no_survivor()  # the stop was acked `succeeded`
    assert run_state == "stopped"
    assert drain.node_as_audited() == "active"  # the uncordon's, after the drain's cordon
    assert not prober.failures, prober.failures[:10]
    # every read is answered within its bounds (docs/faults.md, "Bounds"), down or not
    assert prober.longest_s <= 10.0
