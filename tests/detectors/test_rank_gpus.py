"""detect_all's findings about a rank name the GPU the rank's step rows named."""

from detectors import with_rank_gpus
from detectors.types import ClusterWindow, Finding, RunWindow, StepRow


def window(*rows: StepRow) -> ClusterWindow:
    run = RunWindow(run="r", world_size=2, started_at=0.0, steps=rows, events=())
    return ClusterWindow(cluster="c", runs=(run,), telemetry=(), nodes=(), events=())


def row(rank: int, step: int, node: str, gpu: int | None) -> StepRow:
    return StepRow(node=node, rank=rank, step=step, ts=float(step), step_time=1.0, gpu=gpu)


def straggler(rank: int, node: str, gpu: int | None = None) -> Finding:
    return Finding(kind="straggler", subject=f"run:r/rank:{rank}", severity="warning",
                   summary="slow", run="r", node=node, rank=rank, gpu=gpu)  # fmt: skip


def test_it_names_the_gpu_of_the_ranks_newest_row_on_its_node():
    rows = (row(1, 1, "n0", 2), row(1, 2, "n0", 5), row(1, 3, "n0", None))
    assert with_rank_gpus([straggler(1, "n0")], window(*rows))[0].gpu == 5


def test_it_leaves_the_gpu_unknown_when_the_rank_never_named_one_or_moved():
    assert with_rank_gpus([straggler(1, "n0")], window(row(1, 1, "n0", None)))[0].gpu is None
    assert with_rank_gpus([straggler(1, "n1")], window(row(1, 1, "n0", 3)))[0].gpu is None


def test_it_keeps_a_gpu_a_finding_names_and_leaves_node_findings_alone():
    rows = window(row(1, 1, "n0", 3))
    assert with_rank_gpus([straggler(1, "n0", gpu=7)], rows)[0].gpu == 7
    node_wide = Finding(kind="input_bound", subject="node:n0", severity="warning", summary="s",
                        node="n0")  # fmt: skip
    assert with_rank_gpus([node_wide], rows) == [node_wide]
