"""Through the real stack: agent POSTs → inbox → Celery worker → raw storage and dirty ranges
→ rollup pass → selectors, including a batch replayed late and out of order."""

import time
import uuid

import pytest
from django.db import connection

from apps.clusters.models import Node
from apps.history.selectors import metric_history, run_rank_history, run_step_history
from apps.ingest.models import InboxBatch
from apps.runs.models import Run
from launcher.procs import wait_until
from tests.history.helpers import refresh, rows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

HISTORY_TABLES = (
    "history_sample_1m, history_sample_1h, history_step_1m, history_step_1h,"
    " history_dirty_series, history_dirty_run, history_watermark"
)


@pytest.fixture(autouse=True)
def history_emptied(live_db):
    """The history tables are plain SQL tables: the test flush does not empty them."""
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {HISTORY_TABLES}")


def batch(start: float, seconds: int, with_steps: bool = True) -> dict:
    """`seconds` of 1 Hz gpu.util on GPUs 0 and 1 (value = second of the minute + gpu), and
    one step report per second from ranks 0 and 1 (rank 1 twice as slow)."""
    body = {
        "batch_id": uuid.uuid4().hex,
        "node": "node-01",
        "samples": [
            {
                "ts": start + t,
                "metric": "gpu.util",
                "gpu": gpu,
                "value": float((start + t) % 60 + gpu),
            }
            for t in range(seconds)
            for gpu in (0, 1)
        ],
    }
    if with_steps:
        body["run"] = "replayed"
        body["steps"] = [
            {"ts": start + t, "rank": rank, "step": int(start + t), "step_time": 1.0 + rank,
             "tokens": 100}
            for t in range(seconds)
            for rank in (0, 1)
        ]  # fmt: skip
    return body


def post_and_drain(agent, token, *bodies) -> None:
    for body in bodies:
        assert agent.post(body).status_code == 202
    wait_until(
        lambda: not InboxBatch.objects.filter(token=token, processed_at__isnull=True).exists(),
        60,
        "the worker to store the batches",
    )


def minute_counts(node_id: int) -> dict[tuple[int, float], int]:
    return {
        (gpu, bucket): n
        for gpu, bucket, n in rows(
            "SELECT gpu, extract(epoch FROM bucket)::float8, n FROM history_sample_1m"
            " WHERE node_id = %s",
            [node_id],
        )
    }


def test_it_rolls_posted_batches_up_and_recomputes_a_replayed_minute(agent, agent_token):
    minute = time.time() // 3600 * 3600 - 2 * 3600
    post_and_drain(agent, agent_token[0], batch(minute, 30), batch(minute + 60, 60))
    refresh()
    node = Node.objects.get(cluster=agent_token[0].cluster, name="node-01")
    assert minute_counts(node.id) == {(0, minute): 30, (1, minute): 30,
                                      (0, minute + 60): 60, (1, minute + 60): 60}  # fmt: skip

    # the agent replays its spool: the second half of the first minute, hours late
    post_and_drain(agent, agent_token[0], batch(minute + 30, 30))
    refresh()
    refresh()  # a second pass finds nothing dirty and changes nothing

    assert minute_counts(node.id)[(0, minute)] == 60
    assert rows(
        "SELECT n, vsum FROM history_sample_1h WHERE node_id = %s AND gpu = 1", [node.id]
    ) == [(120, float(2 * (sum(range(60)) + 60)))]
    history = metric_history(
        node_ids=[node.id], metric="gpu.util", gpu="all", start=minute, end=minute + 3600,
        max_points=60,
    )  # fmt: skip
    assert history.resolution_s == 60
    assert [(s.gpu, s.ts, s.avg, s.max) for s in history.series] == [
        (0, [minute, minute + 60], [29.5, 29.5], [59.0, 59.0]),
        (1, [minute, minute + 60], [30.5, 30.5], [60.0, 60.0]),
    ]
    run = Run.objects.get(cluster=agent_token[0].cluster, name="replayed")
    steps = run_step_history(run_id=run.id, start=minute, end=minute + 3600, max_points=60)
    ranks = run_rank_history(run_id=run.id, start=minute, end=minute + 3600, max_points=60)
    assert ranks.ranks == [0, 1]
    assert ranks.step_time[0][:3] == [1.0, 1.0, None] and ranks.step_time[1][:2] == [2.0, 2.0]
    assert steps.steps_per_s[:2] == [1.0, 1.0]
    assert steps.tokens_per_s[:2] == pytest.approx([200.0, 200.0])  # 2 ranks × 100 a second
