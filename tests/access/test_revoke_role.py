"""`manage.py revoke_role USERNAME CLUSTER` removes the user's role there, audited
(tests/live/test_socket_ends.py: their live sockets on it close at once)."""

import io

import pytest
from django.core.management import CommandError, call_command

from apps.access.models import ClusterRole
from apps.audit.models import AuditEntry
from tests.access.conftest import user_with

pytestmark = pytest.mark.django_db


def revoke(*args: str) -> str:
    out = io.StringIO()
    call_command("revoke_role", *args, stdout=out)
    return out.getvalue()


def test_it_revokes_one_role_and_audits_it(clusters):
    user_with("vera", alpha="operator", beta="viewer")
    assert "vera holds no role on alpha" in revoke("vera", "alpha")
    assert list(ClusterRole.objects.values_list("cluster__name", flat=True)) == ["beta"]
    [entry] = AuditEntry.objects.filter(action="role.revoke")
    assert (entry.target, entry.cluster_name, entry.actor_name, entry.outcome) == (
        "user:vera", "alpha", "manage.py", "succeeded"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nobody", "alpha"), "no such user"),
        (("vera", "gamma"), "no such cluster"),
        (("vera", "beta"), "vera holds no role on beta"),
    ],
)
def test_it_refuses_an_unknown_user_cluster_or_role(clusters, args, message):
    user_with("vera", alpha="viewer")
    with pytest.raises(CommandError, match=message):
        revoke(*args)
    assert ClusterRole.objects.count() == 1
    assert not AuditEntry.objects.filter(action="role.revoke").exists()
