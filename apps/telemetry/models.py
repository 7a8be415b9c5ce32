"""Telemetry storage.

Samples do not live in a Django model: a row per sample costs ≈ 52–70 B on disk, so they
are stored as per-series chunks in the table `telemetry_chunk` (created by SQL in
migration 0002; see apps/telemetry/chunks.py for the layout and why).
"""

from django.db import models

from apps.clusters.models import Node

HOST_GPU = -1  # the `gpu` of host-wide series


class Metric(models.Model):
    """Dictionary of metric names, so chunks carry a 4-byte id instead of the name."""

    name = models.CharField(max_length=128, unique=True)

    def __str__(self) -> str:
        return self.name


class NodeHealth(models.Model):
    """The latest value of every metric of one node's GPU (or of the host, gpu = -1)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health")
    gpu = models.IntegerField(default=HOST_GPU)
    ts = models.DateTimeField()
    values = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "gpu"], name="nodehealth_unique_node_gpu")
        ]

    def __str__(self) -> str:
        return f"{self.node_id}/gpu {self.gpu}"
