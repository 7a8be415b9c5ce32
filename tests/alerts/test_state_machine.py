"""alerts_sync keeps one alert per condition: open, update, escalate, hold down, resolve."""

import threading
import time

import pytest
from django.db import IntegrityError, close_old_connections, connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from apps.alerts.models import Alert
from apps.alerts.services import alerts_sync
from apps.clusters.models import Cluster
from tests.alerts.conftest import finding

T0 = 1_764_470_000.0


def only_alert(cluster) -> Alert:
    [alert] = Alert.objects.filter(cluster=cluster)
    return alert


def test_it_opens_a_firing_alert_for_a_new_finding(cluster):
    result = alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    alert = only_alert(cluster)
    assert result.opened == [alert.pk]
    assert (alert.kind, alert.subject, alert.state, alert.severity) == (
        "straggler",
        "run:run-1/rank:3",
        "firing",
        "warning",
    )
    assert alert.run.name == "run-1" and alert.node.name == "node-02" and alert.rank == 3
    assert alert.opened_at.timestamp() == alert.last_seen_at.timestamp() == T0
    assert alert.evidence == {"slowdown": 0.21}


def test_it_updates_the_open_alert_instead_of_opening_another(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    later = finding(summary="rank 3 on node-02 computes 25% slower", evidence={"slowdown": 0.25})
    result = alerts_sync(cluster=cluster, findings=[later], now=T0 + 5)
    alert = only_alert(cluster)
    assert result.opened == [] and result.updated == [alert.pk]
    assert alert.summary == later.summary and alert.evidence == {"slowdown": 0.25}
    assert alert.last_seen_at.timestamp() == T0 + 5 and alert.opened_at.timestamp() == T0


def test_it_escalates_and_never_lowers_the_severity(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    result = alerts_sync(cluster=cluster, findings=[finding(severity="critical")], now=T0 + 5)
    assert result.escalated == [only_alert(cluster).pk]
    alerts_sync(cluster=cluster, findings=[finding(severity="warning")], now=T0 + 10)
    assert only_alert(cluster).severity == "critical"


def test_the_most_severe_of_duplicate_findings_counts(cluster):
    alerts_sync(
        cluster=cluster, findings=[finding(), finding(severity="critical"), finding()], now=T0
    )
    assert only_alert(cluster).severity == "critical"


@override_settings(ALERT_HOLD_DOWN_S=60)
def test_it_resolves_once_the_condition_has_been_clear_for_the_hold_down(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    assert alerts_sync(cluster=cluster, findings=[], now=T0 + 30).resolved == []
    assert only_alert(cluster).state == "firing"
    result = alerts_sync(cluster=cluster, findings=[], now=T0 + 61)
    alert = only_alert(cluster)
    assert result.resolved == [alert.pk]
    assert alert.state == "resolved" and alert.resolved_at.timestamp() == T0 + 61


@override_settings(ALERT_HOLD_DOWN_S=60)
def test_a_finding_within_the_hold_down_keeps_the_alert_open(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    alerts_sync(cluster=cluster, findings=[], now=T0 + 50)
    alerts_sync(cluster=cluster, findings=[finding()], now=T0 + 55)
    alerts_sync(cluster=cluster, findings=[], now=T0 + 100)
    assert only_alert(cluster).state == "firing"  # clear only since T0 + 55


def test_a_heartbeat_alert_resolves_as_soon_as_the_node_returns(cluster):
    beat = finding(kind="heartbeat", subject="node:node-02", severity="critical", run=None)
    alerts_sync(cluster=cluster, findings=[beat], now=T0)
    alerts_sync(cluster=cluster, findings=[], now=T0 + 1)
    assert only_alert(cluster).state == "resolved"


@override_settings(ALERT_HOLD_DOWN_S=0)
def test_a_condition_that_returns_after_resolving_opens_a_new_alert(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    alerts_sync(cluster=cluster, findings=[], now=T0 + 1)
    alerts_sync(cluster=cluster, findings=[finding()], now=T0 + 2)
    states = list(Alert.objects.filter(cluster=cluster).order_by("id").values_list("state"))
    assert states == [("resolved",), ("firing",)]


def test_findings_of_other_kinds_or_subjects_are_separate_alerts(cluster):
    alerts_sync(
        cluster=cluster,
        findings=[finding(), finding(subject="run:run-1/rank:4"), finding(kind="sdc")],
        now=T0,
    )
    assert Alert.objects.filter(cluster=cluster, state="firing").count() == 3


def test_unknown_runs_and_nodes_leave_the_links_empty(cluster):
    alerts_sync(cluster=cluster, findings=[finding(run="nope", node="gone")], now=T0)
    alert = only_alert(cluster)
    assert alert.run is None and alert.node is None


def test_evidence_is_stored_as_plain_json(cluster):
    evidence = {"ranks": (1, 2), "ratio": float("nan"), "nested": {"x": float("inf")}}
    alerts_sync(cluster=cluster, findings=[finding(evidence=evidence)], now=T0)
    assert only_alert(cluster).evidence == {"ranks": [1, 2], "ratio": None, "nested": {"x": None}}


def test_the_database_refuses_a_second_open_alert_for_one_subject(cluster):
    alerts_sync(cluster=cluster, findings=[finding()], now=T0)
    alert = only_alert(cluster)
    alert.pk = None
    with pytest.raises(IntegrityError):
        alert.save()


@pytest.mark.django_db(transaction=True)
def test_concurrent_syncs_open_exactly_one_alert():
    cluster = Cluster.objects.create(name="concurrent")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def sync() -> None:
        try:
            barrier.wait(timeout=10)
            alerts_sync(cluster=cluster, findings=[finding()], now=time.time())
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert Alert.objects.filter(cluster=cluster).count() == 1


def test_a_pass_costs_the_same_statements_for_3_or_60_open_alerts(cluster):
    """Open alerts seen again, and those resolving, are one statement each, however many:
    a pass over a cluster with every GPU amber used to issue one UPDATE per alert."""

    def many(count: int, **fields) -> list:
        return [
            finding(subject=f"run:run-1/rank:{rank}", rank=rank, **fields) for rank in range(count)
        ]

    counts = {}
    for count in (3, 60):
        Alert.objects.filter(cluster=cluster).delete()
        alerts_sync(cluster=cluster, findings=many(count), now=T0)
        with CaptureQueriesContext(connection) as seen:
            result = alerts_sync(cluster=cluster, findings=many(count, summary="again"), now=T0 + 5)
        assert len(result.updated) == count
        with CaptureQueriesContext(connection) as gone:
            result = alerts_sync(cluster=cluster, findings=[], now=T0 + 5 + 3600)
        assert len(result.resolved) == count
        counts[count] = (len(seen), len(gone))
    assert counts[3] == counts[60]
    assert set(Alert.objects.filter(cluster=cluster).values_list("summary", "state")) == {
        ("again", "resolved")
    }
