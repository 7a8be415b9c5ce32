"""Where a run's ranks run (the heat-map's row labels) and which runs each node's card on the
overview names: each from the run's last steps only, in one query whatever the run count."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.clusters.models import Cluster, Node
from apps.runs.models import Run, StepReport
from apps.runs.selectors import NODES_STEPS, PLACE_STEPS, run_names_by_node, run_rank_places

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes() -> list[Node]:
    cluster = Cluster.objects.create(name="c")
    return [Node.objects.create(cluster=cluster, name=f"n{index}") for index in range(3)]


def run_with(name: str, nodes: list[Node], *spans: tuple) -> Run:
    """A run whose rank `rank` reported from node `nodes[node]` (GPU `gpu`) at steps `steps`,
    for each (rank, node, gpu, steps) of `spans`; its last step is the highest of them."""
    run = Run.objects.create(cluster=nodes[0].cluster, name=name)
    StepReport.objects.bulk_create(
        StepReport(run=run, node=nodes[node], ts=datetime.fromtimestamp(1.8e9 + step, UTC),
                   rank=rank, step=step, step_time=1.0, gpu=gpu)
        for rank, node, gpu, steps in spans
        for step in steps
    )  # fmt: skip
    run.last_step = max(step for *_, steps in spans for step in steps)
    run.world_size = max(rank for rank, *_ in spans) + 1  # as ingest keeps it
    run.save(update_fields=["last_step", "world_size"])
    return run


def test_a_rank_is_placed_by_its_newest_report_naming_a_gpu_in_the_last_steps(
    nodes, django_assert_num_queries
):
    last = 2 * PLACE_STEPS - 1  # the window: the steps after last - PLACE_STEPS
    window = last - PLACE_STEPS + 1
    run = run_with(
        "r", nodes,
        (0, 0, 3, range(0, window + 50)), (0, 1, None, range(window + 50, last + 1)),
        (1, 0, 7, range(0, window)), (1, 1, None, range(window, last + 1)),
        (2, 0, 1, range(window, window + 50)), (2, 2, 2, range(window + 50, last + 1)),
        (3, 2, 4, range(0, window - 10)),  # silent for the whole window: not placed
        (4, 2, None, range(window, window + 5)),  # hung early in the window, never named a GPU
    )  # fmt: skip
    with django_assert_num_queries(2):  # the last steps, then the window for ranks 0, 1, 3, 4
        places = run_rank_places(run=run)
    assert places == {0: ("n0", 3), 1: ("n1", None), 2: ("n2", 2), 4: ("n2", None)}


def test_ranks_naming_their_gpu_in_the_last_steps_are_placed_by_them_alone(
    nodes, django_assert_num_queries
):
    """The common case, and the frontier's (16,384 ranks: 33 k reports read, not 1.6 M):
    every rank reported lately and named its GPU; an older place does not matter."""
    last = 2 * PLACE_STEPS
    run = run_with(
        "r", nodes,
        (0, 0, 3, range(0, last - 5)), (0, 1, 6, range(last - 5, last + 1)),
        (1, 2, 1, range(last - 1, last + 1)),
    )  # fmt: skip
    with django_assert_num_queries(1):
        assert run_rank_places(run=run) == {0: ("n1", 6), 1: ("n2", 1)}


def test_a_run_without_steps_has_no_places(nodes, django_assert_num_queries):
    run = Run.objects.create(cluster=nodes[0].cluster, name="new")
    with django_assert_num_queries(0):
        assert run_rank_places(run=run) == {}


def test_each_node_names_the_runs_that_reported_from_it_over_their_own_last_steps(
    nodes, django_assert_num_queries
):
    recent = NODES_STEPS - 1  # a step this far before a run's last is still "now"
    ahead = run_with(
        "b-ahead", nodes,
        (0, 0, None, range(0, 100 - recent - 1)), (0, 1, None, range(100 - recent, 101)),
    )  # fmt: skip
    behind = run_with(
        "a-behind", nodes,
        (0, 2, None, range(0, 50 - recent - 1)), (0, 0, None, range(50 - recent, 51)),
        (1, 1, None, range(45, 51)),
    )  # fmt: skip
    unstarted = Run.objects.create(cluster=nodes[0].cluster, name="unstarted")
    with django_assert_num_queries(1):
        names = run_names_by_node(runs=[ahead, behind, unstarted])
    # n0 ran b-ahead long ago (before its last steps) and a-behind in its last steps, which
    # lie 50 steps before b-ahead's: each run is read over its own last steps
    assert names == {nodes[0].id: ["a-behind"], nodes[1].id: ["a-behind", "b-ahead"]}
    with django_assert_num_queries(0):
        assert run_names_by_node(runs=[unstarted]) == {}
