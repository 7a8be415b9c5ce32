"""The auto-cordon policy: off by default; when on, a critical hardware alert (uncorrectable
ECC, an XID whose catalog action is a reset or an RMA, SDC confirmed at two checks) issues
a cordon of its node within the evaluation pass that opened it, through the cordon service;
the scheduler hook runs in the live stack's worker (never in the pass), audited as done by
the policy; it never overrules a person."""

from __future__ import annotations

import json
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from apps.alerts.models import Alert
from apps.alerts.services import alerts_evaluate
from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import AutoCordonPolicy, ClusterHooks, Command
from apps.commands.services import command_issue, critical_finding
from apps.core.signals import alert_raised
from apps.runs.changes import steps_mark_changed
from apps.runs.models import Run, RunEvent, StepReport
from tests.commands.conftest import settled

HOOK = """#!{python}
import json, sys
with open({record!r}, "a") as record:
    record.write(json.dumps(sys.argv[1:]) + "\\n")
"""

SLOW_HOOK = """#!{python}
import json, sys, time
time.sleep(6)
with open({record!r}, "a") as record:
    record.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def hook_calls(live_stack, world, tmp_path) -> Path:
    """The cluster's cordon hook: a real executable recording its arguments in the file."""
    record = tmp_path / "calls.jsonl"
    script = tmp_path / "scontrol"
    script.write_text(HOOK.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    ClusterHooks.objects.create(
        cluster=world.cluster, cordon_argv=[str(script), "drain", "{node}", "{reason}"]
    )
    return record


def calls(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def policy_on(world, **fields) -> AutoCordonPolicy:
    return AutoCordonPolicy.objects.create(cluster=world.cluster, enabled=True, **fields)


def event(world, node: Node, kind: str, gpu: int = 0, **data) -> None:
    RunEvent.objects.create(
        cluster=world.cluster, node=node, ts=datetime.now(UTC), kind=kind, gpu=gpu, data=data
    )


def evaluate(world) -> None:
    """An evaluation pass, then the worker's carrying out of the commands it issued."""
    alerts_evaluate(cluster=world.cluster, now=time.time())
    settled(world.cluster)


def issue_now(world, **fields) -> None:
    command_issue(
        user=world.operator, cluster=world.cluster, idempotency_key=uuid.uuid4().hex, **fields
    )
    settled(world.cluster)


def state(node: Node) -> str:
    return Node.objects.get(pk=node.pk).state


def test_the_policy_is_off_by_default(world, hook_calls):
    AutoCordonPolicy.objects.create(cluster=world.cluster)  # a policy row, not enabled
    event(world, world.node1, "ecc", count=2, uncorrectable=True)
    evaluate(world)
    assert Alert.objects.get(kind="ecc").severity == "critical"
    assert state(world.node1) == "active"
    assert calls(hook_calls) == []
    assert not Command.objects.filter(kind="cordon").exists()


def test_without_a_policy_nothing_is_cordoned(world, hook_calls):
    event(world, world.node1, "ecc", count=2, uncorrectable=True)
    evaluate(world)
    assert Alert.objects.filter(kind="ecc").exists()
    assert state(world.node1) == "active"


def test_uncorrectable_ecc_cordons_within_the_pass(world, hook_calls):
    policy_on(world)
    event(world, world.node1, "ecc", count=2, uncorrectable=True)
    evaluate(world)
    alert = Alert.objects.get(kind="ecc")
    node = Node.objects.get(pk=world.node1.pk)
    assert node.state == "cordoned" and node.cordoned_by is None
    assert node.cordon_reason.startswith(f"alert {alert.pk} (ecc): ")
    assert state(world.node2) == "active"
    [call] = calls(hook_calls)
    assert call[:2] == ["drain", "node-01"] and "uncorrectable ECC" in call[2]
    command = Command.objects.get(kind="cordon")
    assert (command.state, command.issued_by, command.args) == (
        "succeeded", None, {"alert": alert.pk, "finding": "ecc"}
    )  # fmt: skip
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert (entry.actor_kind, entry.actor_name, entry.outcome) == (
        "policy", "auto-cordon", "succeeded"
    )  # fmt: skip
    assert entry.reason == node.cordon_reason and entry.detail["hook"]["exit_code"] == 0
    issued = AuditEntry.objects.get(action="command.cordon", cluster_id=world.cluster.pk)
    assert issued.actor_kind == "policy"


def test_the_pass_issues_the_cordon_and_never_waits_for_the_hook(live_stack, world, tmp_path):
    record = tmp_path / "calls.jsonl"
    script = tmp_path / "slow-scontrol"
    script.write_text(SLOW_HOOK.format(python=sys.executable, record=str(record)))
    script.chmod(0o755)
    ClusterHooks.objects.create(cluster=world.cluster, cordon_argv=[str(script), "{node}"])
    policy_on(world)
    event(world, world.node1, "ecc", count=2, uncorrectable=True)
    began = time.monotonic()
    alerts_evaluate(cluster=world.cluster, now=time.time())
    took = time.monotonic() - began
    command = Command.objects.get(kind="cordon")
    assert command.state == "issued" and took < 4.0, took
    assert state(world.node1) == "active"  # until the hook agreed
    settled(world.cluster)
    assert Command.objects.get(pk=command.pk).state == "succeeded"
    assert state(world.node1) == "cordoned" and calls(record) == [["node-01"]]


def test_a_corrected_ecc_error_does_not_cordon(world, hook_calls):
    policy_on(world)
    event(world, world.node1, "ecc", count=5, uncorrectable=False)
    evaluate(world)
    assert not Alert.objects.filter(kind="ecc").exists()
    assert state(world.node1) == "active"


def test_an_xid_whose_action_is_a_reboot_cordons(world, hook_calls):
    policy_on(world)
    event(world, world.node2, "xid", gpu=3, code=79, message="GPU has fallen off the bus")
    evaluate(world)
    alert = Alert.objects.get(kind="xid")
    assert alert.evidence["recommended_action"] == "RESTART_BM"
    assert state(world.node2) == "cordoned" and state(world.node1) == "active"
    assert calls(hook_calls)[0][:2] == ["drain", "node-02"]


@pytest.mark.parametrize("code", [13, 43, 63])  # restart the app, ignore, ignore
def test_a_benign_xid_does_not_cordon(world, hook_calls, code):
    policy_on(world)
    event(world, world.node1, "xid", code=code)
    evaluate(world)
    assert Alert.objects.get(kind="xid").evidence["code"] == code
    assert state(world.node1) == "active"
    assert calls(hook_calls) == []


def test_a_kind_the_policy_leaves_out_does_not_cordon(world, hook_calls):
    policy_on(world, on_xid=False)
    event(world, world.node1, "xid", code=79)
    evaluate(world)
    assert Alert.objects.get(kind="xid").severity == "critical"
    assert state(world.node1) == "active"


def test_a_non_hardware_critical_alert_does_not_cordon(world, hook_calls):
    policy_on(world)
    alert = {
        "id": 10**9, "cluster_id": world.cluster.pk, "node_id": world.node1.pk, "run_id": None,
        "kind": "thermal", "subject": "node:node-01/gpu:0", "severity": "critical",
        "summary": "GPU 0 of node-01 at 92 °C", "evidence": {"temp": 92}, "event": "opened",
    }  # fmt: skip
    alert_raised.send(sender=Alert, alert=alert)
    assert state(world.node1) == "active"
    assert not Command.objects.exists()


def test_a_person_who_uncordons_is_not_overruled_for_the_same_alert(world, hook_calls):
    policy_on(world)
    event(world, world.node1, "xid", code=79)
    evaluate(world)
    assert state(world.node1) == "cordoned"
    issue_now(world, kind="uncordon", node=world.node1, reason="GPU reseated, burn-in passed")
    assert state(world.node1) == "active"
    # the condition goes on (another XID 79 on that GPU): the alert stays open, a new pass
    event(world, world.node1, "xid", code=79)
    evaluate(world)
    alert = Alert.objects.get(kind="xid")
    assert alert.state == "firing" and alert.evidence["count"] == 2
    # and were the alert announced again (an escalation), its one cordon stays its only one
    alert_raised.send(sender=Alert, alert={**_payload(alert), "event": "escalated"})
    assert state(world.node1) == "active"
    assert Command.objects.filter(kind="cordon").count() == 1
    assert len(calls(hook_calls)) == 1


def test_a_person_s_cordon_stands(world, hook_calls):
    policy_on(world)
    issue_now(world, kind="cordon", node=world.node1, reason="ticket 7")
    event(world, world.node1, "ecc", count=1)
    evaluate(world)
    node = Node.objects.get(pk=world.node1.pk)
    assert (node.state, node.cordon_reason, node.cordoned_by) == (
        "cordoned", "ticket 7", world.operator
    )  # fmt: skip
    assert Command.objects.filter(kind="cordon").count() == 1


def test_a_failing_hook_leaves_the_node_and_the_failure_audited(live_stack, world, tmp_path):
    ClusterHooks.objects.create(cluster=world.cluster, cordon_argv=["false", "{node}"])
    policy_on(world)
    event(world, world.node1, "ecc", count=1)
    evaluate(world)
    assert state(world.node1) == "active"
    assert Command.objects.get(kind="cordon").state == "failed"
    entry = AuditEntry.objects.get(action="node.cordon", cluster_id=world.cluster.pk)
    assert (entry.actor_kind, entry.outcome) == ("policy", "failed")


def checked_step(world, step: int, odd_rank: int | None) -> None:
    """Step `step` of run-1 by ranks 0-3 (node-01: 0, 1; node-02: 2, 3) with gradient
    checksums; `odd_rank` disagrees with its replicas."""
    now = datetime.now(UTC)
    for rank in range(4):
        StepReport.objects.create(
            run=world.run, node=world.node1 if rank < 2 else world.node2, ts=now, rank=rank,
            step=step, step_time=1.0, grad_checksum="bad" if rank == odd_rank else "good",
        )  # fmt: skip
    Run.objects.filter(pk=world.run.pk).update(last_step=step, last_step_at=now)
    steps_mark_changed(steps={world.run.pk: (step, step)})  # as steps_store does


def test_sdc_cordons_once_confirmed_at_two_checks(world, hook_calls):
    policy_on(world)
    checked_step(world, 110, odd_rank=3)
    evaluate(world)
    alert = Alert.objects.get(kind="sdc")
    assert alert.severity == "warning"  # one check: not confirmed
    assert state(world.node2) == "active"
    checked_step(world, 120, odd_rank=3)
    evaluate(world)
    alert.refresh_from_db()
    assert alert.severity == "critical" and alert.evidence["checks_disagreed"] == 2
    assert state(world.node2) == "cordoned" and state(world.node1) == "active"
    assert Command.objects.get(kind="cordon").args["finding"] == "sdc"


def _payload(alert: Alert) -> dict:
    fields = ["id", "cluster_id", "node_id", "run_id", "kind", "subject", "severity", "summary"]
    return {**{name: getattr(alert, name) for name in fields}, "evidence": alert.evidence}


@pytest.mark.parametrize(
    ("kind", "severity", "evidence", "expected"),
    [
        ("ecc", "critical", {"uncorrectable": 1}, "ecc"),
        ("xid", "critical", {"code": 79, "recommended_action": "RESTART_BM"}, "xid"),
        ("xid", "critical", {"code": 95, "recommended_action": "RESET_GPU"}, "xid"),
        ("xid", "critical", {"code": 48, "recommended_action": "WORKFLOW_XID_48"}, "xid"),
        ("xid", "critical", {"code": 74, "recommended_action": "WORKFLOW_NVLINK_ERR"}, "xid"),
        ("xid", "critical", {"code": 1, "recommended_action": "UNEXPECTED_ERR_REPORT_ISSUE"}, None),
        ("xid", "warning", {"code": 13, "recommended_action": "RESTART_APP"}, None),
        ("sdc", "critical", {"checks_disagreed": 2, "ambiguous": False}, "sdc"),
        ("sdc", "critical", {"checks_disagreed": 2, "ambiguous": True}, None),
        ("sdc", "warning", {"checks_disagreed": 1, "ambiguous": False}, None),
        ("thermal", "critical", {}, None),
        ("heartbeat", "critical", {}, None),
    ],
)
def test_which_findings_are_critical_hardware(kind, severity, evidence, expected):
    assert critical_finding({"kind": kind, "severity": severity, "evidence": evidence}) == expected
