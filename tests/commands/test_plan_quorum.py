"""The resume plan takes a checkpoint only when the run's ranks agree on it (apps/commands/
plan.py): one path, no failed or unfinished rank, and not one node's claim alone when the
run spans several nodes; what it passes over is listed with why, never used."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.clusters.models import Node
from apps.clusters.services import token_issue
from apps.commands.plan import CheckpointEvent, checkpoint_verdict, run_plan
from apps.runs.models import Run, RunEvent, StepReport

A, B, C = 1, 2, 3  # node ids


def done(rank, node, path="/ckpt/s-100"):
    return CheckpointEvent(rank, node, "completed", path)


def test_every_rank_of_every_node_agreeing_is_used():
    events = [done(0, A), done(1, A), done(2, B), done(3, B)]
    assert checkpoint_verdict(events=events, served_nodes={A, B}) is None


def test_a_lone_nodes_claim_is_not_used_when_the_run_spans_several():
    why = checkpoint_verdict(events=[done(0, A), done(1, A)], served_nodes={A, B})
    assert why is not None and "1 of the 2 nodes" in why
    # half is not more than half; most of them is
    assert checkpoint_verdict(events=[done(0, A), done(2, B)], served_nodes={A, B, C, 4})
    assert checkpoint_verdict(events=[done(0, A), done(2, B)], served_nodes={A, B, C}) is None
    # a run on one node has nobody else to agree with
    assert checkpoint_verdict(events=[done(0, A)], served_nodes={A}) is None


def test_ranks_naming_different_paths_failed_or_unfinished_are_not_used():
    assert "2 different paths" in checkpoint_verdict(
        events=[done(0, A), done(1, B, "/evil")], served_nodes={A, B}
    )
    failed = [done(0, A), CheckpointEvent(1, B, "failed", None)]
    assert "rank 1 failed" in checkpoint_verdict(events=failed, served_nodes={A, B})
    unfinished = [done(0, A), done(1, B), CheckpointEvent(2, B, "started", "/ckpt/s-100")]
    assert "rank 2 started" in checkpoint_verdict(events=unfinished, served_nodes={A, B})


@pytest.fixture
def run(db):
    token, _ = token_issue(cluster_name="quorum")
    run = Run.objects.create(cluster=token.cluster, name="r", last_step=300)
    nodes = [Node.objects.create(cluster=token.cluster, name=f"n{i}") for i in range(2)]
    now = datetime.now(UTC)
    for step in (100, 200, 300):
        for rank in range(4):
            StepReport.objects.create(
                run=run, node=nodes[rank // 2], rank=rank, step=step, ts=now, step_time=1.0
            )
    run.nodes = nodes
    return run


def save(run, *, step, ranks, path=None, at=0.0):
    for rank in ranks:
        RunEvent.objects.create(
            cluster_id=run.cluster_id, run=run, node=run.nodes[rank // 2], kind="checkpoint",
            ts=datetime.now(UTC) + timedelta(seconds=at), step=step, rank=rank,
            data={"tier": "durable", "state": "completed", "path": path or f"/ckpt/s-{step}"},
        )  # fmt: skip


def test_the_plan_passes_over_a_lone_claim_to_the_newest_agreed_checkpoint(run):
    save(run, step=100, ranks=range(4), at=-20)
    save(run, step=200, ranks=[0, 1], path="/tmp/evil", at=-10)  # node n0 alone
    plan = run_plan(run=run)
    assert plan["checkpoint"] == {"step": 100, "path": "/ckpt/s-100", "tier": "durable"}
    assert [(s["step"], s["path"]) for s in plan["skipped"]] == [(200, "/tmp/evil")]
    assert "one node's claim" in plan["skipped"][0]["why"]
    assert plan["nodes"] == ["n0", "n1"]


def test_the_plan_has_no_checkpoint_when_none_is_agreed(run):
    save(run, step=300, ranks=[2, 3])
    plan = run_plan(run=run)
    assert plan["checkpoint"] is None and [s["step"] for s in plan["skipped"]] == [300]


def test_a_checkpoint_of_a_step_nobody_reached_is_not_used(run):
    save(run, step=100, ranks=range(4), at=-20)
    save(run, step=10**9, ranks=range(4), path="/tmp/evil", at=-10)
    plan = run_plan(run=run)
    assert plan["checkpoint"]["step"] == 100
    assert "no rank reported" in plan["skipped"][0]["why"]
