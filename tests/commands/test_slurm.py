"""Slurm both ways, against a real Slurm on loopback (tests/commands/slurm.py) with the
ready-made hooks (apps.commands.presets): a cordon issued in Opsboard drains the node in
Slurm with its reason and an uncordon resumes it; a node drained by hand with scontrol is
down in Opsboard within one period of the state poll (the live stack's own beat), with
Slurm's reason on the overview and in the resume plan, and back when Slurm resumes it."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from apps.commands.models import ClusterHooks, MaintenanceVisit
from apps.commands.plan import run_plan
from apps.commands.presets import SLURM, hooks_preset
from launcher.procs import wait_until
from opsboard.tunables import COMMANDS_STATE_HOOK_INTERVAL
from tests.commands.conftest import client, issue, settled
from tests.commands.slurm import NODE, slurm_start

pytestmark = [pytest.mark.stack, pytest.mark.timeout(300)]


@pytest.fixture
def slurm(tmp_path):
    yield from slurm_start(tmp_path / "slurm")


def state(world) -> tuple[str, str]:
    node = Node.objects.get(cluster=world.cluster, name=NODE)
    return node.state, node.down_by


def test_cordon_drains_in_slurm_and_slurm_drains_show_in_opsboard(live_stack, world, slurm):
    ClusterHooks.objects.create(
        cluster=world.cluster, timeout_s=20, **hooks_preset(SLURM, {"SLURM_CONF": str(slurm.conf)})
    )
    with client(live_stack, world.operator_secret) as operator:
        answer = issue(operator, kind="cordon", node=NODE, reason="flaky NIC")
        assert answer.status_code == 202, answer.text
        settled(world.cluster)
        assert slurm.nodes()[NODE] == ("drained", "opsboard: flaky NIC")
        assert state(world) == ("cordoned", "")
        assert AuditEntry.objects.get(
            action="node.cordon", cluster_id=world.cluster.pk
        ).outcome == ("succeeded")

        assert issue(operator, kind="uncordon", node=NODE, reason="fixed").status_code == 202
        settled(world.cluster)
        # Slurm answers the RESUME at once, then shows the node "idle*" (not responding)
        # until its next word with slurmd, under a second later
        wait_until(lambda: slurm.nodes()[NODE] == ("idle", "none"), 10, "the node resumed")
        assert Node.objects.get(cluster=world.cluster, name=NODE).state == "active"

    # drained by hand in Slurm: down in Opsboard within one period of beat's state poll
    slurm.command("scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=bad DIMM")
    drained_at = time.monotonic()
    wait_until(
        lambda: state(world) == ("down", "scheduler"),
        COMMANDS_STATE_HOOK_INTERVAL + 15,
        "the scheduler's drain in Opsboard",
    )
    assert time.monotonic() - drained_at <= COMMANDS_STATE_HOOK_INTERVAL + 15
    entry = AuditEntry.objects.filter(action="node.down", cluster_id=world.cluster.pk).get()
    assert (entry.actor_kind, entry.actor_name) == ("scheduler", "scheduler state hook (sinfo)")
    assert entry.reason == "the scheduler reports it down: bad DIMM"
    # the scheduler's reason (sinfo's %E) on the overview's card and in the resume plan
    assert Node.objects.get(cluster=world.cluster, name=NODE).down_reason == "bad DIMM"
    page = Client()
    page.force_login(world.operator)
    overview = page.get(f"/clusters/{world.cluster.name}/").content.decode()
    assert '<span id="count-scheduler-down">1</span>' in overview
    assert '<p class="node-reason" title="bad DIMM">bad DIMM</p>' in overview
    skipped = run_plan(run=world.run)["nodes_skipped"]
    assert [(s["node"], s["why"]) for s in skipped] == [
        (NODE, "down: the scheduler reports it down: bad DIMM")
    ]

    slurm.command("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
    wait_until(
        lambda: state(world) == ("active", ""),
        COMMANDS_STATE_HOOK_INTERVAL + 15,
        "the scheduler's resume in Opsboard",
    )


def test_maintenance_drains_in_slurm_and_returns_to_service_with_a_note(live_stack, world, slurm):
    """Send to maintenance: the same cordon hook (Slurm drains the node, the reason says
    maintenance), the node `maintenance` until an operator returns it with a note; both
    audited, the stay recorded for the ledger."""
    ClusterHooks.objects.create(
        cluster=world.cluster, timeout_s=20, **hooks_preset(SLURM, {"SLURM_CONF": str(slurm.conf)})
    )
    with client(live_stack, world.operator_secret) as operator:
        answer = issue(operator, kind="maintenance", node=NODE, reason="XID 79 twice a week")
        assert answer.status_code == 202, answer.text
        settled(world.cluster)
        assert slurm.nodes()[NODE] == ("drained", "opsboard: maintenance: XID 79 twice a week")
        assert state(world) == ("maintenance", "")
        skipped = run_plan(run=world.run)["nodes_skipped"]
        assert [(s["node"], s["why"]) for s in skipped] == [
            (NODE, "in maintenance: XID 79 twice a week")
        ]

        refused = issue(operator, kind="uncordon", node=NODE)
        assert refused.status_code == 400
        assert refused.json()["errors"][0]["loc"] == "reason"
        assert state(world) == ("maintenance", "")

        back = issue(operator, kind="uncordon", node=NODE, reason="GPU 3 replaced, RMA 77")
        assert back.status_code == 202, back.text
        settled(world.cluster)
        wait_until(lambda: slurm.nodes()[NODE] == ("idle", "none"), 10, "the node resumed")
        assert state(world) == ("active", "")
    visit = MaintenanceVisit.objects.get(node__name=NODE, cluster=world.cluster)
    assert (visit.reason, visit.return_note) == (
        "XID 79 twice a week", "GPU 3 replaced, RMA 77"
    )  # fmt: skip
    assert visit.sent_by == visit.returned_by == world.operator and visit.returned_at
    outcomes = dict(
        AuditEntry.objects.filter(cluster_id=world.cluster.pk, action__startswith="node.")
        .values_list("action", "outcome")
    )  # fmt: skip
    assert outcomes == {"node.maintenance": "succeeded", "node.uncordon": "succeeded"}
    invalid = AuditEntry.objects.get(
        cluster_id=world.cluster.pk, action="command.uncordon", outcome="invalid"
    )
    assert invalid.detail["loc"] == "reason"
