"""The incidents page: the API's incident objects (the same GPU-hours), filtered like
`GET /api/v1/incidents`, scoped to the clusters the user holds a role in, linked from every
page."""

from __future__ import annotations

import re

import pytest
from django.test import Client, override_settings

from apps.access.models import ClusterRole
from apps.alerts.models import Incident
from apps.alerts.services import alerts_sync
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from tests.alerts.conftest import make_operator
from tests.alerts.test_incidents import T0, straggler, thermal
from tests.dashboard.test_incident_page import client_of

pytestmark = pytest.mark.django_db

ROW = re.compile(r'<tr data-incident-id="(\d+)" data-state="(\w+)">(.*?)</tr>', re.S)


@pytest.fixture
def incident() -> Incident:
    """Node-02's GPU 3 runs hot and its rank straggles (3 GPU-h/h for 20 minutes)."""
    cluster = Cluster.objects.create(name="alpha")
    Node.objects.create(cluster=cluster, name="node-02")
    Run.objects.create(cluster=cluster, name="run-1")
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0)
    alerts_sync(cluster=cluster, findings=[thermal(), straggler(rate=3.0)], now=T0 + 1200)
    return Incident.objects.get(cluster=cluster)


def rows(html: str) -> dict[int, tuple[str, str]]:
    return {int(pk): (state, body) for pk, state, body in ROW.findall(html)}


def test_it_lists_the_apis_incidents_with_their_root_alerts_and_gpu_hours(incident):
    client = client_of("alice")
    html = client.get("/incidents/").content.decode()
    api = client.get("/api/v1/incidents").json()["incidents"]
    assert [i["id"] for i in api] == list(rows(html)) == [incident.pk]
    state, body = rows(html)[incident.pk]
    assert state == "open" and "<strong>thermal</strong> on node-02, GPU 3" in body
    assert '<td data-col="alerts">2</td>' in body
    assert f'<td data-col="lost">{api[0]["gpu_hours_lost"]}</td>' in body
    assert api[0]["gpu_hours_lost"] == 1.0
    # the nav of every page links it, scoped to the page's cluster
    assert 'href="/incidents/?cluster=alpha"' in client.get("/clusters/alpha/").content.decode()


@override_settings(ALERT_HOLD_DOWN_S=0)
def test_it_filters_by_cluster_state_run_and_node(incident):
    client = client_of("alice")

    def listed(query: str) -> list[int]:
        return list(rows(client.get(f"/incidents/?{query}").content.decode()))

    assert listed("cluster=alpha&state=open&run=run-1&node=node-02") == [incident.pk]
    assert listed("state=resolved") == [] and listed("run=run-9") == []
    assert listed("node=node-99") == []
    assert listed("state=bogus") == [incident.pk]  # an unknown state filters nothing out
    assert client.get("/incidents/?cluster=nowhere").status_code == 404
    alerts_sync(cluster=incident.cluster, findings=[], now=T0 + 1300)
    assert listed("state=resolved") == [incident.pk] and listed("state=open") == []


def test_another_clusters_incidents_are_neither_listed_nor_named(incident):
    beta = Cluster.objects.create(name="beta")
    alerts_sync(cluster=beta, findings=[thermal(node="node-09")], now=T0)
    outsider = make_operator("mallory")
    ClusterRole.objects.filter(user=outsider).exclude(cluster=beta).delete()
    stranger = Client(HTTP_HOST="127.0.0.1")
    stranger.force_login(outsider)
    listed = rows(stranger.get("/incidents/").content.decode())
    assert incident.pk not in listed and len(listed) == 1
    assert stranger.get("/incidents/?cluster=alpha").status_code == 404


def test_anonymous_visitors_are_sent_to_log_in():
    response = Client(HTTP_HOST="127.0.0.1").get("/incidents/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
