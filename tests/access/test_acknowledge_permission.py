"""Acknowledging an alert takes operate on its cluster; every attempt is audited."""

import pytest

from apps.alerts.models import Alert
from apps.audit.models import AuditEntry
from tests.access.conftest import client_of, user_with
from tests.access.test_read_scoping import alert_in

pytestmark = pytest.mark.django_db


def ack(client, alert: Alert):
    return client.post(
        f"/api/v1/alerts/{alert.pk}/ack", {"note": "looking"}, content_type="application/json"
    )


@pytest.mark.parametrize(("role", "status", "outcome"), [
    ("viewer", 403, "denied"),
    ("operator", 200, "succeeded"),
    ("admin", 200, "succeeded"),
])  # fmt: skip
def test_it_lets_operators_and_admins_acknowledge_and_audits_each_attempt(
    clusters, role, status, outcome
):
    alert = alert_in("alpha")
    response = ack(client_of(user_with("u", alpha=role)), alert)
    assert response.status_code == status, response.content
    [entry] = AuditEntry.objects.filter(action="alert.acknowledge", target=f"alert:{alert.pk}")
    assert (entry.outcome, entry.actor_name, entry.cluster_name) == (outcome, "u", "alpha")
    assert entry.reason == "looking"
    assert entry.client_ip == "127.0.0.1" and entry.request_id
    alert.refresh_from_db()
    assert alert.state == ("acknowledged" if status == 200 else "firing")


def test_it_answers_404_for_an_alert_of_another_cluster(clusters):
    alert = alert_in("beta")
    response = ack(client_of(user_with("op", alpha="operator")), alert)
    assert response.status_code == 404
    alert.refresh_from_db()
    assert alert.state == "firing"


def test_it_refuses_a_viewer_on_the_alerts_page_form_and_audits_it(clusters):
    alert = alert_in("alpha")
    client = client_of(user_with("vera", alpha="viewer"))
    response = client.post(f"/alerts/{alert.pk}/ack", {"note": "mine"})
    assert response.status_code == 403
    assert AuditEntry.objects.get(target=f"alert:{alert.pk}").outcome == "denied"


def test_it_keeps_the_request_id_the_client_sent(clusters):
    alert = alert_in("alpha")
    client = client_of(user_with("op", alpha="operator"))
    client.post(
        f"/api/v1/alerts/{alert.pk}/ack", {"note": ""}, content_type="application/json",
        headers={"X-Request-ID": "req-42"},
    )  # fmt: skip
    assert AuditEntry.objects.get(target=f"alert:{alert.pk}").request_id == "req-42"
