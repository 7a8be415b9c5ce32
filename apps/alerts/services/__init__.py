"""Alert writes: keep alerts in step with the detectors' findings, acknowledge, notify.

Every change commits first; then (on commit, services/announce.py) it is broadcast to the
cluster's Channels group as {"type": "alert.changed", "alert": {...}} and its webhook
deliveries, written in the same transaction, are handed to Celery.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from apps.access.services import attempt_hidden_record
from apps.alerts.choices import (
    OPEN_STATES,
    PERIODIC_SKIPS_KEY,
    SEVERITY_RANK,
    AlertEvent,
    AlertState,
)
from apps.alerts.models import (
    Alert,
    DetectorPass,
)
from apps.alerts.selectors import (
    cluster_window,
    clusters_to_evaluate,
    detector_config,
)
from apps.alerts.selectors.kept import kept_window
from apps.alerts.services.ageing import (
    AlertNotFiring,
    alert_silence,
    alert_silence_authorize,
    alerts_age,
)
from apps.alerts.services.announce import alerts_announce
from apps.alerts.services.authorize import alert_act_authorize
from apps.alerts.services.incidents import incidents_fold
from apps.alerts.services.periodic import pass_lock, periodic_skip_count
from apps.alerts.services.retention import AlertsPruned, alerts_prune
from apps.alerts.services.webhooks import (  # re-exported: the services' one entry point
    WEBHOOK_DELIVER_TASK,
    WEBHOOK_SWEEP_AGE_S,
    WebhookFailed,
    alertmanager_resend,
    slack_escape,
    webhook_deliver,
    webhooks_sweep,
)
from apps.audit.choices import AuditAction, Outcome
from apps.audit.services import audit_record
from apps.clusters.models import Cluster, Node
from apps.core.heap import gc_paused
from apps.core.tasks import task_enqueue
from apps.runs.choices import ENDED_STATES
from apps.runs.models import Run
from detectors.types import Finding

__all__ = [
    "AlertNotFiring",
    "alert_silence",
    "alert_silence_authorize",
    "alerts_age",
    "AlertsPruned",
    "PERIODIC_SKIPS_KEY",
    "WEBHOOK_DELIVER_TASK",
    "WEBHOOK_SWEEP_AGE_S",
    "WebhookFailed",
    "alerts_prune",
    "periodic_skip_count",
    "alertmanager_resend",
    "slack_escape",
    "webhook_deliver",
]

logger = logging.getLogger(__name__)

# Kinds whose condition ends for good when the finding stops (the node is back): no hold-down.
RESOLVE_AT_ONCE = frozenset({"heartbeat"})
# pg_advisory_xact_lock(namespace, cluster id) serialises the syncs of one cluster.
SYNC_LOCK_NAMESPACE = 0x616C7274  # "alrt"
# One cluster's periodic pass (alerts.tasks.evaluate_cluster), sent by beat's tick.
EVALUATE_CLUSTER_TASK = "alerts.evaluate_cluster"
# A cluster's pass holds its lock at most this long (a worker killed in a pass blocks the
# cluster's next passes for at most this long; a pass this slow is already badly late).
EVALUATE_LOCK_TTL_S = 60


class AlertResolved(Exception):
    """The alert resolved before the operator acknowledged it."""

    def __init__(self, alert: Alert) -> None:
        super().__init__("the alert is already resolved")
        self.alert = alert


class AlertAlreadyAcknowledged(Exception):
    """Someone else acknowledged the alert first."""

    def __init__(self, alert: Alert) -> None:
        by = alert.acknowledged_by.get_username() if alert.acknowledged_by else "someone"
        at = alert.acknowledged_at.isoformat() if alert.acknowledged_at else "?"
        super().__init__(f"already acknowledged by {by} at {at}")
        self.alert = alert


@dataclass
class SyncResult:
    opened: list[int] = field(default_factory=list)
    escalated: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    resolved: list[int] = field(default_factory=list)


def alerts_sync(*, cluster: Cluster, findings: Iterable[Finding], now: float) -> SyncResult:
    """Make the cluster's open alerts match the findings of an evaluation at `now`.

    Guarantees: a new (kind, subject) opens one alert (one open alert per key, even under
    concurrent syncs); an open alert's summary, evidence and last_seen_at follow its finding
    and its severity only rises (escalation); an open alert without a finding resolves once
    its last finding is ALERT_HOLD_DOWN_S old (kinds in RESOLVE_AT_ONCE: at once). An
    acknowledgement is never undone here."""
    latest = _strongest(findings)
    node_ids = dict(
        Node.objects.filter(
            cluster=cluster, name__in={f.node for f in latest.values() if f.node}
        ).values_list("name", "id")
    )
    run_ids = dict(
        Run.objects.filter(
            cluster=cluster, name__in={f.run for f in latest.values() if f.run}
        ).values_list("name", "id")
    )
    at = datetime.fromtimestamp(now, UTC)
    result = SyncResult()
    changes: list[tuple[int, str | None]] = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", [SYNC_LOCK_NAMESPACE, cluster.pk]
            )
        open_alerts = {
            (alert.kind, alert.subject): alert
            for alert in Alert.objects.filter(cluster=cluster, state__in=OPEN_STATES)
        }
        unfolded = any(alert.incident_id is None for alert in open_alerts.values())
        updates: list[tuple[int, str, str, str]] = []
        for key, finding in latest.items():
            alert = open_alerts.pop(key, None)
            if alert is None:
                alert = Alert.objects.create(
                    cluster=cluster,
                    kind=finding.kind,
                    subject=finding.subject,
                    severity=finding.severity,
                    run_id=run_ids.get(finding.run or ""),
                    node_id=node_ids.get(finding.node or ""),
                    rank=finding.rank,
                    gpu=finding.gpu,
                    summary=finding.summary,
                    evidence=_plain(finding.evidence),
                    opened_at=at,
                    last_seen_at=at,
                )
                result.opened.append(alert.pk)
                changes.append((alert.pk, AlertEvent.OPENED))
                continue
            escalates = SEVERITY_RANK[finding.severity] > SEVERITY_RANK[alert.severity]
            visible = escalates or finding.summary != alert.summary
            severity = finding.severity if escalates else alert.severity
            updates.append(
                (alert.pk, severity, finding.summary, json.dumps(_plain(finding.evidence)))
            )
            if escalates:
                result.escalated.append(alert.pk)
                changes.append((alert.pk, AlertEvent.ESCALATED))
            elif visible:
                result.updated.append(alert.pk)
                changes.append((alert.pk, None))
        _open_alerts_follow(updates, at=at)
        ended = _ended_runs(alert.run_id for alert in open_alerts.values())
        due = [
            alert.pk
            for alert in open_alerts.values()
            # A run that ended (run_end) is not evaluated any more: its alerts resolve at once.
            if now - alert.last_seen_at.timestamp()
            >= (0.0 if alert.kind in RESOLVE_AT_ONCE or alert.run_id in ended
                else settings.ALERT_HOLD_DOWN_S)
        ]  # fmt: skip
        for pk in _open_alerts_resolve(due, at=at):
            result.resolved.append(pk)
            changes.append((pk, AlertEvent.RESOLVED))
        # only an alert opening or resolving moves incidents (services/incidents.py), or one
        # open from before incidents were folded
        moved = result.opened or result.resolved or unfolded
        folded = incidents_fold(cluster=cluster, at=at) if moved else None
        alerts_announce(cluster=cluster, changes=changes, incidents=folded)
    return result


def alert_acknowledge_authorize(
    *, user: Any, alert: Alert, note: str = "", request: Any = None
) -> bool:
    """Whether the user may acknowledge the alert (operate on its cluster); a refusal is
    recorded in the audit log (an allowed attempt is recorded by alert_acknowledge)."""
    return alert_act_authorize(
        user=user, alert=alert, action=AuditAction.ALERT_ACKNOWLEDGE, reason=note, request=request
    )


def alert_acknowledge_hidden(*, user: Any, alert_id: int, request: Any = None) -> None:
    """An acknowledgement answered 404 (the alert is in a cluster the user holds no role in,
    or does not exist): recorded as denied in the alert's cluster's audit log."""
    attempt_hidden_record(
        user=user,
        action=AuditAction.ALERT_ACKNOWLEDGE,
        target=f"alert:{alert_id}",
        clusters=Cluster.objects.filter(alerts__pk=alert_id),
        request=request,
    )


def alert_acknowledge(*, alert: Alert, user: Any, note: str = "", request: Any = None) -> Alert:
    """Acknowledge a firing alert, recording who, when and why in the audit log.

    Of concurrent acknowledgements exactly one wins; the others raise
    AlertAlreadyAcknowledged (naming the winner), and a resolved alert raises AlertResolved.
    The caller checks the permission (apps.access: operate on the alert's cluster)."""
    at = timezone.now()
    with transaction.atomic():
        won = Alert.objects.filter(pk=alert.pk, state=AlertState.FIRING).update(
            state=AlertState.ACKNOWLEDGED, acknowledged_at=at, acknowledged_by=user, ack_note=note
        )
        current = Alert.objects.select_related("cluster", "acknowledged_by").get(pk=alert.pk)
        if not won:
            if current.state == AlertState.RESOLVED:
                raise AlertResolved(current)
            raise AlertAlreadyAcknowledged(current)
        audit_record(
            action=AuditAction.ALERT_ACKNOWLEDGE, outcome=Outcome.SUCCEEDED, actor_user=user,
            cluster=current.cluster, target=f"alert:{current.pk}", reason=note, request=request,
        )  # fmt: skip
        alerts_announce(cluster=current.cluster, changes=[(current.pk, AlertEvent.ACKNOWLEDGED)])
    return current


def alerts_evaluate(*, cluster: Cluster, now: float, as_of: bool = False) -> SyncResult | None:
    """Load the cluster's window, run every detector, keep the findings as alerts. None when
    the detectors are not installed (open alerts are then left as they are). `as_of`: the
    window as it stood at a past `now` (replaying a scenario, see selectors.replay); a live
    pass (not `as_of`) is recorded as the cluster's DetectorPass."""
    try:
        from detectors import detect_all
    except ImportError:
        logger.warning("detectors.detect_all is unavailable; alerts are not evaluated")
        return None
    started = time.perf_counter()
    # A live pass keeps its steps (and the detectors' per-step results) for this worker's
    # next pass over the cluster; a replay is as of another moment each time.
    kept = None if as_of else kept_window(cluster_id=cluster.pk)
    with gc_paused():
        window = cluster_window(cluster=cluster, now=now, as_of=as_of, kept=kept)
        config = detector_config(cluster=cluster)
        findings = detect_all(window, now, config=config, kept=kept.results if kept else None)
        del window  # freed with the collector still off (see gc_paused)
    result = alerts_sync(cluster=cluster, findings=findings, now=now)
    if not as_of:
        DetectorPass.objects.update_or_create(
            cluster=cluster,
            defaults={
                "ran_at": timezone.now(),
                "duration_s": time.perf_counter() - started,
                "findings": len(findings),
            },
        )
    return result


def alerts_evaluate_all(*, now: float) -> int:
    """Beat's tick: send one pass per cluster with recent data or open alerts
    (EVALUATE_CLUSTER_TASK, for any periodic worker to take), then sweep webhook deliveries
    never enqueued; returns how many passes were sent. Each expires when the next tick is
    due: behind a busy queue a stale pass is counted (opsboard.celery), not piled up, and
    the next tick's pass reads the window as of its own time."""
    sent = 0
    for cluster in clusters_to_evaluate(now=now):
        task_enqueue(EVALUATE_CLUSTER_TASK, cluster.pk, expires=settings.ALERT_EVALUATE_INTERVAL)
        sent += 1
    webhooks_sweep(now=now)
    return sent


def alerts_evaluate_cluster(*, cluster_id: int, now: float) -> bool:
    """One cluster's periodic pass, under the cluster's own lock: True when it ran. While
    the cluster's previous pass still runs this one is skipped (False) and counted, in the
    skip counts and the cluster's DetectorPass.skipped: the running pass, or the next,
    evaluates at its own `now`, so nothing is left unevaluated. A slow cluster holds only
    its own lock and one worker; the others' passes go on on the other workers."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:  # deleted since the tick
        return False
    with pass_lock(name=f"alerts:evaluate-lock:{cluster_id}", ttl_s=EVALUATE_LOCK_TTL_S) as held:
        if not held:
            logger.warning("cluster %s: its previous pass still runs; skipped", cluster.name)
            detector_pass_skipped(cluster_id=cluster_id, reason="overlap")
            return False
        alerts_evaluate(cluster=cluster, now=now)
    return True


def detector_pass_skipped(*, cluster_id: int, reason: str) -> None:
    """Count a cluster's pass that did not run (`overlap`, or `expired` in the queue): in
    the periodic skip counts and on the cluster's DetectorPass row (none before its first
    pass), where the overview reads it with the pass itself."""
    periodic_skip_count(task=EVALUATE_CLUSTER_TASK, reason=reason)
    DetectorPass.objects.filter(cluster_id=cluster_id).update(skipped=F("skipped") + 1)


def _ended_runs(run_ids: Iterable[int | None]) -> set[int]:
    ids = {run_id for run_id in run_ids if run_id is not None}
    if not ids:
        return set()
    return set(Run.objects.filter(pk__in=ids, state__in=ENDED_STATES).values_list("pk", flat=True))


def _strongest(findings: Iterable[Finding]) -> dict[tuple[str, str], Finding]:
    """One finding per (kind, subject): the most severe (two detectors may see one thing)."""
    latest: dict[tuple[str, str], Finding] = {}
    for finding in findings:
        key = (finding.kind, finding.subject)
        seen = latest.get(key)
        if seen is None or SEVERITY_RANK[finding.severity] > SEVERITY_RANK[seen.severity]:
            latest[key] = finding
    return latest


# One statement for every open alert a pass saw again, however many: only these fields
# (state and acknowledgement belong to alert_acknowledge).
_FOLLOW_SQL = """
UPDATE alerts_alert a SET severity = v.severity, summary = v.summary,
    evidence = v.evidence::jsonb, last_seen_at = %(at)s
FROM (SELECT unnest(%(ids)s::bigint[]) id, unnest(%(severities)s::text[]) severity,
             unnest(%(summaries)s::text[]) summary, unnest(%(evidence)s::text[]) evidence) v
WHERE a.id = v.id
"""


def _open_alerts_follow(updates: list[tuple[int, str, str, str]], *, at: datetime) -> None:
    if not updates:
        return
    ids, severities, summaries, evidence = (list(column) for column in zip(*updates, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(_FOLLOW_SQL, {
            "at": at, "ids": ids, "severities": severities, "summaries": summaries,
            "evidence": evidence,
        })  # fmt: skip


def _open_alerts_resolve(ids: list[int], *, at: datetime) -> list[int]:
    """Resolve those of `ids` still open, in one conditional UPDATE; returns those resolved,
    in order."""
    if not ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE alerts_alert SET state = %s, resolved_at = %s"
            " WHERE id = ANY(%s) AND state = ANY(%s) RETURNING id",
            [AlertState.RESOLVED, at, ids, list(OPEN_STATES)],
        )
        resolved = {row[0] for row in cursor.fetchall()}
    return [pk for pk in ids if pk in resolved]


def _plain(value: Any) -> Any:
    """Evidence as JSON Postgres accepts: mappings → dicts, tuples → lists, NaN/inf → None."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
