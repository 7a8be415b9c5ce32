"""`manage.py grant_role USERNAME CLUSTER ROLE` sets one role per user and cluster, audited."""

import io

import pytest
from django.core.management import CommandError, call_command

from apps.access.models import ClusterRole
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster
from tests.access.conftest import user_with

pytestmark = pytest.mark.django_db


def grant(*args: str) -> None:
    call_command("grant_role", *args, stdout=io.StringIO())


def test_it_grants_and_replaces_a_role(clusters):
    user_with("vera")
    grant("vera", "alpha", "viewer")
    grant("vera", "alpha", "operator")
    [role] = ClusterRole.objects.filter(user__username="vera")
    assert (role.cluster.name, role.role) == ("alpha", "operator")
    alpha = Cluster.objects.get(name="alpha")
    entries = AuditEntry.objects.filter(action="role.grant", cluster_id=alpha.pk).order_by("id")
    assert [e.detail["role"] for e in entries] == ["viewer", "operator"]
    assert {(e.target, e.cluster_name, e.actor_name) for e in entries} == {
        ("user:vera", "alpha", "manage.py")
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "alpha", "viewer"), "no such user"),
        (("vera", "gamma", "viewer"), "no such cluster"),
    ],
)
def test_it_refuses_an_unknown_user_or_cluster(clusters, args, message):
    user_with("vera")
    with pytest.raises(CommandError, match=message):
        grant(*args)
    assert not ClusterRole.objects.exists()


def test_it_refuses_an_unknown_role(clusters):
    user_with("vera")
    with pytest.raises(CommandError):
        grant("vera", "alpha", "root")
