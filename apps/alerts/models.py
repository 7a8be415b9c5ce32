import base64
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.alerts.choices import AlertEvent, AlertState, IncidentState, Severity, WebhookFormat
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from detectors.config import DEFAULT_CONFIG


class Alert(models.Model):
    """A condition a detector saw, from the first finding until it has been clear a while.

    At most one open (firing or acknowledged) alert per (cluster, kind, subject); a condition
    that returns after its alert resolved opens a new one."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=32)
    subject = models.CharField(max_length=255, help_text="the finding's stable key")
    severity = models.CharField(max_length=16, choices=Severity.choices)
    state = models.CharField(max_length=16, choices=AlertState.choices, default=AlertState.FIRING)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    node = models.ForeignKey(
        Node, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    rank = models.IntegerField(null=True, blank=True)
    gpu = models.IntegerField(null=True, blank=True)
    summary = models.TextField()
    evidence = models.JSONField(default=dict, blank=True)
    opened_at = models.DateTimeField()
    last_seen_at = models.DateTimeField(help_text="the last time a detector saw the condition")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    ack_note = models.TextField(blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # the incident of its root cause (apps.alerts.services.incidents; None until folded)
    incident = models.ForeignKey(
        "Incident", on_delete=models.SET_NULL, null=True, blank=True, related_name="alerts"
    )
    # Amber that ages (services.ageing): when an unacknowledged warning escalated for its age
    # (once), and an operator's silence of it (until when, why, who).
    aged_at = models.DateTimeField(null=True, blank=True)
    silenced_until = models.DateTimeField(null=True, blank=True)
    silence_reason = models.TextField(blank=True, default="")
    silenced_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "kind", "subject"],
                condition=~models.Q(state=AlertState.RESOLVED),
                name="alert_one_open_per_subject",
            )
        ]
        indexes = [models.Index(fields=["cluster", "-opened_at"], name="alert_cluster_opened")]

    def __str__(self) -> str:
        return f"{self.kind} {self.subject} ({self.state})"


class Incident(models.Model):
    """The alerts of one root cause (detectors.incidents' causal graph): open while any of
    them is, resolved with the last. The root is the cause's kind and place, or unknown
    (`root_kind` empty) with the `candidates`; an incident keeps its id and alerts across
    passes, gaining the symptoms that join it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="incidents")
    state = models.CharField(
        max_length=16, choices=IncidentState.choices, default=IncidentState.OPEN
    )
    root_kind = models.CharField(max_length=32, blank=True, help_text="empty: unknown")
    root_node = models.CharField(max_length=255, blank=True)
    root_gpu = models.IntegerField(null=True, blank=True)
    root_rank = models.IntegerField(null=True, blank=True)
    # the root's alert id: a plain number, kept when retention deletes the alert (by SQL)
    root_alert = models.BigIntegerField(null=True, blank=True)
    # [{"kind", "node", "gpu", "rank", "alert"}]: the alerts nothing else in it explains
    candidates = models.JSONField(default=list, blank=True)
    opened_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    ack_note = models.TextField(blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["cluster", "-opened_at"], name="incident_cluster_opened"),
            models.Index(fields=["cluster", "state"], name="incident_cluster_state"),
        ]

    def __str__(self) -> str:
        return f"incident {self.pk}: {self.root_kind or 'unknown'} ({self.state})"


def new_signing_secret() -> str:
    """A Standard Webhooks secret: `whsec_` and 24 random bytes in base64."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class WebhookEndpoint(models.Model):
    """Where a cluster's alert changes (opened, escalated, resolved) are posted."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="webhooks")
    url = models.URLField(max_length=500)
    format = models.CharField(
        max_length=16, choices=WebhookFormat.choices, default=WebhookFormat.GENERIC
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The Standard Webhooks signing secret (`whsec_` + base64): every delivery is signed with
    # it (webhook-id, webhook-timestamp, webhook-signature headers) so that the receiver can
    # tell Opsboard's posts from anyone's. Made when the endpoint is, shown once (the admin).
    signing_secret = models.CharField(max_length=64, editable=False, default=new_signing_secret)

    def __str__(self) -> str:
        return f"{self.cluster} → {self.url}"


class WebhookDelivery(models.Model):
    """One alert change to send to one endpoint; the body is fixed when the change commits."""

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=16, choices=AlertEvent.choices)
    payload = models.JSONField()
    attempts = models.IntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event} of alert {self.alert_id} to {self.endpoint_id}"


class ClusterDetectorConfig(models.Model):
    """A cluster's overrides of detector thresholds, e.g. {"heartbeat_min_s": 10}: names and
    meanings are those of detectors.config.DetectorConfig."""

    cluster = models.OneToOneField(
        Cluster, on_delete=models.CASCADE, related_name="detector_config"
    )
    overrides = models.JSONField(default=dict, blank=True)
    # Beat skips a paused cluster: maintenance, or an evaluation scenario being replayed
    # (evaluate_detectors drives its alerts from historical times; beat's "now" would clash).
    paused = models.BooleanField(
        default=False, help_text="continuous detector evaluation is paused for this cluster"
    )
    warning_age_min = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="minutes a warning may stay unacknowledged before it escalates once as "
        "ageing (0: never; empty: ALERT_WARNING_AGE_MIN, 30 unless set)",
    )

    def __str__(self) -> str:
        return f"detector settings of {self.cluster}"

    def clean(self) -> None:
        if not isinstance(self.overrides, dict):
            raise ValidationError({"overrides": "must be a JSON object"})
        try:
            DEFAULT_CONFIG.with_overrides(self.overrides)
        except (ValueError, TypeError) as error:
            raise ValidationError({"overrides": str(error)}) from None


class DetectorPass(models.Model):
    """When a cluster's detectors last ran (continuously, by beat) and how long that took:
    the overview shows its age, so a stalled evaluation is visible rather than silent."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="detector_pass")
    ran_at = models.DateTimeField(help_text="when the last pass finished")
    duration_s = models.FloatField(help_text="seconds the last pass took")
    findings = models.IntegerField(default=0, help_text="findings of the last pass")
    skipped = models.IntegerField(
        default=0,
        help_text="passes skipped since the first (the previous still ran, or expired queued)",
    )

    def __str__(self) -> str:
        return f"detectors of {self.cluster} ran at {self.ran_at:%H:%M:%S}"
