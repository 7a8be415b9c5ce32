"""Incidents: a sync folds its alerts by root cause, keeps incident ids across passes,
resolves an incident with its last alert, and notifies once per incident."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from apps.alerts.models import Alert, Incident, WebhookDelivery, WebhookEndpoint
from apps.alerts.services import alerts_sync
from apps.alerts.services.incidents import (
    IncidentAlreadyAcknowledged,
    IncidentResolved,
    incident_acknowledge,
)
from apps.audit.models import AuditEntry
from apps.clusters.models import Node
from tests.alerts.conftest import finding, make_operator

T0 = 1_764_470_000.0


def thermal(node: str = "node-02", gpu: int = 3):
    return finding(
        kind="thermal",
        subject=f"node:{node}/gpu:{gpu}",
        summary=f"GPU {gpu} of {node} runs at 91 °C",
        node=node,
        rank=None,
        gpu=gpu,
        evidence={"temp_c": 91},
    )


def straggler(node: str = "node-02", gpu: int = 3, rank: int = 3, rate: float = 2.0):
    return finding(
        subject=f"run:run-1/rank:{rank}",
        node=node,
        rank=rank,
        gpu=gpu,
        evidence={"slowdown": 0.3, "gpu_hours_lost_per_hour": rate},
    )


def sdc(node: str = "node-07"):
    return finding(
        kind="sdc",
        subject="run:run-1/rank:40",
        severity="critical",
        summary=f"rank 40 on {node} disagrees with its replicas",
        node=node,
        rank=40,
        evidence={},
    )


@pytest.fixture
def hooks(cluster):
    for fmt in ("generic", "slack", "alertmanager"):
        WebhookEndpoint.objects.create(cluster=cluster, url=f"http://127.0.0.1:9/{fmt}", format=fmt)
    Node.objects.create(cluster=cluster, name="node-07")
    return cluster


def test_a_hot_gpu_and_its_straggling_rank_open_one_incident_rooted_at_the_heat(cluster):
    alerts_sync(cluster=cluster, findings=[straggler(), thermal()], now=T0)
    [incident] = Incident.objects.filter(cluster=cluster)
    alerts = {a.kind: a for a in Alert.objects.filter(cluster=cluster)}
    assert {a.incident_id for a in alerts.values()} == {incident.pk}
    assert (incident.state, incident.root_kind, incident.root_node, incident.root_gpu) == (
        "open",
        "thermal",
        "node-02",
        3,
    )
    assert incident.root_alert == alerts["thermal"].pk
    assert incident.opened_at.timestamp() == T0


def test_a_symptom_seen_a_pass_later_joins_the_open_incident(cluster):
    alerts_sync(cluster=cluster, findings=[thermal()], now=T0)
    [incident] = Incident.objects.filter(cluster=cluster)
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0 + 30)
    assert list(Incident.objects.filter(cluster=cluster)) == [incident]
    straggling = Alert.objects.get(cluster=cluster, kind="straggler")
    assert straggling.incident_id == incident.pk


def test_independent_faults_stay_two_incidents(hooks):
    alerts_sync(cluster=hooks, findings=[thermal(), straggler(), sdc()], now=T0)
    incidents = list(Incident.objects.filter(cluster=hooks).order_by("pk"))
    assert [(i.root_kind, i.root_node) for i in incidents] == [
        ("thermal", "node-02"),
        ("sdc", "node-07"),
    ]
    assert Alert.objects.filter(incident=incidents[0]).count() == 2


def test_an_incident_resolves_when_its_last_alert_does(cluster):
    with override_settings(ALERT_HOLD_DOWN_S=0):
        alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0)
        alerts_sync(cluster=cluster, findings=[straggler()], now=T0 + 30)
        incident = Incident.objects.get(cluster=cluster)
        assert incident.state == "open"  # the straggler still fires
        alerts_sync(cluster=cluster, findings=[], now=T0 + 60)
    incident.refresh_from_db()
    assert incident.state == "resolved" and incident.resolved_at.timestamp() == T0 + 60
    # the condition returning is a new incident, not the resolved one reopened
    alerts_sync(cluster=cluster, findings=[thermal()], now=T0 + 90)
    assert Incident.objects.filter(cluster=cluster, state="open").exclude(pk=incident.pk).exists()


def test_one_notification_per_incident_naming_what_it_folded(hooks):
    alerts_sync(cluster=hooks, findings=[thermal(), straggler(), sdc()], now=T0)
    hot = Incident.objects.get(cluster=hooks, root_kind="thermal")
    opened = WebhookDelivery.objects.filter(event="opened", endpoint__format="generic")
    assert opened.count() == 2  # the hot GPU's incident and the SDC's: not one per alert
    body = opened.get(alert__incident=hot).payload
    assert body["incident"]["id"] == hot.pk
    assert body["incident"]["root_cause"] == {"kind": "thermal", "node": "node-02", "gpu": 3,
                                              "rank": None}  # fmt: skip
    assert sorted(a["kind"] for a in body["incident"]["folded"]) == ["straggler", "thermal"]
    slack = WebhookDelivery.objects.get(alert__incident=hot, endpoint__format="slack").payload
    assert f"Incident {hot.pk}: root cause thermal (node node-02, gpu 3)" in slack["text"]
    assert "folds 2 alerts" in slack["text"]
    [am] = WebhookDelivery.objects.get(alert__incident=hot, endpoint__format="alertmanager").payload
    assert am["labels"]["opsboard_incident"] == str(hot.pk)
    assert "straggler" in am["annotations"]["folded"]


def test_a_symptom_joining_an_open_incident_notifies_no_one_and_it_resolves_once(hooks):
    with override_settings(ALERT_HOLD_DOWN_S=0):
        alerts_sync(cluster=hooks, findings=[thermal()], now=T0)
        assert WebhookDelivery.objects.filter(event="opened").count() == 3  # one per endpoint
        alerts_sync(cluster=hooks, findings=[thermal(), straggler()], now=T0 + 30)
        assert WebhookDelivery.objects.filter(event="opened").count() == 3
        alerts_sync(cluster=hooks, findings=[straggler()], now=T0 + 60)
        assert not WebhookDelivery.objects.filter(event="resolved").exists()  # still open
        alerts_sync(cluster=hooks, findings=[], now=T0 + 90)
    resolved = WebhookDelivery.objects.filter(event="resolved")
    assert resolved.count() == 3
    assert {d.payload["incident"]["state"] for d in resolved if "incident" in d.payload} == {
        "resolved"
    }


def test_acknowledging_an_incident_acknowledges_its_firing_symptoms(cluster):
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0)
    incident = Incident.objects.get(cluster=cluster)
    alice = make_operator("alice")
    incident_acknowledge(incident=incident, user=alice, note="cooling ticket 12")
    states = set(Alert.objects.filter(incident=incident).values_list("state", "acknowledged_by"))
    assert states == {("acknowledged", alice.pk)}
    [entry] = AuditEntry.objects.filter(target=f"incident:{incident.pk}")
    assert (entry.action, entry.outcome, entry.reason) == (
        "incident.acknowledge",
        "succeeded",
        "cooling ticket 12",
    )
    with pytest.raises(IncidentAlreadyAcknowledged, match="already acknowledged by alice"):
        incident_acknowledge(incident=incident, user=make_operator("bob"))


def test_a_resolved_incident_cannot_be_acknowledged(cluster):
    with override_settings(ALERT_HOLD_DOWN_S=0):
        alerts_sync(cluster=cluster, findings=[thermal()], now=T0)
        alerts_sync(cluster=cluster, findings=[], now=T0 + 30)
    with pytest.raises(IncidentResolved):
        incident_acknowledge(incident=Incident.objects.get(), user=make_operator("alice"))


def test_folding_costs_the_same_statements_for_2_or_40_faults(cluster):
    def faults(count: int) -> list:
        found = []
        for i in range(count):
            found += [thermal(gpu=i), straggler(gpu=i, rank=i)]
        return found

    counts = {}
    for count in (1, 20):
        Alert.objects.filter(cluster=cluster).delete()
        Incident.objects.filter(cluster=cluster).delete()
        with CaptureQueriesContext(connection) as opened:
            alerts_sync(cluster=cluster, findings=faults(count), now=T0)
        assert Incident.objects.filter(cluster=cluster).count() == count
        with CaptureQueriesContext(connection) as gone:
            alerts_sync(cluster=cluster, findings=[], now=T0 + 3600)
        assert not Incident.objects.filter(cluster=cluster, state="open").exists()
        # the opening pass creates one row per alert; folding adds a fixed few statements
        counts[count] = (len(opened) - 2 * count, len(gone))
    assert counts[1] == counts[20]


def test_an_alert_open_from_before_folding_is_folded_at_the_next_pass(cluster):
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0)
    Alert.objects.update(incident=None)  # as alerts opened before incidents existed
    Incident.objects.all().delete()
    alerts_sync(cluster=cluster, findings=[thermal(), straggler()], now=T0 + 30)
    [incident] = Incident.objects.filter(cluster=cluster)
    assert set(Alert.objects.values_list("incident", flat=True)) == {incident.pk}
    assert incident.root_kind == "thermal"
