"""The detectors' window as of a past moment (the evaluation harness's replay), and the
pause that keeps beat out of a replayed cluster."""

from __future__ import annotations

import time

import pytest

from apps.alerts.models import ClusterDetectorConfig
from apps.alerts.selectors import cluster_window, clusters_to_evaluate
from apps.runs.models import StepReport
from tests.conftest import make_batch
from tests.stackproc import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def history_batch(base: float, node: str, seconds: int) -> dict:
    """`seconds` of gpu.util (every 2 s) and one step per second of ranks 0 and 1."""
    batch = {**make_batch(node=node, samples=0), "run": "r1"}
    batch["samples"] = [
        {"ts": base + t, "metric": "gpu.util", "gpu": 0, "value": 90.0}
        for t in range(0, seconds, 2)
    ]
    batch["steps"] = [
        {"ts": base + t, "rank": rank, "step": t, "step_time": 1.0, "compute_time": 0.9}
        for t in range(seconds)
        for rank in (0, 1)
    ]
    return batch


def test_the_window_as_of_a_past_moment_holds_only_what_had_happened(agent, agent_token):
    cluster = agent_token[0].cluster
    base = time.time() - 3600
    assert agent.post(history_batch(base, "node-a", 120)).status_code == 202
    wait_until(
        lambda: StepReport.objects.filter(run__cluster=cluster).count() == 240,
        30,
        "the step reports",
    )
    # Its batches carry the run; the window's nodes (heartbeat's subjects) are those with a
    # node agent, so say one runs there too.
    cluster.nodes.filter(name="node-a").update(has_agent=True)

    window = cluster_window(cluster=cluster, now=base + 40.5, as_of=True)
    (run,) = window.runs
    assert max(row.ts for row in run.steps) == pytest.approx(base + 40, abs=1e-3)
    assert max(row.step for row in run.steps) == 40
    assert run.started_at == pytest.approx(base - 1.0)
    (node,) = window.nodes
    assert node.last_seen == pytest.approx(base + 40.5, abs=0.01)  # its batch spans now
    assert node.batch_interval == pytest.approx(2.0)
    util = next(s for s in window.telemetry if s.metric == "gpu.util")
    assert max(at for at, _ in util.points) == pytest.approx(base + 40, abs=1e-3)

    # after the data ends, last_seen is the last record's own time, not the arrival's
    later = cluster_window(cluster=cluster, now=base + 600, as_of=True)
    assert later.nodes[0].last_seen == pytest.approx(base + 119, abs=0.01)
    assert max(row.step for row in later.runs[0].steps) == 119
    # before the first step, the run is not in the window yet
    assert cluster_window(cluster=cluster, now=base - 5, as_of=True).runs == ()
    # live, the node was seen just now (on arrival) and the run is not active any more
    live = cluster_window(cluster=cluster, now=time.time())
    assert live.nodes[0].last_seen > base + 3000


def test_a_paused_cluster_is_left_out_of_continuous_evaluation(agent, agent_token):
    cluster = agent_token[0].cluster
    assert agent.post(make_batch(node="node-a")).status_code == 202
    wait_until(lambda: cluster.nodes.exists(), 30, "the node")
    assert cluster in clusters_to_evaluate(now=time.time())
    ClusterDetectorConfig.objects.create(cluster=cluster, paused=True)
    assert cluster not in clusters_to_evaluate(now=time.time())
