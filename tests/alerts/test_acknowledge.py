"""Acknowledging: one operator wins, the audit trail records it, subscribers hear of it."""

import threading
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection
from django.test import override_settings

from apps.alerts.models import Alert
from apps.alerts.services import (
    AlertAlreadyAcknowledged,
    AlertResolved,
    alert_acknowledge,
    alerts_sync,
)
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run
from tests.alerts.conftest import finding, make_operator

T0 = 1_764_470_000.0


@pytest.fixture
def alert(cluster) -> Alert:
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    return Alert.objects.get(cluster=cluster)


def test_acknowledging_records_who_when_and_why(alert):
    alice = make_operator("alice")
    acknowledged = alert_acknowledge(alert=alert, user=alice, note="looking at node-02")
    assert acknowledged.state == "acknowledged"
    assert acknowledged.acknowledged_by == alice and acknowledged.ack_note == "looking at node-02"
    [entry] = AuditEntry.objects.filter(target=f"alert:{alert.pk}")
    assert (entry.action, entry.actor_user_id, entry.reason) == (
        "alert.acknowledge",
        alice.pk,
        "looking at node-02",
    )
    assert entry.outcome == "succeeded" and entry.cluster_id == alert.cluster_id


def test_a_second_acknowledgement_names_the_first(alert):
    alert_acknowledge(alert=alert, user=make_operator("alice"), note="")
    with pytest.raises(AlertAlreadyAcknowledged, match="already acknowledged by alice"):
        alert_acknowledge(alert=alert, user=make_operator("bob"), note="")
    assert AuditEntry.objects.filter(target=f"alert:{alert.pk}").count() == 1


@override_settings(ALERT_HOLD_DOWN_S=0)
def test_a_resolved_alert_cannot_be_acknowledged(cluster, alert):
    alerts_sync(cluster=cluster, findings=[], now=T0 + 1)
    with pytest.raises(AlertResolved):
        alert_acknowledge(alert=alert, user=make_operator("alice"), note="")
    assert Alert.objects.get(pk=alert.pk).state == "resolved"


@override_settings(ALERT_HOLD_DOWN_S=60)
def test_an_acknowledged_alert_keeps_updating_and_still_resolves(cluster, alert):
    alert_acknowledge(alert=alert, user=make_operator("alice"), note="")
    alerts_sync(cluster=cluster, findings=[finding(severity="critical")], now=T0 + 5)
    current = Alert.objects.get(pk=alert.pk)
    assert (current.state, current.severity) == ("acknowledged", "critical")
    alerts_sync(cluster=cluster, findings=[], now=T0 + 70)
    assert Alert.objects.get(pk=alert.pk).state == "resolved"


@pytest.mark.django_db(transaction=True)
def test_two_operators_acknowledging_at_once_exactly_one_wins():
    cluster = Cluster.objects.create(name="race")
    alerts_sync(cluster=cluster, findings=[finding()], now=time.time())
    alert = Alert.objects.get(cluster=cluster)
    users = [make_operator("alice"), make_operator("bob")]
    barrier = threading.Barrier(2)
    outcomes: dict[str, str] = {}

    def acknowledge(user) -> None:
        try:
            barrier.wait(timeout=10)
            alert_acknowledge(alert=alert, user=user, note=f"mine ({user.username})")
            outcomes[user.username] = "won"
        except AlertAlreadyAcknowledged as error:
            outcomes[user.username] = str(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=acknowledge, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [name for name, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1 and len(outcomes) == 2
    [loser] = set(outcomes) - set(winners)
    assert outcomes[loser].startswith(f"already acknowledged by {winners[0]}")
    [entry] = AuditEntry.objects.filter(target=f"alert:{alert.pk}")
    assert entry.actor_name == winners[0] and entry.reason == f"mine ({winners[0]})"
    assert Alert.objects.get(pk=alert.pk).acknowledged_by.username == winners[0]


def test_nothing_is_broadcast_before_commit(cluster, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        alerts_sync(cluster=cluster, findings=[finding()], now=time.time())
    assert len(callbacks) == 1  # the broadcast waits for the commit


def test_a_sync_that_changes_nothing_visible_broadcasts_nothing(
    cluster, django_capture_on_commit_callbacks
):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        alerts_sync(cluster=cluster, findings=[finding(evidence={"slowdown": 0.3})], now=T0 + 5)
    assert callbacks == []


@pytest.mark.django_db(transaction=True)
def test_a_browser_on_the_cluster_page_receives_alert_changes():
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from opsboard.asgi import application

    cluster = Cluster.objects.create(name="watched")
    Node.objects.create(cluster=cluster, name="node-02")
    Run.objects.create(cluster=cluster, name="run-1")
    client = Client()
    operator = make_operator("operator")
    client.force_login(operator)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()

    async def scenario():
        communicator = WebsocketCommunicator(
            application,
            "/ws/clusters/watched/",
            headers=[(b"cookie", cookie), (b"origin", b"http://127.0.0.1")],
        )
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        assert (await communicator.receive_json_from(timeout=10))["type"] == "snapshot"
        await sync_to_async(alerts_sync)(cluster=cluster, findings=[finding()], now=time.time())
        opened = await communicator.receive_json_from(timeout=10)
        alert = await sync_to_async(Alert.objects.get)(pk=opened["alert"]["id"])
        await sync_to_async(alert_acknowledge)(alert=alert, user=operator, note="mine")
        acknowledged = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return opened, acknowledged

    opened, acknowledged = async_to_sync(scenario)()
    assert opened["type"] == "alert" and set(opened) == {"type", "alert"}
    assert opened["alert"]["kind"] == "straggler" and opened["alert"]["state"] == "firing"
    assert acknowledged["alert"]["state"] == "acknowledged"
    assert acknowledged["alert"]["acknowledged_at"] is not None
