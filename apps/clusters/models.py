from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from apps.clusters.choices import NodeDownBy, NodeState
from apps.clusters.hostlist import patterns_match


class Cluster(models.Model):
    name = models.SlugField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class AgentToken(models.Model):
    """An agent's credential. Only the SHA-256 digest of the secret is stored."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="first characters, to recognise a token")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Empty: cluster-wide (simulators, launchers). Otherwise the nodes this token acts for,
    # as names or hostlist patterns (apps/clusters/hostlist.py): it posts batches, polls and
    # acknowledges only as them.
    nodes = ArrayField(
        models.CharField(max_length=255),
        default=list,
        blank=True,
        help_text="node names or patterns such as gpu-[001-128]; empty: every node",
    )

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name or self.prefix}"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_cluster_wide(self) -> bool:
        return not self.nodes

    def acts_for(self, node_name: str) -> bool:
        """Whether this token may act as the node: any node of its cluster when cluster-wide."""
        return not self.nodes or patterns_match(self.nodes, node_name)


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=255)
    info = models.JSONField(default=dict, blank=True, help_text="node_info from the agent")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.ACTIVE)
    last_seen = models.DateTimeField(null=True, blank=True)
    # A node agent sends batches without a `run`. Only such a node can go missing (heartbeat);
    # one heard only from inside training jobs follows its run: idle once the run ended.
    # Ingest sets it from the first batch (nodes_touch); nodes made otherwise (and those
    # stored before this field existed) are assumed to have an agent.
    has_agent = models.BooleanField(
        default=True, help_text="has sent a batch without a run (a node agent runs there)"
    )
    # Who said the node is `down` (NodeDownBy): each source takes back only its own word, so
    # the heartbeat and the scheduler never undo each other (node_mark_down).
    down_by = models.CharField(
        max_length=16, choices=NodeDownBy.choices, blank=True, default="", db_default=""
    )
    # The scheduler's reason for a node it reports down, in its words (Slurm's `%E`, such as
    # "bad DIMM [root@2026-12-05T10:00:00]"): shown on the overview and in the resume plan;
    # set and cleared with down_by = scheduler (apps.commands.services.scheduler_states).
    down_reason = models.TextField(blank=True, default="", db_default="")
    # Set by apps.commands.services (cordon, drain); cleared by uncordon.
    cordon_reason = models.TextField(blank=True, default="", db_default="")
    cordoned_at = models.DateTimeField(null=True, blank=True)
    cordoned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_per_cluster")
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"
