"""A frontier run for the page tests: 16,384 ranks on 2,048 nodes × 8 GPUs, a minute of one
report per rank per second, written by server-side SQL (a million rows in seconds; the
ingest path has its own tests and benchmarks). Ranks jitter (their work ±4 %); one rank
computes 60 % longer; the others wait for it in the all-reduce, as in bench/pages_seed.py."""

from __future__ import annotations

import time

from django.db import connection
from django.utils import timezone

from apps.clusters.models import Cluster, Node
from apps.core.times import to_datetime
from apps.runs.models import Run

RANKS, GPUS = 16_384, 8
NODES = RANKS // GPUS
SLOW_RANK = 9_005  # node-1125, GPU 5
SECONDS = 60
RUN = "frontier"

_STEPS_SQL = """
INSERT INTO runs_stepreport (run_id, node_id, ts, rank, step, step_time, data_time, h2d_time,
                             compute_time, comm_wait, tokens, loss, gpu)
SELECT %(run)s, (%(nodes)s::int8[])[r / 8 + 1], to_timestamp(%(lo)s + s), r, s, 1.0, 0.05, 0.01,
       CASE WHEN r = %(slow)s THEN 0.94 ELSE 0.55 + j END,
       CASE WHEN r = %(slow)s THEN 0.0 ELSE 0.39 - j END, 4096, 2.0, r %% 8
FROM generate_series(0, %(seconds)s - 1) s CROSS JOIN generate_series(0, %(ranks)s - 1) r
CROSS JOIN LATERAL (SELECT 0.05 * random() + 0 * r AS j) jitter
"""


def node_name(index: int) -> str:
    return f"node-{index:04d}"


def frontier_run(cluster_name: str) -> Run:
    """The cluster, its nodes and the run, its steps ending now."""
    end = time.time()
    start = end - SECONDS
    cluster = Cluster.objects.create(name=cluster_name)
    nodes = Node.objects.bulk_create(
        Node(cluster=cluster, name=node_name(i), last_seen=timezone.now(), info={"gpus": GPUS})
        for i in range(NODES)
    )
    run = Run.objects.create(
        cluster=cluster, name=RUN, first_step=0, last_step=SECONDS - 1,
        last_step_at=to_datetime(end - 1), world_size=RANKS,
    )  # fmt: skip
    Run.objects.filter(pk=run.pk).update(created_at=to_datetime(start))
    with connection.cursor() as cursor:
        cursor.execute(
            _STEPS_SQL,
            {"run": run.id, "nodes": [n.id for n in nodes], "lo": int(start),
             "slow": SLOW_RANK, "seconds": SECONDS, "ranks": RANKS},
        )  # fmt: skip
        cursor.execute("ANALYZE runs_stepreport")
    run.refresh_from_db()
    return run
