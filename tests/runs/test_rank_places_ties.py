"""A rank's place when it sent its best step twice: the greater [node, GPU] of the reports
that could win (those naming a GPU, when the rank named one in the window), as the rule
"greatest [names a GPU, step, node, GPU]" has it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.clusters.models import Cluster, Node
from apps.runs.models import Run, StepReport
from apps.runs.selectors import run_rank_places

pytestmark = pytest.mark.django_db


def test_a_step_reported_twice_places_the_rank_by_the_greater_node_and_gpu():
    cluster = Cluster.objects.create(name="c")
    nodes = [Node.objects.create(cluster=cluster, name=f"n{index}") for index in range(3)]
    run = Run.objects.create(cluster=cluster, name="r", last_step=10)
    reports = [  # (rank, step, node, gpu)
        (0, 10, 0, 5), (0, 10, 1, 2), (0, 10, 2, None),  # a named one on the greater node
        (1, 10, 2, None), (1, 9, 0, 1), (1, 9, 0, 3),  # named at 9 beats unnamed at 10
        (2, 10, 0, None), (2, 10, 1, None), (2, 8, 2, None),  # never named: newest, node 1
    ]  # fmt: skip
    StepReport.objects.bulk_create(
        StepReport(run=run, node=nodes[node], ts=datetime.fromtimestamp(1.8e9 + step, UTC),
                   rank=rank, step=step, step_time=1.0, gpu=gpu)
        for rank, step, node, gpu in reports
    )  # fmt: skip
    assert run_rank_places(run=run) == {0: ("n1", 2), 1: ("n0", 3), 2: ("n1", None)}
