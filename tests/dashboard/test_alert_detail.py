"""The alert page: summary, how long it fired, timeline, the evidence drawn by kind, links to
the run / node / rank at the alert's time, acknowledgement from the page, and its scope (an
alert of a cluster one holds no role in is a 404). The alerts list's kind filter."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.alerts.choices import AlertKind
from apps.alerts.models import Alert
from apps.alerts.services import alert_acknowledge, alerts_sync
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store
from detectors.types import Finding
from tests.dashboard.conftest import PASSWORD, RUN, gpu_samples, operator, step_reports
from tests.dashboard.test_pages import json_script

pytestmark = pytest.mark.django_db

SLOW_RANK = 5
CORRUPT_RANK = 2
STEPS = 30


def training_store(name: str, now: float) -> Cluster:
    """STEPS seconds of RUN on 2 nodes × 4 GPUs: rank SLOW_RANK computes 50% longer, and
    rank CORRUPT_RANK's parameter checksum differs from its replicas' at every check."""
    cluster = Cluster.objects.create(name=name)
    batches = []
    for index in range(2):
        ranks = range(index * 4, index * 4 + 4)
        for step in range(STEPS):
            ts = now - STEPS + step + 1
            steps = step_reports(ts, step, ranks, slow_rank=SLOW_RANK)
            for report in steps:
                if report["rank"] == CORRUPT_RANK and "param_checksum" in report:
                    report["param_checksum"] = f"bad{step}"
            batches.append({
                "batch_id": f"{name}-{index}-{step}", "node": f"node-{index:02d}",
                "node_info": {"gpus": 4}, "run": RUN, "samples": gpu_samples(ts, 4),
                "steps": steps, "events": [],
            })  # fmt: skip
    received = datetime.fromtimestamp(now, UTC)
    batches_store(batches=[ClaimedBatch.of(cluster.id, received, body) for body in batches])
    return cluster


def raise_alerts(cluster: Cluster, now: float) -> dict[str, Alert]:
    findings = [
        Finding(kind="straggler", subject=f"run:{RUN}/rank:{SLOW_RANK}", severity="warning",
                summary=f"rank {SLOW_RANK} on node-01 computes 50% slower than its peers",
                run=RUN, node="node-01", rank=SLOW_RANK,
                evidence={"rank": SLOW_RANK, "slowdown": 0.5, "steps": 20, "slow_steps": 18}),
        Finding(kind="sdc", subject=f"run:{RUN}/rank:{CORRUPT_RANK}", severity="critical",
                summary=f"rank {CORRUPT_RANK} disagrees with its replicas", run=RUN,
                node="node-00", rank=CORRUPT_RANK,
                evidence={"rank": CORRUPT_RANK, "shard": None, "steps": [10, 15, 20],
                          "peers": [], "disagreed": {"param_checksum": 3}}),
        Finding(kind="xid", subject="node:node-00/gpu:1", severity="critical",
                summary="XID 79 on node-00 GPU 1", node="node-00", gpu=1,
                evidence={"code": 79, "message": "fell off the bus", "recovery": None}),
    ]  # fmt: skip
    alerts_sync(cluster=cluster, findings=findings, now=now - 20 * 60)
    return {alert.kind: alert for alert in Alert.objects.filter(cluster=cluster)}


@pytest.fixture
def alerts():
    now = time.time()
    return raise_alerts(training_store("alpha", now), now)


def page(client: Client, alert: Alert) -> str:
    response = client.get(f"/alerts/{alert.id}/")
    assert response.status_code == 200
    return response.content.decode()


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_it_shows_the_summary_and_how_long_the_alert_has_fired(alerts, client_in):
    html = page(client_in, alerts["straggler"])
    assert f"rank {SLOW_RANK} on node-01 computes 50% slower" in html
    duration = re.search(r'id="alert-duration"[^>]*>([^<]+)<', html).group(1)
    assert duration == "firing for 20 min"
    # the detector's window is a window, said apart from how long the alert fired
    assert "over the last 20 steps" in text(html)


def test_the_straggler_evidence_is_the_slow_rank_against_its_peers(alerts, client_in):
    figure = json_script(page(client_in, alerts["straggler"]), "figure-evidence")
    slow, peers = figure["data"]
    assert slow["name"] == f"rank {SLOW_RANK}" and peers["name"] == "median of its peers"
    mine = [y for y in slow["y"] if y is not None]
    typical = [y for y in peers["y"] if y is not None]
    assert mine and typical
    # compute 0.9 s + data 0.03 + h2d 0.01 against 0.6 + 0.04: the slow rank stands out
    assert min(mine) > max(typical) * 1.3


def test_an_sdc_alert_shows_the_disagreeing_checksums_by_rank(alerts, client_in):
    html = page(client_in, alerts["sdc"])
    assert 'id="figure-evidence"' not in html
    table = re.search(r'<table class="checks" id="evidence-checksums">.*?</table>', html, re.S)
    rows = re.findall(r'<tr data-rank="(\d+)">(.*?)</tr>', table.group(0), re.S)
    assert [rank for rank, _ in rows] == [str(CORRUPT_RANK)] * 3
    assert all('<td class="differs">bad' in row for _, row in rows)
    assert table.group(0).count('class="majority"') == 3
    assert "majority of the other 7 ranks" in table.group(0) and ">p15<" in table.group(0)


def test_any_other_kind_shows_its_evidence_as_a_table(alerts, client_in):
    html = page(client_in, alerts["xid"])
    assert 'id="figure-evidence"' not in html
    rows = dict(re.findall(r'<tr><th scope="row">([^<]+)</th><td>([^<]*)</td></tr>', html))
    assert rows == {"code": "79", "message": "fell off the bus", "recovery": "–"}


def test_the_timeline_names_who_acknowledged_with_the_note(alerts, client_in):
    alert = alerts["xid"]
    acker = operator("night-shift")
    alert_acknowledge(alert=alert, user=acker, note="draining node-00")
    Alert.objects.filter(pk=alert.pk).update(
        state="resolved", resolved_at=datetime.fromtimestamp(time.time() + 1, UTC)
    )
    html = page(client_in, alert)
    events = re.findall(r'<li data-event="([^"]+)"', html)
    assert events == ["opened", "acknowledged", "resolved"]
    assert "acknowledged by night-shift: " in text(html) and "draining node-00" in html
    assert re.search(r'id="alert-duration"[^>]*>resolved after 20 min<', html)
    assert 'id="alert-ack"' not in html  # nothing left to acknowledge


def test_it_links_to_the_run_the_rank_and_the_node_at_the_alerts_time(alerts, client_in):
    alert = alerts["straggler"]
    links = dict(
        (label, href)
        for href, label in re.findall(
            r'<a href="([^"]+)">([^<]+)</a>',
            re.search(r'id="alert-links">(.*?)</p>', page(client_in, alert), re.S).group(1),
        )
    )
    cluster = alert.cluster.name
    run = urlsplit(links[f"run {RUN}"].replace("&amp;", "&"))
    assert run.path == f"/clusters/{cluster}/runs/{RUN}/"
    span = parse_qs(run.query)
    opened = alert.opened_at.timestamp()
    assert float(span["from"][0]) < opened < float(span["to"][0])
    rank = urlsplit(links[f"rank {SLOW_RANK}"].replace("&amp;", "&"))
    assert rank.path == f"/clusters/{cluster}/runs/{RUN}/ranks/{SLOW_RANK}/"
    node = urlsplit(links["node node-01"].replace("&amp;", "&"))
    assert node.path == f"/clusters/{cluster}/nodes/node-01/" and "from" in parse_qs(node.query)
    xid_links = re.search(r'id="alert-links">(.*?)</p>', page(client_in, alerts["xid"]), re.S)
    assert "gpu=1" in xid_links.group(1)


def test_it_acknowledges_from_the_page(alerts):
    user = operator("ack")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    alert = alerts["straggler"]
    html = page(client, alert)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    form = re.search(r'<form method="post" action="([^"]+)"[^>]*id="alert-ack"', html)
    response = client.post(
        form.group(1),
        {"note": "looking", "next": f"/alerts/{alert.id}/", "csrfmiddlewaretoken": token},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == f"/alerts/{alert.id}/"
    alert.refresh_from_db()
    assert alert.state == "acknowledged" and alert.ack_note == "looking"
    assert "acknowledged by ack" in text(response.content.decode())


def test_a_viewer_sees_the_alert_but_no_acknowledge_form(alerts):
    client = Client()
    client.force_login(operator("viewer", may_acknowledge=False))
    html = page(client, alerts["straggler"])
    assert "computes 50% slower" in html and 'id="alert-ack"' not in html


def test_an_alert_of_a_cluster_without_a_role_is_not_found(alerts):
    other = Cluster.objects.create(name="beta")
    user = get_user_model().objects.create_user("outsider", password=PASSWORD)
    ClusterRole.objects.create(user=user, cluster=other, role="operator")
    client = Client()
    client.force_login(user)
    assert client.get(f"/alerts/{alerts['straggler'].id}/").status_code == 404
    assert client.get("/alerts/999999/").status_code == 404


def test_the_alerts_list_links_each_alert_and_says_how_long_it_fired(alerts, client_in):
    html = client_in.get("/alerts/").content.decode()
    for alert in alerts.values():
        assert f'href="/alerts/{alert.id}/"' in html
    assert re.search(r'<div class="age">firing for 20\xa0minutes</div>', html)


def test_the_kind_filter_lists_every_kind_before_any_alert(client_in):
    html = client_in.get("/alerts/").content.decode()
    select = re.search(r'<select name="kind">(.*?)</select>', html, re.S).group(1)
    assert re.findall(r"<option>(\w+)</option>", select) == sorted(AlertKind.values)
