"""Through the live stack: batches posted to the API → worker → beat-driven evaluation →
an alert in GET /api/v1/alerts → acknowledged by an operator over HTTP → resolved."""

from __future__ import annotations

import time

import httpx
import pytest
from django.contrib.auth import get_user_model

from apps.alerts.models import ClusterDetectorConfig
from apps.audit.models import AuditEntry
from launcher.procs import wait_until
from tests.conftest import make_batch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def alerts_of(agent, **params) -> list[dict]:
    response = agent.get("/api/v1/alerts", **params)
    assert response.status_code == 200
    return response.json()["alerts"]


def logged_in(base_url: str) -> httpx.Client:
    """An operator of every cluster (a superuser: the cluster appears with the agent's first
    batch), logged in through the login page."""
    get_user_model().objects.create_superuser("oncall", password="pw-12345-long")
    client = httpx.Client(base_url=base_url, timeout=30)
    client.get("/accounts/login/")
    response = client.post(
        "/accounts/login/",
        data={
            "username": "oncall",
            "password": "pw-12345-long",
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
    )
    assert response.status_code == 302, response.text
    return client


def test_an_xid_event_fires_an_alert_that_an_operator_acknowledges(agent, live_stack):
    batch = make_batch(node="node-03", samples=2)
    batch["events"] = [{"ts": time.time(), "kind": "xid", "gpu": 3, "code": 79}]
    assert agent.post(batch).status_code == 202
    [alert] = wait_until(
        lambda: alerts_of(agent, state="firing", node="node-03"), 30, "the xid alert"
    )
    assert (alert["kind"], alert["severity"], alert["gpu"]) == ("xid", "critical", 3)
    assert "79" in alert["summary"]

    operator = logged_in(live_stack.url)
    path = f"/api/v1/alerts/{alert['id']}/ack"
    refused = operator.post(path, json={"note": "no csrf"})
    assert refused.status_code == 403
    csrf = {"X-CSRFToken": operator.cookies["csrftoken"]}
    response = operator.post(path, json={"note": "draining node-03"}, headers=csrf)
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "acknowledged"
    [listed] = alerts_of(agent, node="node-03")
    assert listed["state"] == "acknowledged" and listed["acknowledged_at"] is not None
    assert AuditEntry.objects.get(target=f"alert:{alert['id']}").reason == "draining node-03"
    operator.close()


def test_a_silent_node_fires_a_heartbeat_alert_that_resolves_when_it_returns(agent, agent_token):
    ClusterDetectorConfig.objects.create(
        cluster=agent_token[0].cluster, overrides={"heartbeat_min_s": 4, "heartbeat_factor": 2}
    )
    for _ in range(4):  # a batch a second: the node's usual interval
        assert agent.post(make_batch(node="node-hb", samples=1)).status_code == 202
        time.sleep(1)
    silent_since = time.time()
    [alert] = wait_until(
        lambda: alerts_of(agent, state="firing", node="node-hb"), 30, "the heartbeat alert"
    )
    assert alert["kind"] == "heartbeat" and alert["severity"] == "critical"
    assert alert["opened_at"] - silent_since >= 3

    def back_and_resolved() -> list[dict]:
        """The node sends again, a batch a second, until its alert resolves."""
        assert agent.post(make_batch(node="node-hb", samples=1)).status_code == 202
        return alerts_of(agent, state="resolved", node="node-hb")

    [resolved] = wait_until(back_and_resolved, 30, "the node's return", interval=1)
    assert resolved["id"] == alert["id"] and resolved["resolved_at"] > alert["opened_at"]
    assert alerts_of(agent, state="firing", node="node-hb") == []
