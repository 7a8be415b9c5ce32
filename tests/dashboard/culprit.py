"""A cluster with one slow rank, stored through the real ingest storage service, and its
alerts from the real detectors: shared by the culprit-tile, heat-map and rank-page tests."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from apps.alerts.services import alerts_evaluate
from apps.clusters.models import Cluster
from apps.ingest.services import ClaimedBatch, batches_store
from tests.dashboard.conftest import RUN, gpu_samples, step_reports

GPUS = 8
NODES = 2
SLOW_RANK = 5  # on node-00, GPU 5
STEPS = 40  # over the straggler detector's 20-step window


def slow_rank_cluster(name: str, *, with_gpu: bool = True, evaluate: bool = True) -> Cluster:
    """NODES × GPUS ranks (rank = node × GPUS + gpu) of RUN, rank SLOW_RANK computing 50 %
    longer; the steps name their GPU when `with_gpu`. Detectors evaluated once at the end
    (`evaluate`), as the beat task would."""
    now = time.time()
    cluster = Cluster.objects.create(name=name)
    batches = []
    for node in range(NODES):
        ranks = range(node * GPUS, (node + 1) * GPUS)
        for step in range(STEPS):
            ts = now - STEPS + step + 1
            steps = step_reports(ts, step, ranks, slow_rank=SLOW_RANK)
            for report in steps if with_gpu else ():
                report["gpu"] = report["rank"] % GPUS
            body = {
                "batch_id": f"{name}-{node}-{step}", "node": f"node-{node:02d}",
                "node_info": {"gpus": GPUS}, "run": RUN, "samples": gpu_samples(ts, GPUS),
                "steps": steps,
            }  # fmt: skip
            batches.append(ClaimedBatch.of(cluster.id, datetime.fromtimestamp(now, UTC), body))
    batches_store(batches=batches)
    if evaluate:
        alerts_evaluate(cluster=cluster, now=now + 1)
    return cluster
