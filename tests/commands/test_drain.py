"""Drain on the live stack: the drain hook runs and the node is draining; each run on it
is asked for a checkpoint; once that succeeds a stop follows, addressed to the node; when
the stop succeeds the drain has succeeded and the node ends cordoned, out of the plan."""

from __future__ import annotations

import time
from pathlib import Path

from apps.clusters.models import Node
from apps.commands.models import ClusterHooks, Command
from tests.commands.conftest import checkpoint_event, client, issue


def poll(agent, node: str) -> list[dict]:
    return agent.get("/api/v1/commands", params={"node": node, "wait": 5}).json()["commands"]


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_drain_checkpoints_then_stops_and_leaves_the_node_cordoned(live_stack, world, tmp_path):
    record = tmp_path / "kubectl.args"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(f'#!/bin/sh\necho "$@" >> "{record}"\n')
    kubectl.chmod(0o755)
    ClusterHooks.objects.create(
        cluster=world.cluster, drain_argv=[str(kubectl), "drain", "{node}", "--ignore-daemonsets"]
    )
    with client(live_stack, world.operator_secret) as operator:
        drain = issue(operator, kind="drain", node="node-01", reason="XID 79")
    # answered at once, still issued; the drain hook runs in the worker's task
    assert drain.status_code == 202, drain.text
    assert drain.json()["state"] == "issued"
    wait_for(lambda: Command.objects.get(pk=drain.json()["id"]).state == "accepted")
    assert Path(record).read_text() == "drain node-01 --ignore-daemonsets\n"
    assert Node.objects.get(pk=world.node1.pk).state == "draining"

    with client(live_stack, world.agent_secret) as agent:
        [checkpoint] = poll(agent, "node-01")
        assert (checkpoint["kind"], checkpoint["run"], checkpoint["parent"]) == (
            "checkpoint", "run-1", drain.json()["id"]
        )  # fmt: skip
        ack = f"/api/v1/commands/{checkpoint['id']}/ack"
        agent.post(ack, json={"state": "accepted", "step": 200, "ranks": [0, 1, 2, 3]})
        for rank in range(4):
            checkpoint_event(world.run, world.node1, step=200, rank=rank, tier="durable",
                             state="completed")  # fmt: skip
        wait_for(lambda: Command.objects.get(pk=checkpoint["id"]).state == "succeeded")
        assert poll(agent, "node-02") == []  # the stop is for node-01 only
        [stop] = poll(agent, "node-01")
        assert (stop["kind"], stop["node"], stop["run"]) == ("stop", "node-01", "run-1")
        done = agent.post(f"/api/v1/commands/{stop['id']}/ack", json={"state": "succeeded"})
        assert done.status_code == 200
        plan = agent.get("/api/v1/runs/run-1/plan").json()

    drained = Command.objects.get(pk=drain.json()["id"])
    assert drained.state == "succeeded"
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason) == ("cordoned", "XID 79")
    assert plan["nodes"] == ["node-02"]
