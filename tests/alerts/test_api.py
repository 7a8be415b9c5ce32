"""GET /api/v1/alerts (contract shape, filters, auth) and POST /api/v1/alerts/ID/ack."""

import pytest
from django.test import Client, override_settings

from apps.access.services import user_token_issue
from apps.alerts.models import Alert
from apps.alerts.services import alerts_sync
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster, Node
from apps.clusters.services import token_issue
from tests.alerts.conftest import finding, make_operator, xid_finding

T0 = 1_764_470_000.0
CONTRACT_KEYS = {
    "id",
    "kind",
    "severity",
    "state",
    "run",
    "node",
    "rank",
    "gpu",
    "summary",
    "evidence",
    "opened_at",
    "acknowledged_at",
    "resolved_at",
    "incident",
    # amber that ages (docs/contract.md: an extension)
    "aged_at",
    "silenced_until",
    "silence_reason",
}


@pytest.fixture
def secret(cluster) -> str:
    return token_issue(cluster_name=cluster.name)[1]


def reader(secret: str) -> Client:
    return Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {secret}")


def operator_client(username: str = "alice", may_acknowledge: bool = True) -> Client:
    client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)
    client.force_login(make_operator(username, may_acknowledge=may_acknowledge))
    return client


def csrf_post(client: Client, path: str, body: dict):
    client.get("/accounts/login/")  # sets the CSRF cookie, as the page would
    token = client.cookies["csrftoken"].value
    return client.post(path, body, content_type="application/json", HTTP_X_CSRFTOKEN=token)


@pytest.fixture
def alerts(cluster) -> dict[str, Alert]:
    Node.objects.create(cluster=cluster, name="node-05")
    xid = xid_finding()
    heartbeat = finding(kind="heartbeat", subject="node:node-05", node="node-05", run=None)
    with override_settings(ALERT_HOLD_DOWN_S=0):
        alerts_sync(cluster=cluster, findings=[finding()], now=T0)
        alerts_sync(cluster=cluster, findings=[finding(), xid, heartbeat], now=T0 + 10)
        alerts_sync(cluster=cluster, findings=[finding(), xid], now=T0 + 20)
    return {alert.kind: alert for alert in Alert.objects.filter(cluster=cluster)}


def test_it_lists_the_clusters_alerts_newest_first_in_the_contract_shape(alerts, secret):
    response = reader(secret).get("/api/v1/alerts")
    assert response.status_code == 200
    body = response.json()
    assert list(body) == ["alerts"]
    assert [a["kind"] for a in body["alerts"]] == ["heartbeat", "xid", "straggler"]
    for alert in body["alerts"]:
        assert set(alert) == CONTRACT_KEYS
    xid = body["alerts"][1]
    assert xid == {
        "id": alerts["xid"].pk,
        "kind": "xid",
        "severity": "critical",
        "state": "firing",
        "run": None,
        "node": "node-05",
        "rank": None,
        "gpu": 3,
        "summary": "XID 79 on node-05 GPU 3: GPU has fallen off the bus",
        "evidence": {"code": 79},
        "opened_at": T0 + 10,
        "acknowledged_at": None,
        "resolved_at": None,
        "incident": alerts["xid"].incident_id,
        "aged_at": None,
        "silenced_until": None,
        "silence_reason": "",
    }
    assert alerts["xid"].incident_id is not None  # a lone alert is an incident of one
    assert body["alerts"][0]["state"] == "resolved"
    assert body["alerts"][0]["resolved_at"] == T0 + 20


@pytest.mark.parametrize(
    ("params", "kinds"),
    [
        ({"run": "run-1"}, ["straggler"]),
        ({"node": "node-05"}, ["heartbeat", "xid"]),
        ({"state": "resolved"}, ["heartbeat"]),
        ({"state": "firing"}, ["xid", "straggler"]),
        ({"since": T0 + 5}, ["heartbeat", "xid"]),
        ({"since": T0 + 15}, ["heartbeat"]),  # resolved since
        ({"node": "node-05", "state": "firing"}, ["xid"]),
        ({"run": "nope"}, []),
    ],
)
def test_it_filters_by_run_node_state_and_since(alerts, secret, params, kinds):
    response = reader(secret).get("/api/v1/alerts", params)
    assert response.status_code == 200
    assert [a["kind"] for a in response.json()["alerts"]] == kinds


def test_it_rejects_an_unknown_state_naming_the_field(alerts, secret):
    response = reader(secret).get("/api/v1/alerts", {"state": "open"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "state"


def test_a_token_sees_only_its_own_clusters_alerts(alerts):
    other = token_issue(cluster_name="beta")[1]
    alerts_sync(cluster=Cluster.objects.get(name="beta"), findings=[finding(kind="sdc")], now=T0)
    kinds = [a["kind"] for a in reader(other).get("/api/v1/alerts").json()["alerts"]]
    assert kinds == ["sdc"]


def test_it_needs_a_token_or_a_login(alerts):
    response = Client(HTTP_HOST="127.0.0.1").get("/api/v1/alerts")
    assert response.status_code == 401
    assert response.json()["errors"][0]["loc"] == "Authorization"
    assert reader("obt_wrong").get("/api/v1/alerts").status_code == 401


def test_a_logged_in_operator_may_name_the_cluster(alerts):
    alerts_sync(cluster=Cluster.objects.create(name="beta"), findings=[finding(kind="sdc")], now=T0)
    client = operator_client(may_acknowledge=False)
    everything = client.get("/api/v1/alerts").json()["alerts"]
    assert len(everything) == 4
    alpha = client.get("/api/v1/alerts", {"cluster": "alpha"}).json()["alerts"]
    assert len(alpha) == 3
    missing = client.get("/api/v1/alerts", {"cluster": "nope"})
    assert missing.status_code == 404 and missing.json()["errors"][0]["loc"] == "cluster"


def test_an_operator_acknowledges_with_a_note(alerts):
    client = operator_client()
    response = csrf_post(client, f"/api/v1/alerts/{alerts['xid'].pk}/ack", {"note": "draining"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == CONTRACT_KEYS
    assert body["state"] == "acknowledged" and body["acknowledged_at"] is not None
    [entry] = AuditEntry.objects.filter(target=f"alert:{alerts['xid'].pk}")
    assert (entry.actor_name, entry.reason) == ("alice", "draining")


def test_acknowledging_twice_is_a_conflict(alerts):
    path = f"/api/v1/alerts/{alerts['xid'].pk}/ack"
    assert csrf_post(operator_client("alice"), path, {}).status_code == 200
    response = csrf_post(operator_client("bob"), path, {"note": "me too"})
    assert response.status_code == 409
    assert "already acknowledged by alice" in response.json()["errors"][0]["msg"]


def test_acknowledging_a_resolved_alert_is_a_conflict(alerts):
    response = csrf_post(operator_client(), f"/api/v1/alerts/{alerts['heartbeat'].pk}/ack", {})
    assert response.status_code == 409
    assert response.json()["errors"] == [{"loc": "state", "msg": "the alert is already resolved"}]


def test_acknowledging_needs_the_permission(alerts):
    client = operator_client(may_acknowledge=False)
    response = csrf_post(client, f"/api/v1/alerts/{alerts['xid'].pk}/ack", {})
    assert response.status_code == 403
    assert Alert.objects.get(pk=alerts["xid"].pk).state == "firing"


def test_acknowledging_needs_the_csrf_token(alerts):
    client = operator_client()
    response = client.post(
        f"/api/v1/alerts/{alerts['xid'].pk}/ack", {"note": "x"}, content_type="application/json"
    )
    assert response.status_code == 403
    assert Alert.objects.get(pk=alerts["xid"].pk).state == "firing"


def test_an_agent_token_cannot_acknowledge(alerts, secret):
    response = reader(secret).post(
        f"/api/v1/alerts/{alerts['xid'].pk}/ack", {}, content_type="application/json"
    )
    assert response.status_code == 401


def test_acknowledging_an_unknown_alert_is_404(alerts):
    assert csrf_post(operator_client(), "/api/v1/alerts/999999/ack", {}).status_code == 404


def test_a_note_too_long_is_rejected(alerts):
    response = csrf_post(
        operator_client(), f"/api/v1/alerts/{alerts['xid'].pk}/ack", {"note": "x" * 2001}
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == "note"


def test_an_operators_personal_token_acknowledges_and_a_viewers_is_refused(alerts):
    path = f"/api/v1/alerts/{alerts['xid'].pk}/ack"
    viewer = user_token_issue(user=make_operator("vera", may_acknowledge=False))[1]
    refused = reader(viewer).post(path, {"note": "x"}, content_type="application/json")
    assert refused.status_code == 403
    assert Alert.objects.get(pk=alerts["xid"].pk).state == "firing"
    operator = user_token_issue(user=make_operator("otto"))[1]
    done = reader(operator).post(path, {"note": "on it"}, content_type="application/json")
    assert done.status_code == 200 and done.json()["state"] == "acknowledged"
    entry = AuditEntry.objects.get(target=f"alert:{alerts['xid'].pk}", outcome="succeeded")
    assert (entry.actor_name, entry.actor_kind, entry.reason) == ("otto", "token", "on it")
