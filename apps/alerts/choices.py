from django.db import models


class AlertState(models.TextChoices):
    FIRING = "firing"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


OPEN_STATES = (AlertState.FIRING, AlertState.ACKNOWLEDGED)


class IncidentState(models.TextChoices):
    """An incident is open while any of its alerts is; it resolves with the last of them."""

    OPEN = "open"
    RESOLVED = "resolved"


# The audit log's action of an incident's acknowledgement (audit actions are free text: each
# app names its own).
INCIDENT_ACKNOWLEDGE = "incident.acknowledge"


class AlertKind(models.TextChoices):
    """Every kind a detector raises (docs/contract.md lists them; detectors.types.Finding)."""

    STRAGGLER = "straggler"
    SDC = "sdc"
    INPUT_BOUND = "input_bound"
    HANG = "hang"
    CHECKPOINT_STALE = "checkpoint_stale"
    CHECKPOINT_UPLOAD = "checkpoint_upload"
    OOM_RISK = "oom_risk"
    OOM = "oom"
    THERMAL = "thermal"
    POWER = "power"
    XID = "xid"
    ECC = "ecc"
    HEARTBEAT = "heartbeat"
    FABRIC = "fabric"


class Severity(models.TextChoices):
    WARNING = "warning"
    CRITICAL = "critical"


SEVERITY_RANK = {Severity.WARNING: 0, Severity.CRITICAL: 1}


class AlertEvent(models.TextChoices):
    """What happened to an alert: the event name of broadcasts, webhooks and the audit trail."""

    OPENED = "opened"
    ESCALATED = "escalated"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"
    # a warning left unacknowledged past its cluster's warning_age_min: notified once more
    AGEING = "ageing"
    SILENCED = "silenced"


# Events that are sent to webhooks (an acknowledgement or a silence is an operator's own act).
WEBHOOK_EVENTS = (AlertEvent.OPENED, AlertEvent.ESCALATED, AlertEvent.RESOLVED, AlertEvent.AGEING)


class WebhookFormat(models.TextChoices):
    GENERIC = "generic", "generic JSON"
    SLACK = "slack", "Slack-compatible"
    # the endpoint's URL is an Alertmanager's POST /api/v2/alerts (apps.alerts.services.webhooks)
    ALERTMANAGER = "alertmanager", "Alertmanager"


# Redis hash of skipped periodic passes: "<task>:<reason>" → count. Written by
# services.periodic, read by selectors.periodic_skips: here, below both.
PERIODIC_SKIPS_KEY = "{prefix}:periodic:skipped"
