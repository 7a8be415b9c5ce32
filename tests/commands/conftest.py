"""Fixtures of the command tests: a cluster whose run-1 is served by node-01 and node-02,
people holding roles there, and HTTP clients for an operator (personal token) and an agent."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
import pytest
from django.contrib.auth import get_user_model

from apps.access.services import role_grant, user_token_issue
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from apps.commands.choices import CARRIED_OUT_KINDS
from apps.commands.models import Command
from apps.runs.models import Run, RunEvent, StepReport


@dataclass
class World:
    cluster: Cluster
    run: Run
    node1: Node
    node2: Node
    agent_secret: str
    operator: object
    operator_secret: str
    viewer_secret: str


def serve(run: Run, node: Node, *, step: int = 100, ranks: range = range(2)) -> None:
    """Step reports of `run` from `node`: the node serves the run."""
    now = datetime.now(UTC)
    for rank in ranks:
        StepReport.objects.create(run=run, node=node, ts=now, rank=rank, step=step, step_time=1.0)
    Run.objects.filter(pk=run.pk).update(last_step=step, last_step_at=now)
    run.refresh_from_db()


def checkpoint_event(run: Run, node: Node, *, step: int, rank: int, tier: str, state: str):
    RunEvent.objects.create(
        cluster_id=run.cluster_id, node=node, run=run, ts=datetime.now(UTC), kind="checkpoint",
        step=step, rank=rank, data={"tier": tier, "state": state, "path": f"/ckpt/step-{step}"},
    )  # fmt: skip


@pytest.fixture
def world(transactional_db) -> World:
    token, agent_secret = token_issue(cluster_name=f"c-{uuid.uuid4().hex[:8]}", name="agent")
    cluster = token.cluster
    run = Run.objects.create(cluster=cluster, name="run-1")
    node1 = Node.objects.create(cluster=cluster, name="node-01")
    node2 = Node.objects.create(cluster=cluster, name="node-02")
    serve(run, node1, ranks=range(0, 2))
    serve(run, node2, ranks=range(2, 4))
    users = get_user_model().objects
    operator, viewer = users.create_user("olga"), users.create_user("vik")
    role_grant(user=operator, cluster=cluster, role="operator")
    role_grant(user=viewer, cluster=cluster, role="viewer")
    return World(
        cluster=cluster, run=run, node1=node1, node2=node2, agent_secret=agent_secret,
        operator=operator, operator_secret=user_token_issue(user=operator)[1],
        viewer_secret=user_token_issue(user=viewer)[1],
    )  # fmt: skip


def client(live_stack, secret: str) -> httpx.Client:
    return httpx.Client(
        base_url=live_stack.url, timeout=40, headers={"Authorization": f"Bearer {secret}"}
    )


def issue(http: httpx.Client, key: str | None = None, **body) -> httpx.Response:
    return http.post(
        "/api/v1/commands", json=body, headers={"Idempotency-Key": key or uuid.uuid4().hex}
    )


def settled(cluster: Cluster, timeout: float = 60.0) -> None:
    """Wait until the live stack's worker carried out every node command of the cluster
    (none is `issued` any more): node commands answer at once and run their hook later."""
    deadline = time.monotonic() + timeout
    pending = Command.objects.filter(cluster=cluster, kind__in=CARRIED_OUT_KINDS, state="issued")
    while pending.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"node commands still issued: {list(pending)}")
        time.sleep(0.1)


def carried_out(command: Command, timeout: float = 60.0) -> Command:
    """The node command once its task ran (it is no longer `issued`)."""
    deadline = time.monotonic() + timeout
    while (found := Command.objects.get(pk=command.pk)).state == "issued":
        if time.monotonic() > deadline:
            raise AssertionError(f"{command} was not carried out within {timeout} s")
        time.sleep(0.1)
    return found
