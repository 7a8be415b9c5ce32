"""What the role commands (grant_role, revoke_role) look up by name."""

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from apps.clusters.models import Cluster


def user_and_cluster(username: str, cluster: str) -> tuple[Any, Cluster]:
    """The user and cluster named; CommandError naming the one that does not exist."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no such user: {username}")
    found = Cluster.objects.filter(name=cluster).first()
    if found is None:
        raise CommandError(f"no such cluster: {cluster}")
    return user, found
