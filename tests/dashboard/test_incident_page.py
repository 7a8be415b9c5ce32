"""The incident page: root cause or candidates, symptoms, timeline with commands and their
outcomes, GPU-hours lost (the API's number), the actions that fit, and acknowledging."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client, override_settings

from apps.access.models import ClusterRole
from apps.alerts.models import Alert, Incident
from apps.alerts.services import alerts_sync
from apps.clusters.models import Cluster, Node
from apps.commands.models import Command
from apps.runs.models import Run
from tests.alerts.conftest import finding, make_operator
from tests.alerts.test_incidents import T0, straggler, thermal

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster():
    cluster = Cluster.objects.create(name="alpha")
    Node.objects.create(cluster=cluster, name="node-02")
    Run.objects.create(cluster=cluster, name="run-1")
    return cluster


@pytest.fixture
def incident(cluster) -> Incident:
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0)
    alerts_sync(cluster=cluster, findings=[thermal(), straggler(rate=3.0)], now=T0 + 1200)
    return Incident.objects.get(cluster=cluster)


def client_of(username: str, *, operator: bool = True) -> Client:
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(make_operator(username, may_acknowledge=operator))
    return client


def test_it_shows_the_root_the_symptoms_and_the_apis_gpu_hours(incident):
    client = client_of("alice")
    page = client.get(f"/incidents/{incident.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-root-kind="thermal"' in html and "on node-02" in html and "GPU 3" in html
    kinds = re.findall(r'<tr data-alert-id="\d+" data-kind="(\w+)"', html)
    assert sorted(kinds) == ["straggler", "thermal"]
    api = client.get(f"/api/v1/incidents/{incident.pk}").json()
    shown = re.search(r'id="incident-gpu-hours" data-value="([\d.]+)"', html).group(1)
    assert float(shown) == api["gpu_hours_lost"] == 1.0  # 3 GPU-h/h for 20 minutes


def test_an_unknown_root_lists_the_candidates(cluster):
    Node.objects.create(cluster=cluster, name="node-04")
    Node.objects.create(cluster=cluster, name="node-06")
    silent = [
        finding(kind="heartbeat", subject=f"node:{n}", node=n, rank=None, severity="critical")
        for n in ("node-04", "node-06")
    ]
    hang = finding(kind="hang", subject="run:run-1", node=None, rank=None, severity="critical")
    alerts_sync(cluster=cluster, findings=[*silent, hang], now=T0)
    incident = Incident.objects.get(cluster=cluster)
    html = client_of("alice").get(f"/incidents/{incident.pk}/").content.decode()
    assert 'data-root-kind="">unknown' in html
    assert "heartbeat on node-04" in html and "heartbeat on node-06" in html


def test_the_timeline_has_the_alerts_and_the_commands_on_its_node_with_their_outcome(incident):
    cluster = incident.cluster
    at = datetime.fromtimestamp(T0 + 300, UTC)
    Command.objects.create(
        cluster=cluster, kind="cordon", node=Node.objects.get(cluster=cluster, name="node-02"),
        reason="hot GPU", idempotency_key=uuid.uuid4().hex, state="succeeded", issued_at=at,
        finished_at=at + timedelta(seconds=2), expires_at=at + timedelta(hours=1),
    )  # fmt: skip
    other = Node.objects.create(cluster=cluster, name="node-09")
    Command.objects.create(
        cluster=cluster, kind="cordon", node=other, reason="unrelated",
        idempotency_key=uuid.uuid4().hex, issued_at=at, expires_at=at + timedelta(hours=1),
    )  # fmt: skip
    html = client_of("alice").get(f"/incidents/{incident.pk}/").content.decode()
    events = re.findall(r'<li data-event="([^"]+)">', html)
    assert events.count("alert opened") == 2
    assert events[-2:] == ["cordon issued", "cordon succeeded"]
    assert "unrelated" not in html


def test_an_operator_gets_the_actions_that_fit_and_a_viewer_none(incident):
    html = client_of("alice").get(f"/incidents/{incident.pk}/").content.decode()
    assert 'action="/clusters/alpha/nodes/node-02/commands/cordon"' in html
    assert 'action="/clusters/alpha/nodes/node-02/commands/drain"' in html
    assert 'action="/clusters/alpha/runs/run-1/commands/checkpoint"' in html
    assert 'id="incident-ack"' in html
    viewer = client_of("victor", operator=False).get(f"/incidents/{incident.pk}/")
    assert viewer.status_code == 200
    assert "commands/cordon" not in viewer.content.decode()
    assert 'id="incident-ack"' not in viewer.content.decode()


def test_acknowledging_on_the_page_acknowledges_the_symptoms(incident):
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)
    client.force_login(make_operator("alice"))
    page = client.get(f"/incidents/{incident.pk}/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    refused = client.post(f"/incidents/{incident.pk}/ack", {"note": "no csrf"})
    assert refused.status_code == 403
    done = client.post(
        f"/incidents/{incident.pk}/ack", {"note": "fans", "csrfmiddlewaretoken": token.group(1)}
    )
    assert done.status_code == 302
    assert set(Alert.objects.filter(incident=incident).values_list("state", flat=True)) == {
        "acknowledged"
    }
    html = client.get(f"/incidents/{incident.pk}/").content.decode()
    assert "incident acknowledged" in html and 'id="incident-ack"' not in html


def test_the_alert_page_links_its_incident_and_other_clusters_are_404(incident):
    client = client_of("alice")
    alert = Alert.objects.get(kind="straggler")
    html = client.get(f"/alerts/{alert.pk}/").content.decode()
    assert f'href="/incidents/{incident.pk}/"' in html
    beta = Cluster.objects.create(name="beta")
    outsider = make_operator("mallory")
    ClusterRole.objects.filter(user=outsider).exclude(cluster=beta).delete()
    stranger = Client(HTTP_HOST="127.0.0.1")
    stranger.force_login(outsider)
    assert stranger.get(f"/incidents/{incident.pk}/").status_code == 404
    assert stranger.post(f"/incidents/{incident.pk}/ack", {}).status_code == 404


@override_settings(ALERT_HOLD_DOWN_S=0)
def test_a_resolved_incident_offers_no_actions(incident):
    alerts_sync(cluster=incident.cluster, findings=[], now=T0 + 1300)
    html = client_of("alice").get(f"/incidents/{incident.pk}/").content.decode()
    assert "commands/cordon" not in html and 'id="incident-ack"' not in html
    assert "incident resolved" in html


def test_anonymous_visitors_are_sent_to_log_in(incident):
    response = Client(HTTP_HOST="127.0.0.1").get(f"/incidents/{incident.pk}/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")
    assert Client(HTTP_HOST="127.0.0.1").get("/incidents/999999/").status_code == 302
