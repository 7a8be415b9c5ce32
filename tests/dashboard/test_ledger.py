"""The maintenance ledger: per node and per GPU over 7 / 30 / 90 days, the same on the node
page, the fleet page, its CSV and JSON exports and the API, scoped to the user's clusters."""

import csv
import io
import time
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.alerts.models import Alert
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db
NOW = time.time()
MIN, DAY = 60.0, 86_400.0


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC)


def alert(cluster, node, kind, *, gpu=None, run=None, severity="warning", opened, resolved=None):
    return Alert.objects.create(
        cluster=cluster, node=node, run=run, gpu=gpu, kind=kind, severity=severity,
        subject=f"node:{node.name}/gpu:{gpu}/{kind}/{opened}", summary=kind,
        state="resolved" if resolved is not None else "firing",
        opened_at=at(opened), last_seen_at=at(resolved if resolved is not None else 0),
        resolved_at=at(resolved) if resolved is not None else None,
    )  # fmt: skip


def event(cluster, node, kind, *, ago, run=None, gpu=None, **data):
    RunEvent.objects.create(
        cluster=cluster, node=node, run=run, ts=at(ago), kind=kind, gpu=gpu, data=data
    )


@pytest.fixture
def fleet():
    """node-01 GPU 3 is the costly one; node-02 has one warning; cluster `other` is not the
    viewer's."""
    cluster = Cluster.objects.create(name="alpha")
    bad, fine = (Node.objects.create(cluster=cluster, name=n) for n in ("node-01", "node-02"))
    run = Run.objects.create(cluster=cluster, name="llama")
    alert(cluster, bad, "thermal", gpu=3, opened=30 * MIN, resolved=10 * MIN)  # 20 min
    alert(cluster, bad, "power", gpu=3, opened=8 * DAY, resolved=8 * DAY - 5 * MIN)  # 30d only
    alert(cluster, bad, "straggler", gpu=3, run=run, opened=2 * DAY, resolved=DAY)
    # a critical XID alert open when the job restarted: the restart is node-01's
    alert(cluster, bad, "xid", gpu=3, run=run, severity="critical", opened=15 * MIN)
    event(cluster, bad, "restart", ago=10 * MIN, run=run)
    # silent corruption, resolved 2 min before a restart: a rollback
    alert(
        cluster,
        bad,
        "sdc",
        gpu=3,
        run=run,
        severity="critical",
        opened=3 * DAY,
        resolved=3 * DAY - 60,
    )
    event(cluster, bad, "restart", ago=3 * DAY - 180, run=run)
    # a restart with no critical alert near it is nobody's
    event(cluster, bad, "restart", ago=5 * DAY, run=run)
    for ago, code in ((MIN, 79), (2 * MIN, 79), (3 * MIN, 48), (40 * DAY, 79)):
        event(cluster, bad, "xid", ago=ago, gpu=3, code=code)
    event(cluster, bad, "ecc", ago=MIN, gpu=3, count=5)
    event(cluster, bad, "ecc", ago=2 * MIN, gpu=3, count=3)
    alert(cluster, fine, "oom_risk", gpu=0, opened=60 * MIN, resolved=59 * MIN)
    other = Cluster.objects.create(name="other")
    hidden = Node.objects.create(cluster=other, name="node-09")
    alert(other, hidden, "xid", gpu=0, severity="critical", opened=MIN)
    return cluster


@pytest.fixture
def viewer(fleet) -> Client:
    user = get_user_model().objects.create_user("viewer")
    ClusterRole.objects.create(user=user, cluster=fleet, role="viewer")
    client = Client()
    client.force_login(user)
    return client


def test_it_counts_a_nodes_debt_per_gpu_and_window(viewer):
    week = viewer.get("/api/v1/nodes/node-01/ledger", {"days": 7}).json()
    assert week["findings"] == {"sdc": 1, "straggler": 1, "thermal": 1, "xid": 1}
    assert week["critical"] == 2
    assert week["xid"] == [
        {"code": 48, "count": 1,
         "meaning": "double-bit ECC error (DBE): uncorrectable GPU memory error"},
        {"code": 79, "count": 2, "meaning": "GPU has fallen off the bus"},
    ]  # fmt: skip
    assert week["ecc_errors"] == 8
    assert week["thermal_minutes"] == pytest.approx(20.0, abs=0.1)
    assert week["power_minutes"] == 0
    assert (week["straggler"], week["restarts"], week["rollbacks"]) == (1, 2, 1)
    assert [g["gpu"] for g in week["gpus"]] == [3]
    assert week["gpus"][0]["restarts"] == 2 and week["gpus"][0]["ecc_errors"] == 8
    month = viewer.get("/api/v1/nodes/node-01/ledger", {"days": 30}).json()
    assert month["power_minutes"] == pytest.approx(5.0, abs=0.1)
    assert month["xid"][1]["count"] == 2  # the XID 40 days ago counts in 90 days only
    quarter = viewer.get("/api/v1/nodes/node-01/ledger", {"days": 90}).json()
    assert quarter["xid"][1]["count"] == 3


def test_the_fleet_ranks_the_costliest_first_and_every_surface_agrees(viewer):
    api = viewer.get("/api/v1/ledger", {"days": 7}).json()
    assert [n["node"] for n in api["nodes"]] == ["node-01", "node-02"]
    assert api["gpus"][0] | {} == {
        **api["nodes"][0]["gpus"][0],
        "node": "node-01",
        "cluster": "alpha",
    }
    assert api["nodes"][0]["trend"] == 3  # 4 findings, against the power alert 8 days ago
    exported = viewer.get("/fleet/ledger.json", {"days": 7}).json()
    assert exported == api
    rows = list(csv.DictReader(io.StringIO(viewer.get("/fleet/ledger.csv", {"days": 7}).text)))
    first = rows[0]
    assert (first["node"], first["gpu"], first["restarts"], first["ecc_errors"]) == (
        "node-01",
        "",
        "2",
        "8",
    )
    assert (
        first["xid"] == "48x1 79x2"
        and float(first["thermal_minutes"]) == api["nodes"][0]["thermal_minutes"]
    )
    page = viewer.get("/fleet/", {"days": 7}).content.decode()
    assert page.index('data-node="node-01"') < page.index('data-node="node-02"')
    assert '<td data-col="restarts">2</td>' in page and ">79</abbr>×2" in page
    node_page = viewer.get("/clusters/alpha/nodes/node-01/").content.decode()
    assert '<td data-col="ecc">8</td>' in node_page and '<td data-col="trend">' not in node_page


def test_it_shows_only_the_clusters_the_user_holds_a_role_in(viewer):
    assert "node-09" not in viewer.get("/api/v1/ledger", {"days": 90}).text
    assert "node-09" not in viewer.get("/fleet/", {"days": 90}).text
    assert "node-09" not in viewer.get("/fleet/ledger.csv", {"days": 90}).text
    missing = viewer.get("/api/v1/nodes/node-09/ledger")
    assert missing.status_code == 404 and missing.json()["errors"][0]["loc"] == "node"


def test_it_refuses_a_window_it_does_not_keep(viewer):
    api = viewer.get("/api/v1/ledger", {"days": 5})
    assert api.status_code == 400
    assert api.json()["errors"] == [{"loc": "days", "msg": "one of 7, 30, 90"}]
    page = viewer.get("/fleet/", {"days": 5})
    assert page.status_code == 400 and page.json() == api.json()


def test_it_names_a_repeat_offender_and_a_node_in_maintenance(viewer, fleet):
    """Back from maintenance and failing again within LEDGER_REPEAT_DAYS: a repeat offender,
    ranked first; a node only in maintenance is on the ledger too."""
    from apps.commands.models import MaintenanceVisit

    fine = Node.objects.get(cluster=fleet, name="node-02")
    MaintenanceVisit.objects.create(
        cluster=fleet, node=fine, sent_at=at(5 * DAY), reason="fans",
        returned_at=at(3 * DAY), return_note="fans replaced",
    )  # fmt: skip
    alert(fleet, fine, "thermal", gpu=0, severity="critical", opened=2 * DAY, resolved=DAY)
    quiet = Node.objects.create(cluster=fleet, name="node-03")
    MaintenanceVisit.objects.create(cluster=fleet, node=quiet, sent_at=at(40 * DAY), reason="PSU")
    api = viewer.get("/api/v1/ledger", {"days": 7}).json()
    assert [n["node"] for n in api["nodes"]] == ["node-02", "node-01", "node-03"]
    repeat = api["nodes"][0]
    assert (repeat["maintenance"], repeat["repeat"], repeat["in_maintenance"]) == (1, 1, False)
    assert (api["nodes"][2]["maintenance"], api["nodes"][2]["in_maintenance"]) == (0, True)
    node = viewer.get("/api/v1/nodes/node-02/ledger").json()
    assert node["repeat"] == 1 and "repeat" not in node["gpus"][0]
    page = viewer.get("/fleet/").content.decode()
    assert '<td data-col="repeat" class="repeat">1</td>' in page
    assert "0 (there now)" in page
    # a critical finding from before its return makes no repeat offender
    Alert.objects.filter(node=fine, kind="thermal").update(opened_at=at(4 * DAY))
    assert viewer.get("/api/v1/nodes/node-02/ledger").json()["repeat"] == 0


def test_gpu_hours_lost_are_its_restarts_lost_work_and_its_incidents(viewer, fleet):
    """The badput split by culprit: the work its restarts lost since the last durable
    checkpoint, and its root-caused incidents' GPU-hours, as their own API gives them."""
    from apps.alerts.models import Incident

    run = Run.objects.get(cluster=fleet, name="llama")
    Run.objects.filter(pk=run.pk).update(world_size=8)
    bad = Node.objects.get(cluster=fleet, name="node-01")
    # the restart 10 min ago lost the 20 min since this save, on 8 GPUs
    event(fleet, bad, "checkpoint", ago=30 * MIN, run=run, tier="durable", state="completed")
    incident = Incident.objects.create(
        cluster=fleet, state="resolved", root_kind="thermal", root_node="node-01", root_gpu=3,
        opened_at=at(2 * DAY), resolved_at=at(DAY),
    )  # fmt: skip
    # its straggler cost 4 GPU-hours an hour for the day it was seen
    Alert.objects.filter(kind="straggler").update(
        incident=incident, evidence={"gpu_hours_lost_per_hour": 4.0}
    )
    incident_hours = viewer.get(f"/api/v1/incidents/{incident.pk}").json()["gpu_hours_lost"]
    assert incident_hours == pytest.approx(96.0, abs=0.01)
    week = viewer.get("/api/v1/nodes/node-01/ledger").json()
    assert week["gpu_hours_lost"] == pytest.approx(8 * 20 / 60 + incident_hours, abs=0.01)
    assert week["gpus"][0]["gpu_hours_lost"] == week["gpu_hours_lost"]  # all of it on GPU 3
    fleet_api = viewer.get("/api/v1/ledger").json()
    assert fleet_api["nodes"][0]["gpu_hours_lost"] == week["gpu_hours_lost"]
    rows = list(csv.DictReader(io.StringIO(viewer.get("/fleet/ledger.csv").text)))
    assert float(rows[0]["gpu_hours_lost"]) == week["gpu_hours_lost"]
    page = viewer.get("/clusters/alpha/nodes/node-01/").content.decode()
    assert f'<td data-col="gpu-hours">{week["gpu_hours_lost"]}</td>' in page
