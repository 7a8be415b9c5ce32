"""GET /api/v1/incidents, GET /api/v1/incidents/ID and POST /api/v1/incidents/ID/ack."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from apps.access.models import ClusterRole
from apps.alerts.models import Alert, Incident
from apps.alerts.services import alerts_sync
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from apps.runs.models import Run
from tests.alerts.conftest import make_operator
from tests.alerts.test_api import csrf_post, operator_client, reader
from tests.alerts.test_incidents import T0, sdc, straggler, thermal

KEYS = {"id", "state", "root_cause", "candidates", "alerts", "opened_at", "acknowledged_at"}
KEYS |= {"resolved_at", "gpu_hours_lost"}


@pytest.fixture
def secret(cluster) -> str:
    return token_issue(cluster_name=cluster.name)[1]


@pytest.fixture
def incidents(cluster) -> dict[str, Incident]:
    """A hot GPU with its straggler (open, 2 GPU-h/h for the half hour seen), an SDC on
    node-07 that resolved."""
    Node.objects.create(cluster=cluster, name="node-07")
    with override_settings(ALERT_HOLD_DOWN_S=0):
        alerts_sync(cluster=cluster, findings=[thermal(), straggler(), sdc()], now=T0)
        alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0 + 1800)
    return {i.root_kind: i for i in Incident.objects.filter(cluster=cluster)}


def test_it_lists_incidents_newest_first_in_the_contract_shape(incidents, secret):
    response = reader(secret).get("/api/v1/incidents")
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["incidents"]
    hot = incidents["thermal"]
    alerts = {a.kind: a.pk for a in Alert.objects.all()}
    assert [i["id"] for i in body["incidents"]] == [incidents["sdc"].pk, hot.pk]  # same time
    for incident in body["incidents"]:
        assert set(incident) == KEYS
    assert body["incidents"][1] == {
        "id": hot.pk,
        "state": "open",
        "root_cause": {"kind": "thermal", "node": "node-02", "gpu": 3, "rank": None},
        "candidates": [
            {
                "kind": "thermal",
                "node": "node-02",
                "gpu": 3,
                "rank": None,
                "alert": alerts["thermal"],
            }
        ],  # fmt: skip
        "alerts": sorted([alerts["thermal"], alerts["straggler"]]),
        "opened_at": T0,
        "acknowledged_at": None,
        "resolved_at": None,
        "gpu_hours_lost": 1.0,  # 2 GPU-hours an hour, for the half hour between the passes
    }
    assert body["incidents"][0]["state"] == "resolved"
    assert body["incidents"][0]["resolved_at"] == T0 + 1800


def test_each_alert_names_its_incident(incidents, secret):
    alerts = reader(secret).get("/api/v1/alerts").json()["alerts"]
    by_kind = {a["kind"]: a["incident"] for a in alerts}
    assert by_kind == {
        "thermal": incidents["thermal"].pk,
        "straggler": incidents["thermal"].pk,
        "sdc": incidents["sdc"].pk,
    }


@pytest.mark.parametrize(
    ("params", "roots"),
    [
        ({"state": "open"}, ["thermal"]),
        ({"state": "resolved"}, ["sdc"]),
        ({"node": "node-07"}, ["sdc"]),
        ({"node": "node-02", "state": "open"}, ["thermal"]),
        ({"run": "run-1"}, ["sdc", "thermal"]),
        ({"run": "nope"}, []),
    ],
)
def test_it_filters_by_state_run_and_node(incidents, secret, params, roots):
    response = reader(secret).get("/api/v1/incidents", params)
    assert response.status_code == 200
    assert [i["root_cause"]["kind"] for i in response.json()["incidents"]] == roots


def test_it_rejects_an_unknown_state_naming_the_field(incidents, secret):
    response = reader(secret).get("/api/v1/incidents", {"state": "firing"})
    assert response.status_code == 400
    assert "state" in str(response.json()["errors"])


def test_one_incident_and_the_list_agree(incidents, secret):
    hot = incidents["thermal"]
    one = reader(secret).get(f"/api/v1/incidents/{hot.pk}")
    assert one.status_code == 200
    listed = reader(secret).get("/api/v1/incidents", {"state": "open"}).json()["incidents"]
    assert listed == [one.json()]


def test_a_reader_sees_only_the_clusters_it_may(incidents):
    other = Cluster.objects.create(name="beta")
    Run.objects.create(cluster=other, name="run-1")
    Node.objects.create(cluster=other, name="node-02")
    alerts_sync(cluster=other, findings=[thermal()], now=T0)
    theirs = Incident.objects.get(cluster=other)
    token = token_issue(cluster_name="beta")[1]
    seen = reader(token).get("/api/v1/incidents").json()["incidents"]
    assert [i["id"] for i in seen] == [theirs.pk]
    assert reader(token).get(f"/api/v1/incidents/{incidents['thermal'].pk}").status_code == 404
    # a user with a role in alpha only sees alpha's
    client = Client(HTTP_HOST="127.0.0.1")
    user = make_operator("carol")
    ClusterRole.objects.filter(user=user, cluster=other).delete()
    client.force_login(user)
    ids = {i["id"] for i in client.get("/api/v1/incidents").json()["incidents"]}
    assert theirs.pk not in ids and incidents["thermal"].pk in ids
    assert client.get(f"/api/v1/incidents/{theirs.pk}").status_code == 404
    assert client.get("/api/v1/incidents", {"cluster": "beta"}).status_code == 404


def test_it_needs_a_token_or_a_login(incidents):
    assert Client(HTTP_HOST="127.0.0.1").get("/api/v1/incidents").status_code == 401


def test_the_list_costs_the_same_queries_for_1_or_12_incidents(cluster, secret):
    Node.objects.create(cluster=cluster, name="node-07")
    counts = []
    for count in (1, 12):
        Alert.objects.all().delete()
        Incident.objects.all().delete()
        alerts_sync(
            cluster=cluster,
            findings=[f for g in range(count) for f in (thermal(gpu=g), straggler(gpu=g, rank=g))],
            now=T0,
        )
        with CaptureQueriesContext(connection) as queries:
            body = reader(secret).get("/api/v1/incidents").json()
        assert len(body["incidents"]) == count
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert counts[0] <= 4  # the token, the incidents, their alerts (and its last-used mark)


def test_an_operator_acknowledges_the_incident_and_its_symptoms(incidents):
    hot = incidents["thermal"]
    response = csrf_post(
        operator_client("alice"), f"/api/v1/incidents/{hot.pk}/ack", {"note": "fans"}
    )
    assert response.status_code == 200, response.content
    assert response.json()["acknowledged_at"] is not None
    assert set(Alert.objects.filter(incident=hot).values_list("state", flat=True)) == {
        "acknowledged"
    }
    again = csrf_post(operator_client("bob"), f"/api/v1/incidents/{hot.pk}/ack", {"note": ""})
    assert again.status_code == 409 and "already acknowledged by alice" in again.text


def test_acknowledging_a_resolved_incident_is_a_conflict(incidents):
    response = csrf_post(
        operator_client("alice"), f"/api/v1/incidents/{incidents['sdc'].pk}/ack", {}
    )
    assert response.status_code == 409


def test_a_viewer_is_refused_and_the_attempt_is_recorded(incidents):
    hot = incidents["thermal"]
    client = operator_client("victor", may_acknowledge=False)
    response = csrf_post(client, f"/api/v1/incidents/{hot.pk}/ack", {"note": "let me"})
    assert response.status_code == 403
    [entry] = AuditEntry.objects.filter(target=f"incident:{hot.pk}")
    assert (entry.actor_name, entry.outcome) == ("victor", "denied")
    assert set(Alert.objects.filter(incident=hot).values_list("state", flat=True)) == {"firing"}


def test_acknowledging_needs_the_csrf_token(incidents):
    client = operator_client("alice")
    response = client.post(
        f"/api/v1/incidents/{incidents['thermal'].pk}/ack", {}, content_type="application/json"
    )
    assert response.status_code in (401, 403)
    assert not Alert.objects.filter(state="acknowledged").exists()


def test_acknowledging_an_unknown_incident_is_404_and_recorded(incidents):
    response = csrf_post(operator_client("alice"), "/api/v1/incidents/999999/ack", {})
    assert response.status_code == 404
    assert AuditEntry.objects.filter(target="incident:999999", outcome="denied").exists()
