"""Roles per cluster: who sees which cluster and may do what there."""

import pytest
from django.contrib.auth import get_user_model

from apps.access.selectors import clusters_visible, role_of, user_may
from apps.clusters.models import Cluster
from tests.access.conftest import user_with

pytestmark = pytest.mark.django_db


def test_it_shows_a_user_only_the_clusters_they_hold_a_role_in(clusters):
    viewer = user_with("vera", alpha="viewer")
    assert [c.name for c in clusters_visible(user=viewer)] == ["alpha"]


def test_it_shows_a_superuser_every_cluster(clusters):
    root = get_user_model().objects.create_superuser("root", password="pw-12345-long")
    assert sorted(c.name for c in clusters_visible(user=root)) == ["alpha", "beta"]


def test_it_shows_an_inactive_user_nothing(clusters):
    user = user_with("gone", alpha="admin")
    user.is_active = False
    assert list(clusters_visible(user=user)) == []


@pytest.mark.parametrize(
    ("role", "view", "operate", "administer"),
    [
        ("viewer", True, False, False),
        ("operator", True, True, False),
        ("admin", True, True, True),
    ],
)
def test_it_grants_each_role_its_actions_on_its_own_cluster_only(
    clusters, role, view, operate, administer
):
    user = user_with("u", alpha=role)
    alpha, beta = Cluster.objects.get(name="alpha"), Cluster.objects.get(name="beta")
    assert role_of(user=user, cluster=alpha) == role
    assert role_of(user=user, cluster=beta) is None
    assert user_may(user=user, cluster=alpha, action="view") is view
    assert user_may(user=user, cluster=alpha, action="operate") is operate
    assert user_may(user=user, cluster=alpha, action="administer") is administer
    for action in ("view", "operate", "administer"):
        assert user_may(user=user, cluster=beta, action=action) is False
