import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from apps.clusters.models import Cluster, Node
from apps.commands.choices import IDEMPOTENCY_SYSTEM, CommandKind, CommandState
from apps.runs.models import Run


class Command(models.Model):
    """An operator's command to a run or a node. Its state only moves forward, through
    apps.commands.services.command_advance (a conditional UPDATE)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=CommandKind.choices)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, null=True, blank=True, related_name="commands"
    )
    node = models.ForeignKey(
        Node, on_delete=models.CASCADE, null=True, blank=True, related_name="commands"
    )
    args = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True, default="")
    state = models.CharField(
        max_length=16, choices=CommandState.choices, default=CommandState.ISSUED
    )
    idempotency_key = models.CharField(max_length=128)
    # Whose key it is: "user:<id>", "token:<id>" (a personal API token) or "system" (a
    # drain's own steps, the auto-cordon policy). Set by the server from who acts, never
    # read from a request, so no request can reach a system key (docs/actions.md).
    idempotency_scope = models.CharField(max_length=64, default=IDEMPOTENCY_SYSTEM)
    # A digest of what the key was sent with (kind, target, args): the same key with another
    # request is refused, not answered with this command.
    idempotency_fingerprint = models.CharField(max_length=64, blank=True, default="")
    # False once the key expired and was used again: it then names the newer command.
    idempotency_live = models.BooleanField(default=True)
    issued_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # a drain's checkpoint and stop commands name it
    parent = models.ForeignKey(
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="children"
    )
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "idempotency_scope", "idempotency_key"],
                condition=models.Q(idempotency_live=True),
                name="command_unique_idempotency_key",
            ),
            models.CheckConstraint(
                condition=models.Q(run__isnull=False) | models.Q(node__isnull=False),
                name="command_has_target",
            ),
        ]
        indexes = [
            # the long-poll and the expiry sweep read the live commands only
            models.Index(
                fields=["cluster", "issued_at"],
                name="command_live",
                condition=models.Q(state__in=["issued", "delivered", "accepted"]),
            ),
            models.Index(fields=["run", "issued_at"], name="command_run_issued"),
            models.Index(fields=["node", "issued_at"], name="command_node_issued"),
            # the sweep's replay of the runs' states reads the recent successful stops/resumes
            models.Index(
                fields=["finished_at"],
                name="command_run_state_finished",
                condition=models.Q(kind__in=["stop", "resume"], state="succeeded"),
            ),
        ]
        ordering = ["-issued_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.run or self.node} ({self.state})"


class CommandTransition(models.Model):
    """One real state change of a command (repeats and refused moves leave no row)."""

    command = models.ForeignKey(Command, on_delete=models.CASCADE, related_name="transitions")
    from_state = models.CharField(max_length=16, choices=CommandState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=CommandState.choices)
    at = models.DateTimeField()
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} → {self.to_state}"


class ClusterHooks(models.Model):
    """The commands that make a cluster's scheduler agree with cordon / uncordon / drain.

    Each is an argv list (run without a shell) whose items may contain {node} and {reason};
    an empty list runs nothing. `state_argv` goes the other way: the scheduler's word on its
    nodes, one "NODE STATE [REASON]" line each (such as `sinfo -h -N -o "%N %T %E"`), read
    periodically (apps.commands.services.scheduler_states); it takes no placeholders."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="hooks")
    cordon_argv = models.JSONField(default=list, blank=True)
    uncordon_argv = models.JSONField(default=list, blank=True)
    drain_argv = models.JSONField(default=list, blank=True)
    state_argv = models.JSONField(
        default=list,
        blank=True,
        help_text='prints one "NODE STATE [REASON]" line per node, e.g. ["sinfo", "-h", "-N", '
        '"-o", "%N %T %E"]; a node the scheduler reports down, failed or not responding is '
        "marked down, with the reason",
    )
    timeout_s = models.FloatField(default=30.0)
    # The state hook's last run (apps.commands.services.scheduler_states): when, and why it
    # changed nothing ("" when it worked). A failure is audited when it starts and when it
    # ends, not at every run of a hook that keeps failing.
    state_checked_at = models.DateTimeField(null=True, blank=True, editable=False)
    state_error = models.TextField(blank=True, default="", editable=False)

    class Meta:
        verbose_name_plural = "cluster hooks"

    def __str__(self) -> str:
        return f"hooks of {self.cluster}"

    def clean(self) -> None:
        """Each template is a list of strings (an argv, never a shell line)."""
        for name in ("cordon_argv", "uncordon_argv", "drain_argv", "state_argv"):
            argv = getattr(self, name)
            if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
                raise ValidationError({name: "a JSON list of strings (argv, no shell)"})
        if self.timeout_s <= 0:
            raise ValidationError({"timeout_s": "must be positive"})


class AutoCordonPolicy(models.Model):
    """Whether critical hardware findings cordon their node by themselves (off by default).

    Applied by apps.commands.services.policy when an alert opens or escalates; which alerts
    count as critical is said there (and in docs/actions.md)."""

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="auto_cordon")
    enabled = models.BooleanField(
        default=False, help_text="cordon a node automatically on the findings checked below"
    )
    on_ecc = models.BooleanField(default=True, help_text="uncorrectable ECC errors")
    on_xid = models.BooleanField(
        default=True, help_text="XIDs whose catalog action is a GPU reset, a reboot or an RMA"
    )
    on_sdc = models.BooleanField(
        default=True, help_text="silent data corruption confirmed at two or more checks"
    )

    class Meta:
        verbose_name = "auto-cordon policy"
        verbose_name_plural = "auto-cordon policies"

    def __str__(self) -> str:
        return f"auto-cordon of {self.cluster} ({'on' if self.enabled else 'off'})"

    def covers(self, finding: str) -> bool:
        """Whether the policy is on for this kind of critical finding (ecc | xid | sdc)."""
        return self.enabled and bool(getattr(self, f"on_{finding}", False))


class MaintenanceVisit(models.Model):
    """A node's stay in maintenance: sent (a `maintenance` command, its reason) and returned to
    service (an `uncordon` of the node in maintenance, with a note). The ledger reads them for
    repeat offenders: back in service and failing again within days."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="maintenance_visits")
    sent_at = models.DateTimeField()
    reason = models.TextField()
    sent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    returned_at = models.DateTimeField(null=True, blank=True)
    return_note = models.TextField(blank=True, default="")
    returned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )

    class Meta:
        constraints = [
            # at most one open stay a node: returning closes it, sending again opens another
            models.UniqueConstraint(
                fields=["node"],
                condition=models.Q(returned_at__isnull=True),
                name="maintenance_one_open_per_node",
            )
        ]
        indexes = [models.Index(fields=["cluster", "returned_at"], name="maintenance_returned")]

    def __str__(self) -> str:
        return f"{self.node} in maintenance since {self.sent_at:%Y-%m-%d}"
