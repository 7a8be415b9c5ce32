"""Alerts through a real Alertmanager (Debian's `prometheus-alertmanager`, 0.25 on bookworm):
Opsboard's `alertmanager` webhooks post to its /api/v2/alerts from the live stack's worker;
Alertmanager groups them by cluster into one notification to a receiver of this test's own,
sends the resolve notification, and a silence made in Alertmanager suppresses the page.

CI installs Alertmanager (.ci/run) and fails if it is missing; elsewhere the test is skipped
with the apt-get line that installs it."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from apps.alerts.models import Alert, ClusterDetectorConfig, WebhookDelivery, WebhookEndpoint
from apps.alerts.services import alertmanager_resend, alerts_sync
from apps.clusters.models import Cluster, Node
from launcher.procs import free_port, http_ok, wait_until
from tests.agent.conftest import Request
from tests.agent.conftest import loopback as loopback  # a fixture, used by name
from tests.agent.test_real_exporters import start, stop
from tests.alerts.conftest import finding, xid_finding
from tests.peers import peer_binaries

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.stack, pytest.mark.timeout(180)]

INSTALL = "apt-get install prometheus-alertmanager"
CONFIG = """
route:
  receiver: hook
  group_by: [cluster]
  group_wait: 3s
  group_interval: 2s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs: [{{url: "{receiver}/hook", send_resolved: true}}]
"""


@pytest.fixture
def alertmanager(loopback, tmp_path):
    """(Alertmanager's URL, the notifications its webhook receiver got)."""
    [binary] = peer_binaries(
        "prometheus-alertmanager", "alertmanager", install=INSTALL, any_of=True
    )
    loopback.routes["/hook"] = lambda request: (200, {}, b"")
    (tmp_path / "alertmanager.yml").write_text(CONFIG.format(receiver=loopback.url))
    port = free_port()
    process = start(
        [
            binary,
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: one Alertmanager, loopback only
        ],
        tmp_path / "alertmanager.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), 30, "Alertmanager to start")
        yield url, loopback.requests
    finally:
        stop(process)


def notifications(requests: list[Request], cluster: str) -> list[dict]:
    bodies = [json.loads(r.body) for r in requests if r.path == "/hook"]
    return [b for b in bodies if b["groupLabels"].get("cluster") == cluster]


def test_alertmanager_groups_by_cluster_resolves_and_silences(live_stack, live_db, alertmanager):
    am_url, requests = alertmanager
    paged = Cluster.objects.create(name=f"am-{uuid.uuid4().hex[:6]}")
    silenced = Cluster.objects.create(name=f"am-quiet-{uuid.uuid4().hex[:6]}")
    for cluster in (paged, silenced):
        # the live stack's beat would resolve these test-made alerts (no data behind them)
        ClusterDetectorConfig.objects.create(cluster=cluster, paused=True)
        for node in ("node-02", "node-05"):
            Node.objects.create(cluster=cluster, name=node)
        WebhookEndpoint.objects.create(
            cluster=cluster, url=f"{am_url}/api/v2/alerts", format="alertmanager"
        )
    # a silence made in Alertmanager for the second cluster, for the next hour
    now = datetime.now(UTC)
    silence = httpx.post(
        f"{am_url}/api/v2/silences",
        json={
            "matchers": [{"name": "cluster", "value": silenced.name, "isRegex": False}],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "test",
            "comment": "maintenance",
        },
        timeout=10,
    )
    assert silence.status_code == 200, silence.text

    opened = time.time() - 120  # long enough ago for the hold-down when it clears below
    alerts_sync(cluster=paged, findings=[xid_finding(), finding()], now=opened)
    alerts_sync(cluster=silenced, findings=[xid_finding()], now=opened)

    # Two alerts of one cluster, one group: its notification names both by their labels
    wait_until(
        lambda: any(len(n["alerts"]) == 2 for n in notifications(requests, paged.name)),
        30,
        "the page for the cluster, with both alerts",
    )
    pages = notifications(requests, paged.name)
    assert len({n["groupKey"] for n in pages}) == 1
    page = next(n for n in pages if len(n["alerts"]) == 2)
    assert page["status"] == "firing" and page["groupLabels"] == {"cluster": paged.name}
    labels = sorted((a["labels"]["alertname"], a["labels"].get("node")) for a in page["alerts"])
    assert labels == [("straggler", "node-02"), ("xid", "node-05")]
    xid = next(a for a in page["alerts"] if a["labels"]["alertname"] == "xid")
    assert xid["labels"]["gpu"] == "3" and xid["labels"]["severity"] == "critical"
    alert = Alert.objects.get(cluster=paged, kind="xid")
    assert xid["annotations"]["opsboard_url"].endswith(f"/alerts/{alert.pk}/")
    assert xid["annotations"]["summary"].startswith("XID 79")

    # The silenced cluster's alert reached Alertmanager, which holds it suppressed
    def quiet_state() -> str:
        alerts = httpx.get(
            f"{am_url}/api/v2/alerts", params={"filter": f'cluster="{silenced.name}"'}, timeout=10
        ).json()
        return alerts[0]["status"]["state"] if alerts else ""

    wait_until(lambda: quiet_state() == "suppressed", 30, "the silenced alert suppressed")
    # while firing, both are posted again (Alertmanager resolves what it stops hearing of)
    assert alertmanager_resend() == 3

    # The condition clears: the resolve notification follows
    alerts_sync(cluster=paged, findings=[], now=time.time())
    assert set(Alert.objects.filter(cluster=paged).values_list("state", flat=True)) == {"resolved"}
    wait_until(
        lambda: any(n["status"] == "resolved" for n in notifications(requests, paged.name)),
        30,
        "the resolve notification",
    )
    resolved = [n for n in notifications(requests, paged.name) if n["status"] == "resolved"][-1]
    assert {a["status"] for a in resolved["alerts"]} == {"resolved"}
    time.sleep(3)  # a page for the silenced cluster, if any, would have come by now
    assert notifications(requests, silenced.name) == []
    assert not WebhookDelivery.objects.filter(delivered_at__isnull=True).exists()
