"""Scheduler hooks: cordon / uncordon run the cluster's argv template (no shell) with the
node validated and a timeout, in the live stack's worker (commands.node_carry_out); exit
code and output reach the audit entry; a failing hook fails the command and leaves the node
as it was. A real `scontrol` stand-in records its arguments; files beside it say how long it
sleeps and how it exits (the worker does not see the test's environment)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import ClusterHooks
from apps.commands.services import command_issue, hook_argv
from tests.commands.conftest import carried_out

SCONTROL = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
def setting(name, default):
    path = os.path.join(here, name)
    return open(path).read().strip() if os.path.exists(path) else default
with open({record!r}, "a") as record:
    record.write(json.dumps(sys.argv[1:]) + "\\n")
print("scontrol says hello")
time.sleep(float(setting("sleep", "0")))
sys.exit(int(setting("exit", "0")))
"""


@pytest.fixture
def scontrol(live_stack, tmp_path) -> Path:
    """A `scontrol` stand-in (tmp/bin/scontrol); returns the file where each call's argv
    lands. Write tmp/bin/sleep or tmp/bin/exit to make it slow or fail."""
    record = tmp_path / "calls.jsonl"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(SCONTROL.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    return record


def scontrol_setting(record: Path, name: str, value: str) -> None:
    (record.parent / "bin" / name).write_text(value)


def calls(record: Path) -> list[list[str]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def slurm_hooks(world, record: Path | None = None, timeout_s: float = 10.0) -> None:
    scontrol = str(record.parent / "bin" / "scontrol") if record else "scontrol"
    ClusterHooks.objects.create(
        cluster=world.cluster,
        cordon_argv=[scontrol, "update", "NodeName={node}", "State=DRAIN", "Reason={reason}"],
        uncordon_argv=[scontrol, "update", "NodeName={node}", "State=RESUME"],
        timeout_s=timeout_s,
    )


def node_command(world, kind: str, node: Node, reason: str = "bad DIMM; see ticket 42"):
    """Issue the command (it comes back `issued`: the hook has not run), then wait for the
    worker to carry it out."""
    issued = command_issue(
        user=world.operator, cluster=world.cluster, kind=kind, node=node, reason=reason,
        idempotency_key=uuid.uuid4().hex,
    )[0]  # fmt: skip
    assert issued.state == "issued"
    return carried_out(issued)


def test_cordon_runs_the_hook_and_cordons_the_node(world, scontrol):
    slurm_hooks(world, scontrol)
    command = node_command(world, "cordon", world.node1)
    assert command.state == "succeeded"
    # the reason is one argument, whatever its spaces and semicolons: there is no shell
    assert calls(scontrol) == [
        ["update", "NodeName=node-01", "State=DRAIN", "Reason=bad DIMM; see ticket 42"]
    ]
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason, node.cordoned_by) == (
        "cordoned", "bad DIMM; see ticket 42", world.operator
    )  # fmt: skip
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert entry.outcome == "succeeded" and entry.detail["hook"]["exit_code"] == 0
    assert "scontrol says hello" in entry.detail["hook"]["stdout"]


def test_uncordon_reverses_it(world, scontrol):
    slurm_hooks(world, scontrol)
    node_command(world, "cordon", world.node1)
    assert node_command(world, "uncordon", world.node1).state == "succeeded"
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason, node.cordoned_at) == ("active", "", None)
    assert calls(scontrol)[-1] == ["update", "NodeName=node-01", "State=RESUME"]


def test_a_failing_hook_fails_the_command_and_leaves_the_node(world, scontrol):
    slurm_hooks(world, scontrol)
    scontrol_setting(scontrol, "exit", "3")
    command = node_command(world, "cordon", world.node1)
    assert command.state == "failed" and command.result["hook"]["exit_code"] == 3
    assert Node.objects.get(pk=world.node1.pk).state == "active"
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert entry.outcome == "failed" and entry.detail["hook"]["exit_code"] == 3


def test_a_hook_past_its_timeout_fails_the_command(world, scontrol):
    slurm_hooks(world, scontrol, timeout_s=0.5)
    scontrol_setting(scontrol, "sleep", "5")
    command = node_command(world, "cordon", world.node1)
    assert command.state == "failed" and "timed out" in command.result["hook"]["error"]
    assert Node.objects.get(pk=world.node1.pk).state == "active"


def test_a_node_name_that_is_not_a_host_name_never_reaches_the_hook(world, scontrol):
    slurm_hooks(world, scontrol)
    odd = Node.objects.create(cluster=world.cluster, name="--all")
    command = node_command(world, "cordon", odd)
    assert command.state == "failed" and calls(scontrol) == []
    assert Node.objects.get(pk=odd.pk).state == "active"


@pytest.mark.parametrize("name", ["-x", "../etc", "a b", "node;rm", ""])
def test_hook_argv_refuses_names_that_are_not_host_names(name):
    with pytest.raises(ValueError):
        hook_argv(["scontrol", "{node}"], node=name, reason="")


def test_without_hooks_cordon_acts_on_the_server_alone(live_stack, world):
    command = node_command(world, "cordon", world.node2)
    assert command.state == "succeeded" and command.result == {"hook": None}
    assert Node.objects.get(pk=world.node2.pk).state == "cordoned"
