"""Django admin pages for the domain models, and the reading-back API's errors."""

import time

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from apps.runs.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    user = get_user_model().objects.create_superuser("admin", password="pw-long-enough-1")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "model",
    ["clusters/cluster", "clusters/node", "clusters/agenttoken", "runs/run", "runs/runevent"],
)
def test_the_admin_lists_each_domain_model(admin_client, model):
    cluster = Cluster.objects.create(name="alpha")
    Node.objects.create(cluster=cluster, name="node-01")
    Run.objects.create(cluster=cluster, name="run-1")
    token_issue(cluster_name="alpha", name="agents")
    response = admin_client.get(f"/admin/{model}/")
    assert response.status_code == 200
    assert b"alpha" in response.content or b"0 " in response.content


def test_the_token_admin_never_shows_a_way_to_add_a_secret(admin_client):
    assert admin_client.get("/admin/clusters/agenttoken/add/").status_code == 403


def reader(secret: str) -> Client:
    return Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {secret}")


def test_series_names_the_field_when_start_is_after_end():
    _, secret = token_issue(cluster_name="alpha")
    now = time.time()
    response = reader(secret).get(
        "/api/v1/series", {"node": "n", "metric": "m", "start": now, "end": now - 10}
    )
    assert response.status_code == 400
    assert response.json() == {"errors": [{"loc": "start", "msg": "must be before end"}]}


def test_series_of_an_unknown_node_is_404():
    _, secret = token_issue(cluster_name="alpha")
    response = reader(secret).get("/api/v1/series", {"node": "nope", "metric": "gpu.util"})
    assert response.status_code == 404
    assert response.json()["errors"][0]["loc"] == "node"


def test_series_of_another_clusters_node_is_404():
    Node.objects.create(cluster=Cluster.objects.create(name="beta"), name="theirs")
    _, secret = token_issue(cluster_name="alpha")
    response = reader(secret).get("/api/v1/series", {"node": "theirs", "metric": "gpu.util"})
    assert response.status_code == 404


def test_series_rejects_a_bad_query_value_naming_it():
    _, secret = token_issue(cluster_name="alpha")
    response = reader(secret).get("/api/v1/series", {"node": "n", "metric": "m", "gpu": "x"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "gpu"


def test_reading_back_needs_a_token_or_a_login():
    response = Client(HTTP_HOST="127.0.0.1").get("/api/v1/runs/r")
    assert response.status_code == 401


def test_an_unknown_run_is_404():
    _, secret = token_issue(cluster_name="alpha")
    assert reader(secret).get("/api/v1/runs/none").status_code == 404


def test_a_logged_in_operator_reads_a_run_summary():
    cluster = Cluster.objects.create(name="alpha")
    Run.objects.create(cluster=cluster, name="r1", world_size=8)
    client = Client(HTTP_HOST="127.0.0.1")
    user = get_user_model().objects.create_user("op", password="pw-long-enough-1")
    ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
    client.force_login(user)
    response = client.get("/api/v1/runs/r1")
    assert response.status_code == 200
    body = response.json()
    assert body["run"] == "r1" and body["ranks"] == 8 and body["goodput"] is None
    assert body["checkpoint"]["durable"] is None
