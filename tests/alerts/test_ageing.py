"""Amber that ages: a warning left unacknowledged past its cluster's warning_age_min
escalates once (notified again as `ageing`, counted on the overview); acknowledging it or
silencing it for a stated time with a reason (audited) stops that; the limit is per cluster."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from apps.access.services import role_grant
from apps.alerts.models import Alert, ClusterDetectorConfig, WebhookDelivery, WebhookEndpoint
from apps.alerts.services import alert_acknowledge, alerts_age, alerts_sync
from apps.audit.models import AuditEntry
from apps.clusters.models import Cluster
from opsboard.queues import CELERY_PERIODIC_QUEUE, CELERY_TASK_ROUTES
from opsboard.tunables import beat_schedule
from tests.alerts.conftest import finding, make_operator, xid_finding

NOW = time.time()


def opened(cluster: Cluster, minutes_ago: float, **fields) -> Alert:
    """A finding first seen `minutes_ago`, still seen now: an open alert of that age."""
    found = finding(**fields)
    alerts_sync(cluster=cluster, findings=[found], now=NOW - 60 * minutes_ago)
    alerts_sync(cluster=cluster, findings=[found], now=NOW)
    return Alert.objects.get(cluster=cluster, subject=found.subject)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def client_of(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_warning_left_past_the_limit_ages_once_and_notifies(cluster):
    hook = WebhookEndpoint.objects.create(cluster=cluster, url="http://127.0.0.1:9/hook")
    old = opened(cluster, 31)
    young = opened(cluster, 10, subject="run:run-1/rank:4", rank=4)
    critical = opened(cluster, 60, **{**xid_finding().__dict__})
    assert alerts_age(now=at(NOW)) == 1
    old.refresh_from_db()
    assert old.aged_at == at(NOW)
    assert Alert.objects.get(pk=young.pk).aged_at is None  # 10 min: not yet
    assert Alert.objects.get(pk=critical.pk).aged_at is None  # red is paged already
    [delivery] = WebhookDelivery.objects.filter(endpoint=hook, event="ageing")
    assert delivery.alert_id == old.pk
    assert delivery.payload["alert"]["aged_at"] == pytest.approx(NOW)
    # once: the next tick finds nothing more to age
    assert alerts_age(now=at(NOW + 60)) == 0
    assert WebhookDelivery.objects.filter(event="ageing").count() == 1


def test_acknowledging_or_silencing_stops_it(cluster):
    acked = opened(cluster, 45)
    alert_acknowledge(alert=acked, user=make_operator("olga"), note="on it")
    silenced = opened(cluster, 45, subject="run:run-1/rank:5", rank=5)
    Alert.objects.filter(pk=silenced.pk).update(silenced_until=at(NOW + 3600))
    assert alerts_age(now=at(NOW)) == 0
    # still unacknowledged when its silence ends: it ages then
    assert alerts_age(now=at(NOW + 3601)) == 1
    assert Alert.objects.get(pk=silenced.pk).aged_at == at(NOW + 3601)


def test_the_limit_is_the_clusters_own(cluster):
    alert = opened(cluster, 10)
    config = ClusterDetectorConfig.objects.create(cluster=cluster, warning_age_min=0)
    assert alerts_age(now=at(NOW + 86_400)) == 0  # 0: never
    config.warning_age_min = 5
    config.save()
    assert alerts_age(now=at(NOW)) == 1 and Alert.objects.get(pk=alert.pk).aged_at


@pytest.mark.parametrize("role", ["admin", "operator"])
def test_a_clusters_admin_changes_its_policy_in_the_admin_audited(cluster, role):
    user = get_user_model().objects.create_user(f"ada-{role}", password="pw-12345-x")
    user.is_staff = True
    user.save()
    user.user_permissions.add(*Permission.objects.filter(codename__endswith="detectorconfig"))
    role_grant(user=user, cluster=cluster, role=role)
    config = ClusterDetectorConfig.objects.create(cluster=cluster)
    response = client_of(user).post(
        f"/admin/alerts/clusterdetectorconfig/{config.pk}/change/",
        {"cluster": cluster.pk, "warning_age_min": 45, "overrides": "{}"},
    )
    config.refresh_from_db()
    changed = AuditEntry.objects.filter(action="admin.change", actor_name=user.username)
    if role == "admin":  # the cluster's own admins set it, and the audit log says so
        assert response.status_code == 302 and config.warning_age_min == 45
        assert changed.get().cluster_id == cluster.pk
    else:  # an operator acts on alerts, not on the cluster's policy
        assert response.status_code == 403 and config.warning_age_min is None
        assert not changed.exists()


def test_beat_runs_it_on_the_periodic_queue():
    assert beat_schedule["alerts-age"]["task"] == "alerts.age"
    assert CELERY_TASK_ROUTES["alerts.age"] == {"queue": CELERY_PERIODIC_QUEUE}


def test_an_operator_silences_with_a_reason_and_a_viewer_may_not(cluster):
    alert = opened(cluster, 5)
    operator, viewer = make_operator("olga"), make_operator("vik", may_acknowledge=False)
    url = f"/api/v1/alerts/{alert.pk}/silence"
    as_viewer = client_of(viewer).post(url, {"minutes": 60, "reason": "x"}, "application/json")
    assert as_viewer.status_code == 403
    client = client_of(operator)
    for bad, loc in (
        ({"minutes": 0, "reason": "x"}, "minutes"),
        ({"minutes": 5, "reason": " "}, "reason"),
    ):
        answer = client.post(url, bad, content_type="application/json")
        assert answer.status_code == 400 and answer.json()["errors"][0]["loc"] == loc
    answer = client.post(url, {"minutes": 60, "reason": "rack fans swapped at 14:00"},
                         content_type="application/json")  # fmt: skip
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["silence_reason"] == "rack fans swapped at 14:00"
    assert body["silenced_until"] == pytest.approx(time.time() + 3600, abs=30)
    outcomes = sorted(
        AuditEntry.objects.filter(action="alert.silence").values_list("outcome", flat=True)
    )
    assert outcomes == ["denied", "succeeded"]
    # only a firing alert is silenced
    alert_acknowledge(alert=alert, user=operator, note="")
    again = client.post(url, {"minutes": 5, "reason": "x"}, content_type="application/json")
    assert again.status_code == 409 and again.json()["errors"][0]["loc"] == "state"
    missing = client.post("/api/v1/alerts/999999/silence", {"minutes": 5, "reason": "x"},
                          content_type="application/json")  # fmt: skip
    assert missing.status_code == 404


def test_the_overview_counts_the_amber_and_the_alert_page_shows_its_age(cluster):
    alert = opened(cluster, 47)
    opened(cluster, 3, subject="run:run-1/rank:6", rank=6)
    alerts_age(now=at(NOW))
    operator = client_of(make_operator("olga"))
    overview = operator.get("/clusters/alpha/").content.decode()
    assert '<span id="count-unacknowledged">2</span>' in overview
    # NOW is the module's import time: the page counts from its own clock
    oldest = int((time.time() - (NOW - 47 * 60)) // 60)
    assert f"the oldest {oldest} min; 1 ageing" in overview
    # the API's alerts of the same moment say the same: 2 firing warnings, 1 aged
    api = operator.get("/api/v1/alerts", {"state": "firing"}).json()["alerts"]
    amber = [a for a in api if a["severity"] == "warning"]
    assert len(amber) == 2 and sum(a["aged_at"] is not None for a in amber) == 1
    assert int((time.time() - min(a["opened_at"] for a in amber)) // 60) == oldest
    page = operator.get(f"/alerts/{alert.pk}/")
    assert 'id="alert-ageing"' in page.content.decode()
    posted = operator.post(f"/alerts/{alert.pk}/silence", {"minutes": "30", "reason": "known"})
    assert posted.status_code == 302
    page = operator.get(f"/alerts/{alert.pk}/").content.decode()
    assert 'id="alert-silenced"' in page and "silenced by olga" in page.replace("</li>", "")
    assert Alert.objects.get(pk=alert.pk).silenced_until > at(NOW) + timedelta(minutes=29)
