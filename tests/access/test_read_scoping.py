"""A user reads only the clusters they hold a role in: another cluster's objects are 404,
on the read API, the pages and the chart exports."""

import pytest
from django.contrib.auth import get_user_model

from apps.alerts.models import Alert
from apps.clusters.models import Cluster
from tests.access.conftest import PASSWORD, client_of, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(clusters):
    return client_of(user_with("vera", alpha="viewer"))


def alert_in(cluster_name: str) -> Alert:
    from django.utils import timezone

    now = timezone.now()
    return Alert.objects.create(
        cluster=Cluster.objects.get(name=cluster_name), kind="xid", subject="node:node-00",
        severity="critical", summary="XID 79", evidence={}, opened_at=now, last_seen_at=now,
    )  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/run-1?cluster={c}",
        "/api/v1/nodes/node-00/series?cluster={c}",
        "/clusters/{c}/",
        "/clusters/{c}/runs/run-1/",
        "/clusters/{c}/nodes/node-00/",
        "/clusters/{c}/runs/run-1/charts/throughput.csv",
    ],
)
def test_it_answers_404_for_another_clusters_objects(viewer, path):
    own = viewer.get(path.format(c="alpha"))
    foreign = viewer.get(path.format(c="beta"))
    assert own.status_code != 404, own.content[:300]
    assert foreign.status_code == 404


def test_it_finds_an_unqualified_name_only_in_the_visible_cluster(viewer):
    # run-1 exists in both clusters; to this viewer only alpha's is there, so no ambiguity
    response = viewer.get("/api/v1/runs/run-1")
    assert response.status_code == 200


def test_it_lists_only_the_visible_clusters_alerts(viewer):
    alert_in("alpha"), alert_in("beta")
    alerts = viewer.get("/api/v1/alerts").json()["alerts"]
    assert len(alerts) == 1
    assert viewer.get("/api/v1/alerts?cluster=beta").status_code == 404
    page = viewer.get("/alerts/").content.decode()
    assert "alpha" in page and "beta" not in page


def test_it_shows_a_superuser_every_cluster(clusters):
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    client = client_of(root)
    assert client.get("/clusters/beta/").status_code == 200
    assert client.get("/api/v1/runs/run-1?cluster=beta").status_code == 200


def test_it_lists_on_the_home_page_only_the_visible_clusters(clusters):
    client = client_of(user_with("two", alpha="viewer", beta="operator"))
    page = client.get("/").content.decode()
    assert "/clusters/alpha/" in page and "/clusters/beta/" in page
    solo = client_of(user_with("solo", beta="viewer"))
    assert solo.get("/").url == "/clusters/beta/"
