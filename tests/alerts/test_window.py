"""cluster_window loads what the detectors need, in a bounded number of queries."""

import time
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from apps.alerts.models import Alert, ClusterDetectorConfig
from apps.alerts.selectors import cluster_window, detector_config
from apps.alerts.services import alerts_evaluate
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store
from apps.runs.models import Run
from apps.runs.selectors import run_goodput, run_summary

pytestmark = pytest.mark.django_db


def store(cluster: Cluster, body: dict, received: float) -> None:
    batches_store(
        batches=[
            ClaimedBatch.of(
                cluster_id=cluster.pk,
                received_at=datetime.fromtimestamp(received, UTC),
                body=body,
            )
        ]
    )


def step(rank: int, number: int, at: float, **extra) -> dict:
    return {"ts": at, "rank": rank, "step": number, "step_time": 1.0, "data_time": 0.05, **extra}


@pytest.fixture
def now() -> float:
    return time.time()


@pytest.fixture
def busy(now) -> Cluster:
    """Two nodes, a 4-rank run with 150 steps, telemetry every second, some events."""
    cluster = Cluster.objects.create(name="busy")
    for batch in range(10):  # a batch every 2 s from each node
        at = now - 20 + 2 * batch
        for node, ranks in (("node-01", (0, 1)), ("node-02", (2, 3))):
            body = {
                "batch_id": f"{node}/{batch}",
                "node": node,
                "samples": [
                    {"ts": at + i, "metric": metric, "gpu": 0, "value": 50.0 + i}
                    for i in range(2)
                    for metric in ("gpu.util", "gpu.temp_c")
                ]
                + [{"ts": at, "metric": "host.cpu_util", "value": 10.0}],
            }
            if batch == 9:
                body["run"] = "llama"
                body["steps"] = [
                    step(rank, number, now - 150 + number, canary={"norm": 1.0, "proj": [0.5]})
                    for number in range(150)
                    for rank in ranks
                ]
            store(cluster, body, received=at + 1)
    events = [
        {"ts": now - 7200, "kind": "checkpoint", "step": 1, "tier": "durable"},
        {"ts": now - 7000, "kind": "checkpoint", "step": 2, "tier": "local"},
        {"ts": now - 5000, "kind": "xid", "gpu": 1, "code": 31},  # too old
        {"ts": now - 10, "kind": "xid", "gpu": 3, "code": 79},
        {"ts": now - 5, "kind": "log", "message": "hello", "level": "info"},
    ]
    for event in events[:2]:
        event["state"] = "completed"
    store(cluster, {"batch_id": "ev", "node": "node-02", "run": "llama", "events": events}, now)
    return cluster


def test_it_loads_the_last_steps_of_every_rank(busy, now):
    with override_settings(ALERT_STEP_WINDOW=120):
        window = cluster_window(cluster=busy, now=now)
    [run] = window.runs
    assert run.run == "llama" and run.world_size == 4
    assert len(run.steps) == 120 * 4
    assert {row.step for row in run.steps} == set(range(30, 150))
    assert [row.step for row in run.steps] == sorted(row.step for row in run.steps)
    assert run.rank_nodes == {0: "node-01", 1: "node-01", 2: "node-02", 3: "node-02"}
    assert run.steps[0].canary_proj == (0.5,) and run.steps[0].node == "node-01"


def test_it_keeps_old_checkpoints_and_recent_events_only(busy, now):
    window = cluster_window(cluster=busy, now=now)
    [run] = window.runs
    kinds = [(e.kind, e.data.get("tier"), e.data.get("code")) for e in run.events]
    assert ("checkpoint", "durable", None) in kinds and ("checkpoint", "local", None) in kinds
    assert ("xid", None, 79) in kinds and ("xid", None, 31) not in kinds
    assert [(e.kind, e.gpu, e.run) for e in window.events] == [("xid", 3, "llama")]


def test_it_loads_recent_telemetry_of_the_detectors_metrics(busy, now):
    window = cluster_window(cluster=busy, now=now)
    keys = {(s.node, s.metric, s.gpu) for s in window.telemetry}
    assert keys == {
        (node, metric, gpu)
        for node in ("node-01", "node-02")
        for metric, gpu in (("gpu.util", 0), ("gpu.temp_c", 0), ("host.cpu_util", None))
    }
    temp = next(s for s in window.telemetry if s.metric == "gpu.temp_c" and s.node == "node-01")
    assert len(temp.points) == 20 and list(temp.points) == sorted(temp.points)


def test_it_measures_each_nodes_batch_interval(busy, now):
    window = cluster_window(cluster=busy, now=now)
    assert [(n.node, n.batch_interval, n.state) for n in window.nodes] == [
        ("node-01", pytest.approx(2.0), "active"),
        ("node-02", pytest.approx(2.0), "active"),
    ]
    assert window.nodes[1].last_seen == pytest.approx(now)


def test_the_number_of_queries_does_not_grow_with_the_cluster(busy, now):
    with CaptureQueriesContext(connection) as queries:
        cluster_window(cluster=busy, now=now)
    # nodes, batch intervals, runs, steps, run events, old checkpoints, node events,
    # metric ids, telemetry: whatever the number of nodes, runs, ranks or series
    assert len(queries) <= 9


def test_evaluating_the_window_opens_alerts_for_what_the_detectors_find(busy, now):
    alerts_evaluate(cluster=busy, now=now)
    alert = Alert.objects.get(cluster=busy, kind="xid")
    assert alert.node.name == "node-02" and alert.gpu == 3 and alert.severity == "critical"
    assert alert.state == "firing"


def test_a_cluster_may_override_detector_thresholds(busy):
    ClusterDetectorConfig.objects.create(cluster=busy, overrides={"heartbeat_min_s": 3})
    assert detector_config(cluster=busy).heartbeat_min_s == 3
    assert detector_config(cluster=Cluster.objects.create(name="x")).heartbeat_min_s == 30


def test_the_run_summary_carries_goodput(busy, now):
    run = Run.objects.get(cluster=busy, name="llama")
    summary = run_summary(run=run, now=now)
    assert summary["goodput"] == run_goodput(run=run, now=now)
    assert 0 < summary["goodput"]["goodput"] <= 1
    assert set(summary["goodput"]["badput"]) >= {"data", "checkpoint", "hang", "idle"}


def test_a_run_without_steps_has_no_goodput(now):
    run = Run.objects.create(cluster=Cluster.objects.create(name="quiet"), name="r")
    assert run_summary(run=run, now=now)["goodput"] is None


def test_run_goodput_from_sql_medians_equals_the_pure_goodput_over_the_window(now):
    """run_goodput lets Postgres take the per-step medians; detectors.goodput takes them over
    the window's rows. Same answer, with a restart (steps lost: recovery), a blocking save,
    a stall and ranks that disagree in time."""
    from apps.alerts.selectors import run_window
    from detectors.goodput import goodput

    cluster = Cluster.objects.create(name="gp")
    t0 = now - 100
    steps = []
    for number in range(30):  # first epoch, steps 0..29, one step every 1.5 s
        for rank in range(3):
            at = t0 + 1.5 * number + 0.01 * rank
            steps.append(step(rank, number, at, step_time=1.0 + 0.1 * rank, h2d_time=0.02 * rank))
    restart = t0 + 60
    for number in range(20, 40):  # resumed from step 20 after a restart and a stall
        for rank in range(3):
            steps.append(step(rank, number, restart + 5 + 1.2 * (number - 20) + 0.02 * rank))
    events = [
        {"ts": t0 + 10, "kind": "checkpoint", "step": 6, "tier": "local", "state": "started"},
        {"ts": t0 + 12, "kind": "checkpoint", "step": 6, "tier": "local", "state": "completed"},
        {"ts": restart, "kind": "restart", "reason": "resumed"},
    ]
    body = {"batch_id": "gp", "node": "node-01", "run": "r", "steps": steps, "events": events}
    store(cluster, body, now)
    run = Run.objects.get(cluster=cluster, name="r")
    run.state = "finished"  # ends at its last step: `now` does not move the answer
    run.created_at = datetime.fromtimestamp(t0 - 2, UTC)
    run.save()

    got = run_goodput(run=run, now=now)
    expected = goodput(run_window(run=run, now=now), run.last_step_at.timestamp()).to_dict()
    assert got == expected
    assert got["badput_s"]["checkpoint"] > 0 and 0 < got["goodput"] < 1
    # the restart → step-20 gap is under 5 s; steps 20..29, done and lost, add over 10 s
    assert got["badput_s"]["recovery"] > 10


def test_dense_telemetry_is_read_as_the_newest_point_of_each_second(db):
    # three batches re-sending the same minute of one series at 10 points a second: the
    # window holds a point a second (ALERT_TELEMETRY_RESOLUTION_S), the newest of each,
    # however many points agents sent; without a resolution, every point
    now = float(int(time.time()))
    cluster = Cluster.objects.create(name="dense")
    for batch in range(3):
        samples = [
            {"ts": now - 60 + i / 10 + batch / 100, "metric": "gpu.temp_c", "gpu": 0,
             "value": float(batch * 1000 + i)}
            for i in range(600)
        ]  # fmt: skip
        store(cluster, {"batch_id": f"dense/{batch}", "node": "node-01", "samples": samples}, now)

    with override_settings(ALERT_TELEMETRY_RESOLUTION_S=1.0):
        [temp] = cluster_window(cluster=cluster, now=now).telemetry
    # second j's newest point: the last batch's (its stamps are 20 ms later), its tenth
    assert [value for _, value in temp.points] == [2000.0 + 10 * j + 9 for j in range(60)]
    assert [ts for ts, _ in temp.points] == pytest.approx([now - 60 + j + 0.92 for j in range(60)])

    with override_settings(ALERT_TELEMETRY_RESOLUTION_S=0.0):
        [temp] = cluster_window(cluster=cluster, now=now).telemetry
    assert len(temp.points) == 1800 and list(temp.points) == sorted(temp.points)


def test_a_rank_repeating_its_steps_does_not_grow_the_window(now):
    # two ranks report steps 1-3 ten times over: the window reads world size × steps × 2
    # reports at most (a step once per timeline, a restart's two), the highest steps' newest
    cluster = Cluster.objects.create(name="repeats")
    reports = [
        step(rank, number, now - 60 + repeat + number / 10 + rank / 100)
        for repeat in range(10)
        for number in (1, 2, 3)
        for rank in (0, 1)
    ]
    store(cluster, {"batch_id": "r", "node": "node-01", "run": "r", "steps": reports}, now)

    with override_settings(ALERT_STEP_WINDOW=3):
        [run] = cluster_window(cluster=cluster, now=now).runs
    newest = sorted((r["ts"] for r in reports if r["step"] == 3), reverse=True)[:12]
    assert len(run.steps) == 12 == 2 * 3 * 2
    assert {row.step for row in run.steps} == {3}
    assert sorted(row.ts for row in run.steps) == pytest.approx(sorted(newest))


def test_a_ranks_repeated_reports_of_a_step_stand_oldest_first(now):
    # the window is ordered by step, then rank, then time: the same for every pass and for
    # a replay (rank_nodes' "latest wins" reads it so)
    cluster = Cluster.objects.create(name="order")
    reports = [
        step(rank, number, now - 60 + repeat * 10 + number + rank / 100)
        for repeat in range(2)
        for number in (1, 2)
        for rank in (1, 0)
    ]
    store(cluster, {"batch_id": "o", "node": "node-01", "run": "o", "steps": reports}, now)

    [run] = cluster_window(cluster=cluster, now=now).runs
    keys = [(row.step, row.rank, row.ts) for row in run.steps]
    assert len(keys) == 8 and keys == sorted(keys)
    assert {row.node for row in run.steps} == {"node-01"}


def test_a_run_over_its_cap_is_read_again_in_order_beside_one_within_it(now):
    # "steady" reports each step once (read unordered, as the usual window); "loop" repeats
    # its steps past the cap (read again, its highest steps' newest): both come out whole,
    # ordered by step, rank, then time, and neither takes the other's rows
    cluster = Cluster.objects.create(name="mixed")
    now = float(int(now))  # whole milliseconds below: stored exactly
    steady = [step(rank, n, now - 60 + n + rank / 100) for n in range(6) for rank in (1, 0)]
    loop = [step(0, n, now - 60 + r * 5 + n) for r in range(8) for n in (1, 2, 3)]
    store(cluster, {"batch_id": "s", "node": "node-01", "run": "steady", "steps": steady}, now)
    store(cluster, {"batch_id": "l", "node": "node-02", "run": "loop", "steps": loop}, now)

    with override_settings(ALERT_STEP_WINDOW=3):
        runs = {run.run: run for run in cluster_window(cluster=cluster, now=now).runs}
    kept = [(row.step, row.rank, row.ts) for row in runs["steady"].steps]
    assert kept == sorted((r["step"], r["rank"], r["ts"]) for r in steady if r["step"] > 2)
    # the cap of a 1-rank run: 1 × 3 steps × 2 reports; step 3's 6 newest reports fill it
    newest = sorted(r["ts"] for r in loop if r["step"] == 3)[-6:]
    assert [(row.step, row.ts) for row in runs["loop"].steps] == [(3, ts) for ts in newest]
