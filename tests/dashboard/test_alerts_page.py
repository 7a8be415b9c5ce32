"""The alerts page: filters, links to the subject, acknowledgement with a note (permission
and CSRF enforced) through the service alert_acknowledge."""

import re
import time

import pytest
from django.test import Client

from apps.alerts.models import Alert
from apps.alerts.services import alerts_sync
from apps.audit.models import AuditEntry
from detectors.types import Finding
from tests.dashboard.conftest import RUN, operator

pytestmark = pytest.mark.django_db


def findings() -> list[Finding]:
    return [
        Finding(kind="straggler", subject=f"run:{RUN}/rank:5", severity="warning",
                summary="rank 5 is slow", run=RUN, node="node-01", rank=5),
        Finding(kind="xid", subject="node:node-00/gpu:3", severity="critical",
                summary="XID 79 on node-00 GPU 3", node="node-00", gpu=3),
    ]  # fmt: skip


@pytest.fixture
def alerts(cluster):
    alerts_sync(cluster=cluster, findings=findings(), now=time.time())
    return {alert.kind: alert for alert in Alert.objects.all()}


def listed(client: Client, query: str = "") -> list[str]:
    html = client.get(f"/alerts/{query}").content.decode()
    return re.findall(r'<td class="kind">(\w+)</td>', html)


def test_it_filters_by_kind_state_run_and_node(alerts, client_in, cluster):
    assert sorted(listed(client_in)) == ["straggler", "xid"]
    assert listed(client_in, "?kind=xid") == ["xid"]
    assert listed(client_in, f"?run={RUN}") == ["straggler"]
    assert listed(client_in, "?node=node-00") == ["xid"]
    assert listed(client_in, "?state=resolved") == []
    assert sorted(listed(client_in, f"?cluster={cluster.name}&state=firing")) == [
        "straggler",
        "xid",
    ]


def test_it_links_each_alert_to_its_subject(alerts, client_in, cluster):
    html = client_in.get("/alerts/").content.decode()
    assert f'href="/clusters/{cluster.name}/runs/{RUN}/"' in html
    assert f'href="/clusters/{cluster.name}/nodes/node-01/"' in html
    assert f'href="/clusters/{cluster.name}/nodes/node-00/"' in html


def csrf_client(user) -> tuple[Client, str]:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/alerts/")
    return client, client.cookies["csrftoken"].value


def test_acknowledging_records_the_note_and_the_operator(alerts):
    user = operator("ack")
    client, token = csrf_client(user)
    alert = alerts["xid"]
    response = client.post(
        f"/alerts/{alert.id}/ack",
        {"note": "draining node-00", "next": "/alerts/?kind=xid", "csrfmiddlewaretoken": token},
    )
    assert response.status_code == 302 and response["Location"] == "/alerts/?kind=xid"
    alert.refresh_from_db()
    assert alert.state == "acknowledged" and alert.acknowledged_by == user
    assert alert.ack_note == "draining node-00"
    assert AuditEntry.objects.get(target=f"alert:{alert.pk}").reason == "draining node-00"
    html = client.get("/alerts/?kind=xid").content.decode()
    assert "acknowledged." in html and "acknowledged by ack" in html
    again = client.post(f"/alerts/{alert.id}/ack", {"csrfmiddlewaretoken": token}, follow=True)
    assert "already acknowledged by ack" in again.content.decode()


def test_it_refuses_operators_without_the_permission(alerts):
    client, token = csrf_client(operator("viewer", may_acknowledge=False))
    alert = alerts["straggler"]
    response = client.post(f"/alerts/{alert.id}/ack", {"csrfmiddlewaretoken": token})
    assert response.status_code == 403
    alert.refresh_from_db()
    assert alert.state == "firing"


def test_it_refuses_a_post_without_the_csrf_token(alerts):
    client, _ = csrf_client(operator("ack"))
    alert = alerts["straggler"]
    assert client.post(f"/alerts/{alert.id}/ack", {"note": "x"}).status_code == 403
    alert.refresh_from_db()
    assert alert.state == "firing"


def test_it_does_not_redirect_to_another_site(alerts):
    client, token = csrf_client(operator("ack"))
    response = client.post(
        f"/alerts/{alerts['xid'].id}/ack",
        {"next": "https://evil.example/", "csrfmiddlewaretoken": token},
    )
    assert response["Location"] == "/alerts/"


def test_the_alerts_page_follows_the_listed_clusters_live(alerts, client_in, cluster):
    from tests.dashboard.test_pages import json_script

    html = client_in.get(f"/alerts/?cluster={cluster.name}").content.decode()
    assert json_script(html, "live-config")["clusters"] == [cluster.name]
    assert 'id="live-status"' in html
