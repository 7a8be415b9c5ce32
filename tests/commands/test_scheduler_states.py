"""The scheduler's word on its nodes: a cluster's state hook (a real executable standing for
`sinfo -h -N -o "%N %T"`) marks `active` nodes the scheduler reports down as `down`, out of
the resume plan; a person's cordon stands; a failing, unparseable or slow hook changes
nothing (and a slow one leaves no process); a node comes back when whoever marked it down
says so (the scheduler, or the node itself for the heartbeat)."""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

from django.utils import timezone

from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.clusters.services import node_mark_down, nodes_touch
from apps.commands.models import ClusterHooks
from apps.commands.plan import run_plan
from apps.commands.services.scheduler_states import (
    scheduler_state_is_down,
    scheduler_states_parse,
    scheduler_states_poll,
)
from apps.core.tasks import task_enqueue
from tests.commands.conftest import checkpoint_event, client, serve
from tests.commands.test_node_commands import GRANDPARENT, _alive, _with_marker

SINFO = """#!/bin/sh
# stands for sinfo -h -N -o "%N %T": prints what the test wrote, exits as it says
cat {states}
exit $(cat {code})
"""


def scheduler(world, tmp_path: Path, states: str, timeout_s: float = 10.0) -> Path:
    """A state hook printing `states`; returns its file of states (rewrite it to change
    what the scheduler says); `<file>.code` holds its exit code."""
    states_file, code = tmp_path / "states", tmp_path / "states.code"
    states_file.write_text(states)
    code.write_text("0")
    script = tmp_path / "sinfo"
    script.write_text(SINFO.format(states=states_file, code=code))
    script.chmod(0o755)
    ClusterHooks.objects.create(
        cluster=world.cluster, state_argv=[str(script), "-h", "-N"], timeout_s=timeout_s
    )
    return states_file


def poll(world) -> dict:
    """One poll, here; waits out one that the live stack's beat may be running."""
    deadline = time.monotonic() + 30
    while (result := scheduler_states_poll(cluster_id=world.cluster.pk)) == {"skipped": "busy"}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return result


def states(world) -> dict[str, tuple[str, str]]:
    return {n.name: (n.state, n.down_by) for n in Node.objects.filter(cluster=world.cluster)}


def test_it_maps_scheduler_states_to_down():
    for state in ("down", "down*", "idle*", "fail", "failing", "drained", "idle+drain",
                  "draining", "NOT_RESPONDING", "NotReady", "mixed*~"):  # fmt: skip
        assert scheduler_state_is_down(state), state
    for state in ("idle", "allocated", "mixed", "completing", "idle~", "maint$", "Ready"):
        assert not scheduler_state_is_down(state), state
    parsed = scheduler_states_parse("n1 idle\n\nn2 down*\nn1 drained\nn3 mixed\n")
    assert {name: report.down for name, report in parsed.items()} == {
        "n1": True, "n2": True, "n3": False  # n1 down in one partition
    }  # fmt: skip


def test_it_reads_the_schedulers_reason_from_the_rest_of_the_line():
    """`sinfo -h -N -o "%N %T %E"`: the reason is last and may hold spaces; Slurm says
    "none" for no reason; control characters cannot reach a page."""
    parsed = scheduler_states_parse(
        "n1 idle none\n"
        "n2 drained bad DIMM [root@2026-12-05T10:00:00]\n"
        "n3 down* Not responding\n"
        "n2 drained bad DIMM [root@2026-12-05T10:00:00]\n"  # its second partition
        "n4 mixed  \n"
        "n5 drained tab\there\x1b[31m\n"
    )
    reasons = {name: (report.down, report.reason) for name, report in parsed.items()}
    assert reasons == {
        "n1": (False, ""),
        "n2": (True, "bad DIMM [root@2026-12-05T10:00:00]"),
        "n3": (True, "Not responding"),
        "n4": (False, ""),
        "n5": (True, "tab here [31m"),
    }
    assert len(scheduler_states_parse("n1 drained " + "x" * 5000)["n1"].reason) == 512


def test_it_refuses_output_that_is_not_node_state_lines():
    for output in ("n1\n", "-x idle\n", "n1 idle;rm\n", "../n idle\n", "n1 idle;rm why\n"):
        try:
            scheduler_states_parse(output)
        except ValueError as error:
            assert "line 1" in str(error)
        else:
            raise AssertionError(f"{output!r} parsed")


def test_the_worker_marks_an_active_node_down_and_the_plan_leaves_it(live_stack, world, tmp_path):
    scheduler(world, tmp_path, "node-01 down* Not responding\nnode-02 idle none\nnode-99 down\n")
    # beat's task, on the worker: it sends the cluster's poll, which the worker runs
    task_enqueue("commands.scheduler_states_poll_all")
    deadline = time.monotonic() + 60
    while states(world)["node-01"][0] != "down":
        assert time.monotonic() < deadline, states(world)
        time.sleep(0.2)
    assert states(world) == {"node-01": ("down", "scheduler"), "node-02": ("active", "")}
    entry = AuditEntry.objects.get(action="node.down", cluster_id=world.cluster.pk)
    assert (entry.actor_kind, entry.outcome, entry.target) == (
        "scheduler",
        "succeeded",
        "node:node-01",
    )
    assert entry.actor_name == "scheduler state hook (sinfo)"
    assert entry.reason == "the scheduler reports it down: Not responding"
    assert entry.detail["lines"] == ["node-01 down* Not responding"]
    plan = run_plan(run=world.run)
    assert plan["nodes"] == ["node-02"]
    assert plan["nodes_skipped"] == [
        {
            "node": "node-01",
            "state": "down",
            "why": "down: the scheduler reports it down: Not responding",
        }
    ]
    with client(live_stack, world.operator_secret) as operator:  # the API's plan says the same
        body = operator.get(f"/api/v1/runs/run-1/plan?cluster={world.cluster.name}").json()
    assert body["nodes"] == ["node-02"] and body["nodes_skipped"][0]["node"] == "node-01"


def test_a_cordoned_node_keeps_its_state(world, tmp_path):
    Node.objects.filter(pk=world.node1.pk).update(state="cordoned", cordon_reason="flaky NIC")
    scheduler(world, tmp_path, "node-01 drained\nnode-02 down\n")
    assert poll(world) == {"down": ["node-02"], "up": []}
    assert states(world) == {"node-01": ("cordoned", ""), "node-02": ("down", "scheduler")}
    plan = run_plan(run=world.run)
    assert plan["nodes"] == []
    assert {s["node"]: s["why"] for s in plan["nodes_skipped"]} == {
        "node-01": "cordoned: flaky NIC",
        "node-02": "down: the scheduler reports it down",
    }


def test_a_failing_or_unparseable_hook_changes_nothing_and_is_audited_once(world, tmp_path):
    states_file = scheduler(world, tmp_path, "node-01 down\n")
    (tmp_path / "states.code").write_text("3")
    for _ in range(2):
        assert poll(world) == {"error": "exited with 3"}
    states_file.write_text("node-01\n")
    (tmp_path / "states.code").write_text("0")
    assert "unparseable output: line 1" in poll(world)["error"]
    assert states(world) == {"node-01": ("active", ""), "node-02": ("active", "")}
    hooks = ClusterHooks.objects.get(cluster=world.cluster)
    assert "unparseable" in hooks.state_error and hooks.state_checked_at is not None
    entries = AuditEntry.objects.filter(action="node.state_hook", cluster_id=world.cluster.pk)
    assert [(e.outcome, e.reason) for e in entries.order_by("at")] == [
        ("failed", "exited with 3")  # when it started failing, not at every run
    ]
    assert entries.get().detail["hook"]["exit_code"] == 3
    states_file.write_text("node-01 down\n")
    assert poll(world) == {"down": ["node-01"], "up": []}
    assert entries.order_by("-at").first().outcome == "succeeded"  # works again
    assert ClusterHooks.objects.get(cluster=world.cluster).state_error == ""


def test_a_hook_past_its_timeout_is_killed_with_its_group_and_changes_nothing(world, tmp_path):
    marker = f"opsboard-state-hook-{uuid.uuid4().hex}"
    pids, script = tmp_path / "pids", tmp_path / "sinfo"
    script.write_text(GRANDPARENT.format(python=sys.executable, marker=marker, pids=str(pids)))
    script.chmod(0o755)
    ClusterHooks.objects.create(cluster=world.cluster, state_argv=[str(script)], timeout_s=1.5)
    began = time.monotonic()
    assert poll(world) == {"error": "timed out after 1.5 s"}
    assert time.monotonic() - began < 15
    hook_pid, grandchild = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5
    while (_alive(hook_pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(hook_pid) and not _alive(grandchild) and _with_marker(marker) == []
    assert states(world) == {"node-01": ("active", ""), "node-02": ("active", "")}


def reasons(world) -> dict[str, str]:
    return dict(Node.objects.filter(cluster=world.cluster).values_list("name", "down_reason"))


def test_the_reason_follows_the_scheduler_and_goes_with_its_word(world, tmp_path):
    states_file = scheduler(world, tmp_path, "node-01 drained bad DIMM\nnode-02 idle none\n")
    assert poll(world) == {"down": ["node-01"], "up": []}
    assert reasons(world) == {"node-01": "bad DIMM", "node-02": ""}
    states_file.write_text("node-01 drained bad DIMM, RMA 1234\n")  # edited in the scheduler
    assert poll(world) == {"down": [], "up": []}
    assert reasons(world)["node-01"] == "bad DIMM, RMA 1234"
    downs = AuditEntry.objects.filter(action="node.down", cluster_id=world.cluster.pk)
    assert downs.count() == 1  # the state did not change
    node_mark_down(node_id=world.node1.pk)  # silent too: the heartbeat takes it over
    assert states(world)["node-01"] == ("down", "heartbeat") and reasons(world)["node-01"] == ""
    nodes_touch(seen={(world.cluster.pk, "node-01"): (timezone.now(), None)})
    states_file.write_text("node-01 drained bad DIMM\n")
    poll(world)
    states_file.write_text("node-01 idle none\n")
    assert poll(world) == {"down": [], "up": ["node-01"]}
    assert states(world)["node-01"] == ("active", "") and reasons(world)["node-01"] == ""


def test_a_node_comes_back_when_whoever_marked_it_down_says_so(world, tmp_path):
    states_file = scheduler(world, tmp_path, "node-01 down\nnode-02 idle\n")
    assert poll(world) == {"down": ["node-01"], "up": []}
    node_mark_down(node_id=world.node2.pk)  # node-02 went silent: its heartbeat alert opened
    # node-01 reports again: the scheduler still says it is down, so it stays down
    now = timezone.now()
    nodes_touch(seen={(world.cluster.pk, "node-01"): (now, None)})
    assert states(world) == {"node-01": ("down", "scheduler"), "node-02": ("down", "heartbeat")}
    # the scheduler says both are up: node-01 is back, node-02 is still silent
    states_file.write_text("node-01 idle\nnode-02 idle\n")
    assert poll(world) == {"down": [], "up": ["node-01"]}
    assert states(world) == {"node-01": ("active", ""), "node-02": ("down", "heartbeat")}
    up = AuditEntry.objects.get(action="node.up", cluster_id=world.cluster.pk)
    assert (up.actor_kind, up.target) == ("scheduler", "node:node-01")
    nodes_touch(seen={(world.cluster.pk, "node-02"): (now, None)})  # node-02 reports
    assert states(world) == {"node-01": ("active", ""), "node-02": ("active", "")}
    # a heartbeat alert on a node the scheduler marked down takes it over: the scheduler
    # saying it is up does not bring back a node nobody hears from
    states_file.write_text("node-01 down\n")
    assert poll(world)["down"] == ["node-01"]
    node_mark_down(node_id=world.node1.pk)
    states_file.write_text("node-01 idle\n")
    assert poll(world) == {"down": [], "up": []}
    assert states(world)["node-01"] == ("down", "heartbeat")


def test_a_down_nodes_unfinished_save_is_skipped_naming_the_node(world):
    serve(world.run, world.node1, step=200, ranks=range(0, 2))
    serve(world.run, world.node2, step=200, ranks=range(2, 4))
    for rank in range(4):
        checkpoint_event(world.run, [world.node1, world.node2][rank // 2], step=100, rank=rank,
                         tier="durable", state="completed")  # fmt: skip
    for rank in range(4):  # node-01 went down in the middle of saving step 200
        node = [world.node1, world.node2][rank // 2]
        checkpoint_event(world.run, node, step=200, rank=rank, tier="durable", state="started")
        if rank >= 2:
            checkpoint_event(world.run, node, step=200, rank=rank, tier="durable",
                             state="completed")  # fmt: skip
    node_mark_down(node_id=world.node1.pk)
    plan = run_plan(run=world.run)
    assert plan["checkpoint"]["step"] == 100  # its completed saves stay usable
    assert plan["skipped"][0]["step"] == 200
    assert plan["skipped"][0]["why"] == (
        "rank 0 started saving it and has not completed (its node node-01 is down)"
    )
    assert plan["nodes"] == ["node-02"]
    assert plan["nodes_skipped"] == [
        {"node": "node-01", "state": "down", "why": "down: it went silent (heartbeat)"}
    ]
