from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import BrinIndex
from django.db import models

from apps.clusters.models import Cluster, Node
from apps.runs.choices import EventKind, RunState


class Run(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=255)
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.RUNNING)
    first_step = models.BigIntegerField(null=True, blank=True)
    last_step = models.BigIntegerField(null=True, blank=True)
    last_step_at = models.DateTimeField(null=True, blank=True)
    world_size = models.IntegerField(default=0, help_text="highest rank seen + 1")
    # A step counter that goes back is a restart (a resume from a checkpoint, a job submitted
    # again under the name): the run's newest steps are those reported since its timeline
    # began, and last_step is the highest of them (apps.runs.timeline, via runs_touch).
    timeline_after = models.DateTimeField(
        null=True,
        blank=True,
        help_text="the newest report before the step counter last went back: the current "
        "timeline is every report after it (none: since the run began)",
    )
    timeline_from = models.DateTimeField(
        null=True,
        blank=True,
        help_text="the current timeline's first report: an older one arriving late is the "
        "old timeline's (none: since the run began)",
    )
    restarts = models.IntegerField(
        default=0,
        db_default=0,
        help_text="restarts, each once: the restart events, and the times the step counter "
        "went back that no event stands for",
    )
    restart_event_at = models.DateTimeField(
        null=True, blank=True, help_text="the newest restart event counted"
    )
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="the newest run_end event's time, while ended"
    )
    end_message = models.TextField(
        blank=True, default="", db_default="", help_text="the run_end event's message"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="run_unique_per_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"


# A step report that carries a silent-corruption check (checksums or canary).
CHECKED = (
    models.Q(grad_checksum__isnull=False)
    | models.Q(param_checksum__isnull=False)
    | models.Q(canary_norm__isnull=False)
)


class StepReport(models.Model):
    """One rank's report of one training step: every field of the contract's `steps`."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    ts = models.DateTimeField()
    rank = models.IntegerField()
    step = models.BigIntegerField()
    step_time = models.FloatField()
    data_time = models.FloatField(null=True)
    h2d_time = models.FloatField(null=True)
    compute_time = models.FloatField(null=True)
    comm_wait = models.FloatField(null=True)
    tokens = models.BigIntegerField(null=True)
    loss = models.FloatField(null=True)
    grad_checksum = models.CharField(max_length=64, null=True)
    param_checksum = models.CharField(max_length=64, null=True)
    canary_norm = models.FloatField(null=True)
    canary_proj = ArrayField(models.FloatField(), null=True)
    shard = models.CharField(max_length=128, null=True)
    # the rank's GPU index on its node, when the reporter knows it (ties the rank to that
    # GPU's telemetry and tile)
    gpu = models.SmallIntegerField(null=True)

    class Meta:
        indexes = [
            models.Index(fields=["run", "step"], name="stepreport_run_step"),
            BrinIndex(fields=["ts"], name="stepreport_ts_brin"),
            # Only the reports that carry a check (a few steps in hundreds): the checksum
            # chart reads them without visiting every report in its range.
            models.Index(
                fields=["run", "step"],
                name="stepreport_run_checked",
                condition=CHECKED,
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} rank {self.rank} step {self.step}"


class StepChunk(models.Model):
    """One rank's step reports of one run in one STEP_CHUNK_SECONDS window, columnar (the
    format: apps/runs/chunks.py), written by the compaction (apps/runs/compaction.py) once
    they are older than STEP_COMPACT_AFTER_S and outside the run's last
    STEP_COMPACT_KEEP_STEPS steps. t0/t1 and the step range bound what `data` holds, so
    readers decode only the chunks their range touches."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+", db_constraint=False)
    rank = models.IntegerField()
    window = models.DateTimeField(help_text="the start of the window the reports fall in")
    t0 = models.DateTimeField()
    t1 = models.DateTimeField()
    step_lo = models.BigIntegerField()
    step_hi = models.BigIntegerField()
    n = models.IntegerField()
    checked = models.IntegerField(help_text="how many of the reports carry a check")
    data = models.BinaryField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "window", "rank"], name="stepchunk_unique_run_window_rank"
            )
        ]
        indexes = [
            models.Index(fields=["run", "step_hi"], name="stepchunk_run_step_hi"),
            BrinIndex(fields=["t0"], name="stepchunk_t0_brin"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} rank {self.rank} from {self.window:%Y-%m-%d %H:%M}"


class RunEvent(models.Model):
    """An agent event (checkpoint, restart, oom, xid, ecc, error, log); `run` may be absent."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, null=True, related_name="events")
    ts = models.DateTimeField()
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    step = models.BigIntegerField(null=True)
    rank = models.IntegerField(null=True)
    gpu = models.IntegerField(null=True)
    data = models.JSONField(default=dict, help_text="the event's other fields, as sent")

    class Meta:
        indexes = [
            models.Index(fields=["run", "kind", "ts"], name="runevent_run_kind_ts"),
            models.Index(fields=["node", "ts"], name="runevent_node_ts"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} at {self.ts:%Y-%m-%d %H:%M:%S}"
