import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run

PASSWORD = "pw-12345-long"


def user_with(username: str, **roles: str):
    """A user holding {cluster name: role} (clusters must exist)."""
    user = get_user_model().objects.create_user(username, password=PASSWORD)
    for cluster, role in roles.items():
        ClusterRole.objects.create(user=user, cluster=Cluster.objects.get(name=cluster), role=role)
    return user


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def clusters(db):
    """Two clusters, each with a node and a run of the same names."""
    for name in ("alpha", "beta"):
        cluster = Cluster.objects.create(name=name)
        Node.objects.create(cluster=cluster, name="node-00")
        Run.objects.create(cluster=cluster, name="run-1")
    return Cluster.objects.order_by("name")
