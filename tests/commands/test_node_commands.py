"""Node commands off the request path and serialised per node: the API answers 202 before
the scheduler hook ends, the worker's task runs it; concurrent cordons and uncordons leave
the hook's last call and the node's state agreeing; a drain is never overwritten (409) and
never doubled (the second returns the first); a hook past its timeout leaves no process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

from django.utils import timezone

from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import ClusterHooks, Command
from apps.commands.services import (
    command_ack,
    command_create,
    command_issue,
    commands_sweep,
    node_command_carry_out,
)
from apps.commands.services.nodes import hook_run
from tests.commands.conftest import carried_out, client, issue, settled

HOOK = """#!{python}
import json, sys, time
with open({record!r}, "a") as record:
    record.write(json.dumps([sys.argv[1], "start", time.time()]) + "\\n")
time.sleep({sleep})
with open({record!r}, "a") as record:
    record.write(json.dumps([sys.argv[1], "end", time.time()]) + "\\n")
"""


def hooks(world, tmp_path: Path, sleep: float = 0.0, timeout_s: float = 30.0) -> Path:
    """Cordon and uncordon hooks: one script that notes its start and its end with the
    verb it was called for. Returns the file where those notes land."""
    record = tmp_path / "hook.jsonl"
    script = tmp_path / "hook"
    script.write_text(HOOK.format(python=sys.executable, record=str(record), sleep=sleep))
    script.chmod(0o755)
    ClusterHooks.objects.create(
        cluster=world.cluster,
        cordon_argv=[str(script), "cordon", "{node}"],
        uncordon_argv=[str(script), "uncordon", "{node}"],
        timeout_s=timeout_s,
    )
    return record


def notes(record: Path) -> list[list]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_the_api_answers_202_before_a_slow_hook_finishes(live_stack, world, tmp_path):
    record = hooks(world, tmp_path, sleep=4.0)
    with client(live_stack, world.operator_secret) as operator:
        began = time.monotonic()
        answer = issue(operator, kind="cordon", node="node-01", reason="flaky NIC")
        took = time.monotonic() - began
        assert answer.status_code == 202, answer.text
        assert answer.json()["state"] == "issued" and took < 3.0
        assert not any(verb == "cordon" and when == "end" for verb, when, _ in notes(record))
        command_id = answer.json()["id"]
        deadline = time.monotonic() + 60
        while (body := operator.get(f"/api/v1/commands/{command_id}").json())["state"] == "issued":
            assert time.monotonic() < deadline, body
            time.sleep(0.2)
    # the outcome, later, as the state of the command: the hook's result in it
    assert body["state"] == "succeeded" and body["result"]["hook"]["exit_code"] == 0
    assert [when for _, when, _ in notes(record)] == ["start", "end"]
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert (entry.outcome, entry.actor_name) == ("succeeded", "olga")


def test_concurrent_cordons_and_uncordons_leave_the_hook_and_the_node_agreeing(
    live_stack, world, tmp_path
):
    record = hooks(world, tmp_path, sleep=0.3)
    for round_ in range(3):
        barrier = threading.Barrier(4)
        answers: list[int] = []

        def send(kind: str, barrier=barrier, answers=answers) -> None:
            with client(live_stack, world.operator_secret) as operator:
                barrier.wait()
                answers.append(issue(operator, kind=kind, node="node-01", reason="r").status_code)

        threads = [threading.Thread(target=send, args=(k,)) for k in ["cordon", "uncordon"] * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert answers == [202] * 4, answers
        settled(world.cluster)
        seen = notes(record)
        # one hook at a time: every start is followed by its own end before the next start
        assert all(
            seen[i][1] == "start" and seen[i + 1][1] == "end" and seen[i][0] == seen[i + 1][0]
            for i in range(0, len(seen), 2)
        ), seen
        assert len(seen) == 8 * (round_ + 1)
        last_verb = seen[-1][0]
        node = Node.objects.get(pk=world.node1.pk)
        assert node.state == {"cordon": "cordoned", "uncordon": "active"}[last_verb], round_
        # and the last command carried out is the last one issued (one node, issue order)
        newest = Command.objects.filter(node=world.node1).order_by("-issued_at").first()
        assert newest.kind == last_verb and newest.state == "succeeded"


def test_a_cordon_during_a_drain_is_409_and_a_second_drain_returns_the_first(
    live_stack, world, tmp_path
):
    hooks(world, tmp_path)
    with client(live_stack, world.operator_secret) as operator:
        drain = issue(operator, kind="drain", node="node-01", reason="XID 79")
        # refused while the drain is still issued (its task has not run) ...
        early = issue(operator, kind="cordon", node="node-01", reason="mine")
        again = issue(operator, kind="drain", node="node-01", reason="XID 79 again")
        settled(world.cluster)
        # ... and while it runs: node-01 serves run-1, so the drain waits for a checkpoint
        late = issue(operator, kind="uncordon", node="node-01")
        third = issue(operator, kind="drain", node="node-01", reason="once more")
        other = issue(operator, kind="cordon", node="node-02", reason="not draining")
    assert drain.status_code == 202, drain.text
    for refused in (early, late):
        assert refused.status_code == 409, refused.text
        assert refused.json()["errors"][0]["loc"] == "node"
        assert "draining" in refused.json()["errors"][0]["msg"]
    for folded in (again, third):
        assert folded.status_code == 200 and folded.json()["id"] == drain.json()["id"]
    assert other.status_code == 202
    assert Command.objects.filter(kind="drain").count() == 1
    assert Command.objects.get(pk=drain.json()["id"]).state == "accepted"
    assert not Command.objects.filter(node=world.node1, kind__in=["cordon", "uncordon"]).exists()
    assert Node.objects.get(pk=world.node1.pk).state == "draining"
    denied = AuditEntry.objects.filter(
        outcome="denied", target="node:node-01", cluster_id=world.cluster.pk
    )
    assert sorted(denied.values_list("action", flat=True)) == ["command.cordon", "command.uncordon"]


GRANDPARENT = """#!{python}
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", {marker!r}])
with open({pids!r}, "w") as pids:
    pids.write(f"{{os.getpid()}} {{child.pid}}")
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (one waiting only to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _with_marker(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_a_hook_past_its_timeout_leaves_no_process(world, tmp_path):
    marker = f"opsboard-hook-test-{uuid.uuid4().hex}"
    pids = tmp_path / "pids"
    script = tmp_path / "hook"
    script.write_text(GRANDPARENT.format(python=sys.executable, marker=marker, pids=str(pids)))
    script.chmod(0o755)
    ClusterHooks.objects.create(cluster=world.cluster, cordon_argv=[str(script)], timeout_s=2.0)
    result = hook_run(node=world.node1, which="cordon", reason="")
    assert result is not None and "timed out" in result.error
    hook_pid, grandchild = map(int, pids.read_text().split())
    deadline = time.monotonic() + 5  # SIGKILL is delivered at once; reaping may lag
    while (_alive(hook_pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(hook_pid) and not _alive(grandchild)
    assert _with_marker(marker) == []


def test_the_sweep_sends_a_node_command_whose_task_was_lost(live_stack, world):
    # created without its task (a crash between the commit and the enqueue), long ago
    command, _ = command_create(
        cluster_id=world.cluster.pk, kind="cordon", node_id=world.node2.pk,
        idempotency_key=uuid.uuid4().hex, reason="lost",
    )  # fmt: skip
    Command.objects.filter(pk=command.pk).update(issued_at=command.issued_at - timedelta(hours=1))
    Command.objects.filter(pk=command.pk).update(expires_at=command.expires_at + timedelta(hours=1))
    assert carried_out(command).state == "succeeded"
    assert Node.objects.get(pk=world.node2.pk).state == "cordoned"


def test_the_proc_scan_finds_a_live_process_and_not_a_dead_one():
    # so the empty answers above mean "no process", not "the scan sees nothing"
    marker = f"opsboard-scan-test-{uuid.uuid4().hex}"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        # until the child has exec'd, /proc shows it with its parent's command line
        deadline = time.monotonic() + 10
        while _with_marker(marker) != [sleeper.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _with_marker(marker) == [sleeper.pid] and _alive(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _with_marker(marker) == [] and not _alive(sleeper.pid)


def test_down_nodes_leave_the_plan_and_come_back_when_they_report(world):
    from apps.alerts.models import Alert
    from apps.clusters.services import nodes_touch
    from apps.commands.plan import run_plan
    from apps.core.signals import alert_raised

    assert run_plan(run=world.run)["nodes"] == ["node-01", "node-02"]
    Node.objects.filter(pk=world.node1.pk).update(state="cordoned")
    for node in (world.node1, world.node2):  # both went silent: their heartbeat alerts open
        alert = {
            "id": node.pk, "cluster_id": world.cluster.pk, "node_id": node.pk, "run_id": None,
            "kind": "heartbeat", "subject": f"node:{node.name}", "severity": "critical",
            "summary": "silent", "evidence": {}, "event": "opened",
        }  # fmt: skip
        alert_raised.send(sender=Alert, alert=alert)
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"node-01": "cordoned", "node-02": "down"}  # a person's cordon stands
    assert run_plan(run=world.run)["nodes"] == []
    # both report again: the down one is active, the cordoned one stays cordoned
    seen = {(world.cluster.pk, name): (timezone.now(), None) for name in ("node-01", "node-02")}
    nodes_touch(seen=seen)
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"node-01": "cordoned", "node-02": "active"}
    assert run_plan(run=world.run)["nodes"] == ["node-02"]


def _drain_with_checkpoint(world) -> tuple[Command, Command]:
    """A drain of node-01 carried out: accepted, its checkpoint of run-1 issued."""
    drain = command_issue(
        user=world.operator, cluster=world.cluster, kind="drain", node=world.node1,
        reason="XID 79", idempotency_key=uuid.uuid4().hex,
    )[0]  # fmt: skip
    node_command_carry_out(command_id=drain.pk)
    drain = carried_out(drain)  # here, or by a live stack's worker that took it first
    assert drain.state == "accepted"
    return drain, drain.children.get(kind="checkpoint")


def test_the_sweep_runs_a_drain_reaction_that_never_ran(world):
    drain, checkpoint = _drain_with_checkpoint(world)
    # the checkpoint's success committed, and the process died before its reaction ran
    Command.objects.filter(pk=checkpoint.pk).update(state="succeeded")
    assert not drain.children.filter(kind="stop").exists()
    commands_sweep()
    stop = drain.children.get(kind="stop")
    assert (stop.node, stop.run, stop.state) == (world.node1, world.run, "issued")
    commands_sweep()  # again: still one stop (the reaction is judged from the children)
    assert drain.children.filter(kind="stop").count() == 1
    # the stop succeeds, its reaction lost too: the sweep ends the drain, node cordoned
    Command.objects.filter(pk=stop.pk).update(state="succeeded")
    commands_sweep()
    assert Command.objects.get(pk=drain.pk).state == "succeeded"
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"


def test_a_drain_phase_has_its_own_deadline(world, settings):
    drain, checkpoint = _drain_with_checkpoint(world)
    assert checkpoint.expires_at - checkpoint.issued_at == timedelta(
        seconds=settings.COMMANDS_DRAIN_CHECKPOINT_S
    )
    phases = settings.COMMANDS_DRAIN_CHECKPOINT_S + settings.COMMANDS_DRAIN_STOP_S
    assert drain.expires_at - drain.issued_at >= timedelta(seconds=phases - 60)


def test_a_checkpoint_that_succeeds_after_its_drain_expired_sends_no_stop(world):
    drain, checkpoint = _drain_with_checkpoint(world)
    Command.objects.filter(pk=drain.pk).update(expires_at=timezone.now())
    commands_sweep()
    assert Command.objects.get(pk=drain.pk).state == "expired"
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"
    # the agent acks the checkpoint late: it stands, and no stop follows the dead drain
    command_ack(command=Command.objects.get(pk=checkpoint.pk), state="succeeded")
    assert Command.objects.get(pk=checkpoint.pk).state == "succeeded"
    assert not drain.children.filter(kind="stop").exists()
    commands_sweep()
    assert not drain.children.filter(kind="stop").exists()
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"


def test_the_sweep_settles_a_node_left_draining(world):
    drain, _ = _drain_with_checkpoint(world)
    # the drain's end committed, its settling did not
    Command.objects.filter(pk=drain.pk).update(state="failed")
    assert Node.objects.get(pk=world.node1.pk).state == "draining"
    commands_sweep()
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"


def test_ingest_for_a_node_goes_on_while_its_hook_runs(live_stack, world, tmp_path):
    """The carry-out lock is an advisory lock, not the node's row: a batch from the node
    (which updates its row and inserts rows referencing it) is stored during a slow hook."""
    record = hooks(world, tmp_path, sleep=8.0)
    with client(live_stack, world.operator_secret) as operator:
        assert issue(operator, kind="cordon", node="node-01").status_code == 202
    deadline = time.monotonic() + 30
    while not any(when == "start" for _, when, _ in notes(record)):  # the hook is running
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = Node.objects.get(pk=world.node1.pk).last_seen
    batch = {
        "batch_id": uuid.uuid4().hex, "node": "node-01",
        "samples": [{"ts": time.time(), "metric": "gpu.util", "gpu": 0, "value": 50.0}],
    }  # fmt: skip
    with client(live_stack, world.agent_secret) as agent:
        assert agent.post("/api/v1/ingest", json=batch).status_code == 202
    while Node.objects.get(pk=world.node1.pk).last_seen == before:
        assert time.monotonic() < deadline, "ingest waited for the hook"
        time.sleep(0.05)
    assert not any(when == "end" for _, when, _ in notes(record))  # the hook still runs
    assert Node.objects.get(pk=world.node1.pk).state == "active"  # not before it agreed
    settled(world.cluster)
    assert Node.objects.get(pk=world.node1.pk).state == "cordoned"
