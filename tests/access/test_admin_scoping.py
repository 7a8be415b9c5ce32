"""Per-cluster settings in the Django admin follow cluster roles: a cluster admin manages
that cluster's roles and auto-cordon policy and sees no other cluster's; scheduler hooks
(programs the server runs) are for superusers only, and their changes are audited."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from apps.access.models import ClusterRole
from apps.access.services import role_grant
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster
from apps.commands.models import AutoCordonPolicy, ClusterHooks

pytestmark = pytest.mark.django_db

MODELS = ["view_clusterrole", "change_clusterrole", "add_clusterrole", "delete_clusterrole"]
MODELS += ["view_autocordonpolicy", "change_autocordonpolicy", "add_autocordonpolicy"]
MODELS += ["view_clusterhooks", "change_clusterhooks", "add_clusterhooks"]


@pytest.fixture
def clusters():
    return Cluster.objects.create(name="ours"), Cluster.objects.create(name="theirs")


@pytest.fixture
def cluster_admin(clusters):
    ours, theirs = clusters
    user = get_user_model().objects.create_user("ada", password="pw-12345-x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=MODELS))
    role_grant(user=user, cluster=ours, role="admin")
    role_grant(user=user, cluster=theirs, role="operator")  # operating is not administering
    stranger = get_user_model().objects.create_user("sam")
    role_grant(user=stranger, cluster=theirs, role="viewer")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def test_a_cluster_admin_sees_and_grants_roles_only_in_their_cluster(clusters, cluster_admin):
    ours, theirs = clusters
    listed = cluster_admin.get("/admin/access/clusterrole/")
    assert listed.status_code == 200
    shown = set(listed.context["cl"].queryset.values_list("cluster__name", flat=True))
    assert shown == {"ours"}
    foreign = ClusterRole.objects.get(cluster=theirs, user__username="sam")
    assert cluster_admin.get(f"/admin/access/clusterrole/{foreign.pk}/change/").status_code in (
        302,
        404,
    )
    form = cluster_admin.get("/admin/access/clusterrole/add/").context["adminform"].form
    assert list(form.fields["cluster"].queryset) == [ours]
    sam = get_user_model().objects.get(username="sam")
    refused = cluster_admin.post(
        "/admin/access/clusterrole/add/", {"user": sam.pk, "cluster": theirs.pk, "role": "admin"}
    )
    assert refused.status_code == 200 and "cluster" in refused.context["adminform"].form.errors
    assert ClusterRole.objects.get(cluster=theirs, user=sam).role == "viewer"


def test_a_cluster_admin_sets_only_their_clusters_policy(clusters, cluster_admin):
    ours, theirs = clusters
    mine = AutoCordonPolicy.objects.create(cluster=ours)
    other = AutoCordonPolicy.objects.create(cluster=theirs)
    listed = cluster_admin.get("/admin/commands/autocordonpolicy/")
    assert list(listed.context["cl"].queryset) == [mine]
    assert cluster_admin.get(
        f"/admin/commands/autocordonpolicy/{other.pk}/change/"
    ).status_code in (
        302,
        404,
    )


def test_hooks_are_for_superusers_and_their_changes_are_audited(clusters, cluster_admin):
    ours, _ = clusters
    assert cluster_admin.get("/admin/commands/clusterhooks/").status_code == 403
    root = Client(HTTP_HOST="127.0.0.1")
    root.force_login(get_user_model().objects.create_superuser("root", password="pw-12345-x"))
    saved = root.post(
        "/admin/commands/clusterhooks/add/",
        {
            "cluster": ours.pk,
            "cordon_argv": '["scontrol", "update", "NodeName={node}", "State=DRAIN"]',
            "uncordon_argv": "[]",
            "drain_argv": "[]",
            "timeout_s": "10",
        },
    )
    assert saved.status_code == 302, saved.content[:500]
    assert ClusterHooks.objects.get(cluster=ours).cordon_argv[0] == "scontrol"
    entry = AuditEntry.objects.get(action="hooks.configure", cluster_id=ours.pk)
    assert entry.outcome == "succeeded" and entry.detail["cordon_argv"][0] == "scontrol"


def test_changing_a_roles_user_moves_the_role(clusters, cluster_admin):
    ours, _ = clusters
    users = get_user_model().objects
    sam, tom = users.get(username="sam"), users.create_user("tom")
    grant = role_grant(user=sam, cluster=ours, role="operator")
    saved = cluster_admin.post(
        f"/admin/access/clusterrole/{grant.pk}/change/", {"user": tom.pk, "role": "viewer"}
    )
    assert saved.status_code == 302
    assert not ClusterRole.objects.filter(user=sam, cluster=ours).exists()  # sam's access ends
    assert ClusterRole.objects.get(user=tom, cluster=ours).role == "viewer"
    assert ClusterRole.objects.get(user=sam).cluster.name == "theirs"  # elsewhere untouched
    entries = AuditEntry.objects.filter(cluster_id=ours.pk).order_by("id")
    assert [(e.action, e.target) for e in entries][-2:] == [
        ("role.revoke", "user:sam"),
        ("role.grant", "user:tom"),
    ]
    assert entries.last().actor_name == "ada"
