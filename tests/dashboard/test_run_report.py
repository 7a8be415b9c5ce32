"""A run's reliability report: interruptions by root cause with the work each lost since its
last durable checkpoint, cadence against Young/Daly, the costliest nodes; the page, its JSON
and Markdown exports and the API say the same."""

import math
import time
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.access.models import ClusterRole
from apps.alerts.models import Alert
from apps.alerts.services.incidents import incidents_fold
from apps.clusters.models import Cluster, Node
from apps.runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db
NOW = time.time()
START = NOW - 4 * 3600


def at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@pytest.fixture
def viewer():
    cluster = Cluster.objects.create(name="alpha")
    node1, node2 = (Node.objects.create(cluster=cluster, name=n) for n in ("node-01", "node-02"))
    run = Run.objects.create(cluster=cluster, name="llama", world_size=8, last_step=900)
    Run.objects.filter(pk=run.pk).update(created_at=at(START), last_step_at=at(NOW))

    def event(kind, ts, node=node1, **data):
        RunEvent.objects.create(
            cluster=cluster, node=node, run=run, ts=at(ts), kind=kind, data=data,
            step=data.get("step"),
        )  # fmt: skip

    # a durable checkpoint every 1,200 s, each after a 30 s blocking local save
    for n, ts in enumerate(range(int(START) + 1200, int(NOW), 1200)):
        event("checkpoint", ts - 30, tier="local", state="started", step=n * 100)
        event("checkpoint", ts, tier="local", state="completed", step=n * 100)
        event("checkpoint", ts + 1, tier="durable", state="completed", step=n * 100)
    # XID 79 on node-02, open when the job restarted 500 s after the checkpoint at +2,400 s,
    # resolved long before the second restart
    Alert.objects.create(
        cluster=cluster, node=node2, run=run, gpu=5, kind="xid", severity="critical",
        subject="node:node-02/gpu:5", summary="GPU 5 of node-02 fell off the bus (XID 79)",
        evidence={"code": 79}, state="resolved", opened_at=at(START + 2880),
        last_seen_at=at(START + 2990), resolved_at=at(START + 3000),
    )  # fmt: skip
    event("restart", START + 2901)
    event("restart", START + 6000)  # no critical alert near it: unattributed
    # after both restarts: GPU 2 of node-01 runs hot and its rank (2) straggles, every rank
    # waiting for it (8 GPU-hours an hour) for the last 30 minutes: one incident
    hot = dict(cluster=cluster, node=node1, run=run, gpu=2, severity="warning", state="firing")
    Alert.objects.create(
        **hot, kind="thermal", subject="node:node-01/gpu:2", summary="GPU 2 of node-01 at 91 °C",
        opened_at=at(NOW - 1860), last_seen_at=at(NOW),
    )  # fmt: skip
    Alert.objects.create(
        **hot, kind="straggler", rank=2, subject="run:llama/rank:2", summary="rank 2 is slow",
        evidence={"gpu_hours_lost_per_hour": 8.0}, opened_at=at(NOW - 1800), last_seen_at=at(NOW),
    )  # fmt: skip
    incidents_fold(cluster=cluster, at=at(NOW))
    other = Cluster.objects.create(name="other")
    Run.objects.create(cluster=other, name="hidden")
    user = get_user_model().objects.create_user("viewer")
    ClusterRole.objects.create(user=user, cluster=cluster, role="viewer")
    client = Client()
    client.force_login(user)
    return client


def test_it_lays_each_interruption_at_its_cause_with_the_work_it_lost(viewer):
    report = viewer.get("/api/v1/runs/llama/report").json()
    first, second = report["interruptions"]
    assert first["cause"]["node"] == "node-02" and first["cause"]["gpu"] == 5
    assert first["checkpoint"]["step"] == 100  # the durable save at +2,401 s
    assert first["lost_s"] == pytest.approx(500, abs=1)
    assert first["lost_gpu_hours"] == round(8 * first["lost_s"] / 3600, 4)  # 8 ranks' GPUs
    assert second["cause"] is None and second["lost_s"] == pytest.approx(6000 - 4801, abs=2)
    causes = {row["cause"]: row for row in report["by_cause"]}
    assert causes["xid 79: GPU has fallen off the bus"]["interruptions"] == 1
    assert causes["unattributed"]["share"] == 0.5
    assert report["nodes"] == [
        {"node": "node-02", "interruptions": 1, "lost_gpu_hours": first["lost_gpu_hours"]}
    ]
    cadence = report["checkpoints"]
    assert cadence["durable_saves"] == 11 and cadence["cadence_s"] == 1200
    assert cadence["save_cost_s"] == 30 and cadence["mtbf_s"] == pytest.approx(
        report["wall_s"] / 2, abs=0.01
    )
    optimal = math.sqrt(2 * 30 * cadence["mtbf_s"]) - 30  # Daly: √(2δM) − δ
    assert cadence["optimal_interval_s"] == pytest.approx(optimal, abs=1)
    assert cadence["advice"].startswith("checkpoint more often")
    # the heat and its straggler: one incident rooted at the GPU, costing what the API says
    (heat,) = report["incidents"]
    incident = viewer.get(f"/api/v1/incidents/{heat['ids'][0]}").json()
    assert incident["root_cause"] == {"kind": "thermal", "node": "node-01", "gpu": 2, "rank": None}
    assert len(incident["alerts"]) == 2 and incident["gpu_hours_lost"] == pytest.approx(4.0)
    assert heat == {
        "root_cause": "thermal", "incidents": 1, "open": 1,
        "gpu_hours_lost": incident["gpu_hours_lost"], "ids": [incident["id"]],
    }  # fmt: skip


def test_the_page_and_its_exports_say_what_the_api_says(viewer):
    # an ended run's report no longer moves with the clock: every surface reads the same
    Run.objects.filter(name="llama").update(state="finished")
    api = viewer.get("/api/v1/runs/llama/report").json()
    exported = viewer.get("/clusters/alpha/runs/llama/report.json").json()
    assert exported == {**api, "generated_at": exported["generated_at"]}
    page = viewer.get("/clusters/alpha/runs/llama/report/").content.decode()
    lost = api["interruptions"][0]["lost_gpu_hours"]
    assert f'<td data-col="lost">{lost}</td>' in page
    assert f'<span data-col="optimal">{api["checkpoints"]["optimal_interval_s"]}</span>' in page
    markdown = viewer.get("/clusters/alpha/runs/llama/report.md").content.decode()
    assert f"| xid 79: GPU has fallen off the bus | 1 | 50% | {lost:.2f} |" in markdown
    assert f"| node-02 | 1 | {lost:.2f} |" in markdown
    (heat,) = api["incidents"]
    assert '<tr data-root="thermal"><td>thermal</td><td data-col="incidents">1</td>' in page
    assert f'<td data-col="lost">{heat["gpu_hours_lost"]}</td>' in page
    assert f'href="/incidents/{heat["ids"][0]}/"' in page
    line = f"| thermal | 1 | 1 | {heat['gpu_hours_lost']:.2f} | #{heat['ids'][0]} |"
    assert line in markdown
    assert "report/" in viewer.get("/clusters/alpha/runs/llama/").content.decode()


def test_another_clusters_run_is_not_found(viewer):
    missing = viewer.get("/api/v1/runs/hidden/report")
    assert missing.status_code == 404 and missing.json()["errors"][0]["loc"] == "name"
    assert viewer.get("/clusters/other/runs/hidden/report/").status_code == 404
