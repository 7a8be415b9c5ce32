from django.conf import settings
from django.db import models

from apps.access.choices import Role
from apps.clusters.models import Cluster


class ClusterRole(models.Model):
    """What one user may do on one cluster (viewer < operator < admin)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="cluster_roles"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="roles")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "cluster"], name="clusterrole_user_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role} on {self.cluster}"


class UserToken(models.Model):
    """A personal API token: acts as its user, with that user's roles. Only the SHA-256
    digest of the secret is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=64, blank=True)
    prefix = models.CharField(max_length=16, help_text="first characters, to recognise a token")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user}/{self.name or self.prefix}"
