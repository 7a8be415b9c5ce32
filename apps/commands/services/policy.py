"""The auto-cordon policy: a critical hardware alert cordons its node, through the same
service as an operator's cordon, audited as done by the policy.

It acts once per alert (the alert's id is the cordon command's idempotency key), when the
alert opens or escalates (apps.core.signals.alert_raised); it never uncordons. So a person
who uncordons a node is not overruled for an alert that is still open: only a new alert (the
condition came back after its alert resolved, or another GPU / code) cordons again."""

from __future__ import annotations

import logging
from typing import Any

from apps.clusters.choices import OUT_OF_PLANS
from apps.clusters.models import Node
from apps.commands.choices import IDEMPOTENCY_SYSTEM, LIVE_STATES, CommandKind
from apps.commands.models import AutoCordonPolicy, Command
from apps.commands.services.issue import command_issue
from apps.commands.services.node_commands import NodeBusy

logger = logging.getLogger(__name__)

POLICY_ACTOR = {"user": None, "actor_kind": "policy", "actor_name": "auto-cordon"}
# The XID catalog's recommended actions (detectors/data/xid_catalog.csv, NVSentinel's) that
# take the GPU out of service: a GPU reset, a bare-metal reboot with replacement (RMA) if
# it recurs, and the workflows whose remedy is a reset (48: DBE, NVLink errors). Restarting
# the application or the VM, ignoring, or reporting an issue leave the node in service.
XID_RESET_OR_RMA = frozenset(
    {"RESET_GPU", "RESTART_BM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR", "WORKFLOW_NVLINK5_ERR"}
)
# Silent data corruption counts once a rank disagreed with a majority of its replicas at
# this many checked steps (one disagreement may be a fluke; a split without a majority does
# not say which node is bad).
SDC_CONFIRMED_CHECKS = 2


def critical_finding(alert: dict[str, Any]) -> str | None:
    """Which critical hardware finding the alert is (ecc | xid | sdc), or None. `alert` is
    the alert_raised payload (plain data)."""
    evidence = alert.get("evidence") or {}
    critical = alert.get("severity") == "critical"
    if alert.get("kind") == "ecc" and critical:
        return "ecc"  # the ecc detector reports uncorrectable errors only
    if alert.get("kind") == "xid" and evidence.get("recommended_action") in XID_RESET_OR_RMA:
        return "xid"
    if (
        alert.get("kind") == "sdc"
        and critical
        and not evidence.get("ambiguous")
        and int(evidence.get("checks_disagreed") or 0) >= SDC_CONFIRMED_CHECKS
    ):
        return "sdc"
    return None


def policy_key(alert_id: int) -> str:
    """The idempotency key of the cordon an alert causes: one per alert, ever (a system key:
    it never expires, and no request's key can name it)."""
    return f"policy:alert:{alert_id}"


def policy_apply(*, alert: dict[str, Any]) -> Command | None:
    """Cordon the alert's node if its cluster's policy covers the alert (see
    critical_finding) and the node is neither cordoned nor draining already (a person's
    cordon or drain stands, with its reason). Returns the cordon command, issued: the
    scheduler hook runs in a task (commands.node_carry_out), never in the detector pass that
    called this; or None when the policy did nothing. Audited
    as `command.cordon` and `node.cordon` by actor kind "policy", the alert as reason."""
    finding = critical_finding(alert)
    if finding is None or alert.get("node_id") is None:
        return None
    policy = AutoCordonPolicy.objects.filter(cluster_id=alert["cluster_id"]).first()
    if policy is None or not policy.covers(finding):
        return None
    key = policy_key(alert["id"])
    mine = Command.objects.filter(idempotency_scope=IDEMPOTENCY_SYSTEM, idempotency_key=key)
    if mine.filter(cluster_id=alert["cluster_id"]).exists():
        return None  # this alert acted already (it escalated after opening, say)
    node = Node.objects.select_related("cluster").filter(pk=alert["node_id"]).first()
    if node is None or node.state in OUT_OF_PLANS:
        return None
    if Command.objects.filter(
        node_id=node.pk, kind__in=[CommandKind.CORDON, CommandKind.DRAIN], state__in=LIVE_STATES
    ).exists():
        return None  # a person's cordon or drain is on its way: it stands
    try:
        command = command_issue(
            cluster=node.cluster,
            kind=CommandKind.CORDON,
            node=node,
            reason=f"alert {alert['id']} ({alert['kind']}): {alert.get('summary', '')}"[:2000],
            args={"alert": alert["id"], "finding": finding},
            idempotency_key=key,
            **POLICY_ACTOR,
        )[0]
    except NodeBusy:  # a drain was issued and has not started: it cordons the node
        return None
    logger.warning("auto-cordon: %s %s after alert %s", node, command.state, alert["id"])
    return command


def on_alert_raised(sender: Any, *, alert: dict[str, Any], **kwargs: Any) -> None:
    """apps.core.signals.alert_raised receiver (connected in CommandsConfig.ready)."""
    policy_apply(alert=alert)
