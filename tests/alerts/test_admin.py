"""The admin lists alerts, webhook endpoints (with their deliveries) and detector settings."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.alerts.models import Alert, ClusterDetectorConfig, WebhookEndpoint
from apps.alerts.services import alerts_sync
from tests.alerts.conftest import finding


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("admin", password="pw-long-enough-1")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.mark.parametrize("page", ["alert", "webhookendpoint", "clusterdetectorconfig"])
def test_the_admin_lists_each_alerts_model(admin_client, cluster, page):
    alerts_sync(cluster=cluster, findings=[finding()], now=1_764_470_000.0)
    WebhookEndpoint.objects.create(cluster=cluster, url="http://127.0.0.1:9/hook")
    ClusterDetectorConfig.objects.create(cluster=cluster, overrides={"heartbeat_min_s": 10})
    assert admin_client.get(f"/admin/alerts/{page}/").status_code == 200


def test_an_alerts_admin_page_opens_and_alerts_are_not_added_by_hand(admin_client, cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=1_764_470_000.0)
    alert = Alert.objects.get(cluster=cluster)
    assert admin_client.get(f"/admin/alerts/alert/{alert.pk}/change/").status_code == 200
    assert admin_client.get("/admin/alerts/alert/add/").status_code == 403


def test_the_admin_refuses_unknown_detector_settings(admin_client, cluster):
    response = admin_client.post(
        "/admin/alerts/clusterdetectorconfig/add/",
        {"cluster": cluster.pk, "overrides": '{"heartbeat_min": 3}'},
    )
    assert response.status_code == 200  # the form again, with the error
    assert b"unknown detector setting" in response.content
    assert not ClusterDetectorConfig.objects.exists()
